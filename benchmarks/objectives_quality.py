"""Every objective with its paper's default knobs, over seeds, on one budget (issue 20).

    python benchmarks/objectives_quality.py --seeds 0 1 2

Each objective starts from all-MiniLM-L6-v2 (the embedded default) and trains 1 epoch on
wiki_sample.txt at max length 64 with the recipe of its ``configs/*.yaml`` (batch, lr, pooling,
knobs); BSC also trains on STS-B train as scored pairs. Reported per row, over the seeds: STS-B dev
Spearman x100 (mean +- std, scored after the epoch) and the elongation attack at m = 4 and 16
(Spearman x100 on STS-B dev with each side repeated m times within 256 tokens). The untrained model
is the first row. ``--sentences N`` trims the corpus for a quick check of the script itself.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
import yaml

from common import ROOT, STSB_DEV, STSB_TRAIN, WIKI, machine, train_run
from raycse.encoder import Encoder
from raycse.evaluation.length_attack import length_attack
from raycse.evaluation.sts import read_stsb

# (row, config file, data overrides)
RUNS = [
    ("SimCSE", "simcse", {}),
    ("HiCL over SimCSE", "hicl", {}),
    ("CompCSE (mean)", "compcse", {}),
    ("SG-OPT (opt3)", "sgopt", {}),
    ("LA(SER)^3 self-ref", "laser", {}),
    ("BSC on wiki (s, s)", "bsc", {"data.format": "auto", "grouping.strategy": "random", "objective.params.mu": 1.0}),
    ("BSC on STS-B pairs", "bsc", {"data.corpus": str(STSB_TRAIN)}),
]


def settings_from(config: str, overrides: dict, args, seed: int) -> dict:
    """The config file's recipe as dotted keys, on this benchmark's budget."""
    raw = yaml.safe_load((ROOT / "configs" / f"{config}.yaml").read_text())
    out = {}
    for section, values in raw.items():
        if section == "objective":
            out["objective.name"] = values.pop("name")
            out["objective.params"] = values
        else:
            out.update({f"{section}.{k}": v for k, v in values.items()})
    out.update({"data.corpus": str(WIKI), "data.max_sentences": args.sentences, "model.max_length": args.max_length,
                "train.epochs": 1, "train.seed": seed, "train.log_steps": 100,
                "eval.before_training": False})  # the untrained row scores the start once
    for key, value in overrides.items():
        if key.startswith("objective.params."):
            out["objective.params"] = {**out["objective.params"], key.rsplit(".", 1)[1]: value}
        else:
            out[key] = value
    return out


def scores(model: str, dev, ms: list[int]) -> dict:
    enc = Encoder.from_pretrained(model)
    embed = lambda xs: enc.encode(xs, batch_size=128, max_length=256, autocast_dtype=torch.bfloat16)  # noqa: E731
    rows = length_attack(embed, [dev], [1, *ms], enc.tokenizer, 256)
    return {r["m"]: r["spearman"] for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sentences", type=int, default=None)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--only", nargs="*", help="row names to run (default: all)")
    args = ap.parse_args()
    dev = read_stsb(STSB_DEV, "stsb_dev")
    ms = [4, 16]
    print(f"# {machine()}; {WIKI.name} ({args.sentences or 'all'} sentences), 1 epoch, max length "
          f"{args.max_length}, seeds {args.seeds}; attack: m in {ms} within 256 tokens (bf16 encode)", flush=True)
    table = {"all-MiniLM-L6-v2 (untrained)": [scores("default", dev, ms)]}
    with tempfile.TemporaryDirectory() as tmp:
        for name, config, overrides in RUNS:
            if args.only and name not in args.only:
                continue
            table[name] = []
            for seed in args.seeds:
                result = train_run(f"{tmp}/{config}-{seed}", settings_from(config, overrides, args, seed))
                row = scores(str(result.model_dir), dev, ms)
                row["dev_train"] = result.metrics["last"].get("stsb_dev_spearman")
                table[name].append(row)
                print(f"  {name} seed {seed}: dev {row[1]:.2f}, m=4 {row[4]:.2f}, m=16 {row[16]:.2f}", flush=True)
    print(f"{'run':30s} {'STS-B dev':>15s} {'attack m=4':>15s} {'attack m=16':>15s}")
    for name, rows in table.items():
        cells = []
        for m in (1, *ms):
            v = np.array([r[m] for r in rows])
            cells.append(f"{v.mean():7.2f} +- {v.std():4.2f}")
        print(f"{name:30s} {cells[0]:>15s} {cells[1]:>15s} {cells[2]:>15s}")


if __name__ == "__main__":
    main()
