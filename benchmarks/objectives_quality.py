"""Every objective's recipe over seeds, like with like (issues 20 and 44).

    python benchmarks/objectives_quality.py --seeds 0 1 2 [--only ROW ...] [--json FILE]

Each objective starts from all-MiniLM-L6-v2 (the embedded default) and trains 1 epoch on
wiki_sample.txt at max length 64 with the recipe of its ``configs/*.yaml`` (batch, lr, pooling,
head, knobs); BSC also trains on STS-B train as scored pairs. One protocol for every row:

- STS-B dev is split once into two fixed halves (seeded; the line numbers are saved in
  ``benchmarks/stsb_dev_halves.json``): every row selects its checkpoint on the *selection* half
  (scored every ``--eval-steps`` steps and at the end) and is reported on the *reporting* half, so
  no row is chosen on the data it is reported on.
- Each row says the pooling and head it trains and scores with, and its "before" figure is the
  untrained model scored with that same pooling (a [CLS] recipe is compared with the untrained
  model's [CLS] score, not with its mean-pooled one).
- Every recipe whose pooling is not the backbone's own (mean) runs again with mean pooling: the
  like-for-like rows.

Reported per row, over the seeds: the reporting half's Spearman x100 (mean +- std) and the
elongation attack at m = 4 and 16 on it (each side repeated m times within 256 tokens).
``--sentences N`` trims the corpus for a quick check of the script itself.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
import yaml

from common import ROOT, STSB_DEV, STSB_TRAIN, WIKI, machine, train_run
from raycse.encoder import Encoder
from raycse.evaluation.length_attack import length_attack
from raycse.evaluation.sts import read_stsb
from raycse.precision import resolve_precision

HALVES = Path(__file__).resolve().parent / "stsb_dev_halves.json"
HALVES_SEED = 0

# (row, config file, overrides)
RUNS = [
    ("SimCSE", "simcse", {}),
    ("HiCL over SimCSE", "hicl", {}),
    ("CompCSE (mean, compose at head)", "compcse", {}),
    ("CompCSE (mean, compose at encoder)", "compcse", {"objective.params.compose_at": "encoder"}),
    ("SG-OPT (opt3)", "sgopt", {}),
    ("LA(SER)^3 self-ref", "laser", {}),
    ("BSC on wiki (s, s)", "bsc", {"data.format": "auto", "grouping.strategy": "random", "objective.params.mu": 1.0}),
    ("BSC on STS-B pairs", "bsc", {"data.corpus": str(STSB_TRAIN)}),
]


def dev_halves(tmp: Path) -> tuple[Path, Path]:
    """The selection and reporting halves of STS-B dev as files, from the saved line numbers (made,
    seeded, and saved the first time)."""
    lines = [ln for ln in STSB_DEV.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not HALVES.is_file():
        order = np.random.default_rng(HALVES_SEED).permutation(len(lines)).tolist()
        half = len(lines) // 2
        HALVES.write_text(json.dumps({"source": "sts-dev.csv", "seed": HALVES_SEED, "pairs": len(lines),
                                      "select": sorted(order[:half]), "report": sorted(order[half:])}) + "\n")
    saved = json.loads(HALVES.read_text())
    assert saved["pairs"] == len(lines), f"{HALVES} was made for {saved['pairs']} pairs, STS-B dev has {len(lines)}"
    paths = []
    for part in ("select", "report"):
        path = tmp / f"sts-dev-{part}.csv"
        path.write_text("\n".join(lines[i] for i in saved[part]) + "\n", encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def recipe(config: str) -> dict:
    return yaml.safe_load((ROOT / "configs" / f"{config}.yaml").read_text())


def settings_from(config: str, overrides: dict, args, seed: int, select: Path) -> dict:
    """The config file's recipe as dotted keys, on this benchmark's budget, selecting on ``select``."""
    out = {}
    for section, values in recipe(config).items():
        if section == "objective":
            values = dict(values)
            out["objective.name"] = values.pop("name")
            out["objective.params"] = values
        else:
            out.update({f"{section}.{k}": v for k, v in values.items()})
    out.update({"data.corpus": str(WIKI), "data.max_sentences": args.sentences, "model.max_length": args.max_length,
                "train.epochs": 1, "train.seed": seed, "train.log_steps": 100, "eval.stsb_dev": str(select),
                "eval.eval_steps": args.eval_steps, "eval.before_training": False})
    for key, value in overrides.items():
        if key.startswith("objective.params."):
            out["objective.params"] = {**out["objective.params"], key.rsplit(".", 1)[1]: value}
        else:
            out[key] = value
    return out


def rows_to_run(args) -> list[tuple[str, str, dict]]:
    """The recipes, and each one not pooled by mean again with mean pooling (like for like)."""
    rows = []
    for name, config, overrides in RUNS:
        rows.append((name, config, overrides))
        if overrides.get("model.pooling", recipe(config)["model"].get("pooling", "mean")) != "mean":
            rows.append((f"{name} [mean pooling]", config, {**overrides, "model.pooling": "mean"}))
    return [r for r in rows if not args.only or r[0] in args.only]


def scores(model: str, dev, ms: list[int], pooling=None) -> dict:
    enc = Encoder.from_pretrained(model, pooling=pooling, mlp_head="none" if pooling else None)
    # bf16 only where the CPU has it natively: emulated on an AVX2 box, it made the untrained model's
    # attack scoring alone take over 7 minutes (2026-11-25, AMD EPYC)
    dtype = resolve_precision("auto", torch.device("cpu"))
    embed = lambda xs: enc.encode(xs, batch_size=128, max_length=256, autocast_dtype=dtype)  # noqa: E731
    rows = length_attack(embed, [dev], [1, *ms], enc.tokenizer, 256)
    return {r["m"]: r["spearman"] for r in rows}


def describe(rows: list) -> str:
    v = np.array(rows)
    return f"{v.mean():7.2f} +- {v.std():4.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sentences", type=int, default=None)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--eval-steps", type=int, default=125, help="selection-half scoring cadence (SimCSE's)")
    ap.add_argument("--only", nargs="*", help="row names to run (default: all)")
    ap.add_argument("--json", default=None, help="write every row's per-seed figures here")
    args = ap.parse_args()
    ms = [4, 16]
    with tempfile.TemporaryDirectory() as tmp:
        select, report_file = dev_halves(Path(tmp))
        report = read_stsb(report_file, "stsb_dev_report_half")
        print(f"# {machine()}; {WIKI.name} ({args.sentences or 'all'} sentences), 1 epoch, max length "
              f"{args.max_length}, seeds {args.seeds}; select on {HALVES.name}'s selection half every "
              f"{args.eval_steps} steps, report on its other half; attack: m in {ms} within 256 tokens; scoring in "
              f"{resolve_precision('auto', torch.device('cpu')) or 'fp32'}", flush=True)
        before: dict[str, dict] = {}
        table = []
        for name, config, overrides in rows_to_run(args):
            settings = settings_from(config, overrides, args, args.seeds[0], select)
            pooling = settings.get("model.pooling", "mean")
            head = settings.get("model.mlp_head", "auto")
            if pooling not in before:  # the untrained model, scored the way this row is
                before[pooling] = scores("default", report, ms, pooling)
            per_seed = []
            for seed in args.seeds:
                result = train_run(f"{tmp}/{config}-{len(table)}-{seed}",
                                   settings_from(config, overrides, args, seed, select))
                row = scores(str(result.model_dir), report, ms)
                row["selected_step"] = (result.metrics.get("best") or {}).get("step")
                per_seed.append(row)
                print(f"  {name} seed {seed}: report half {row[1]:.2f} (step {row['selected_step']}), "
                      f"m=4 {row[4]:.2f}, m=16 {row[16]:.2f}", flush=True)
            table.append({"row": name, "pooling": pooling, "head": head, "before": before[pooling][1],
                          "seeds": args.seeds, "per_seed": per_seed})
    print(f"\n{'run':42s} {'pooling / head':26s} {'before':>7s} {'after (report half)':>20s} "
          f"{'attack m=4':>15s} {'attack m=16':>15s}")
    for t in table:
        print(f"{t['row']:42s} {t['pooling'] + ' / ' + t['head']:26s} {t['before']:7.2f} "
              f"{describe([r[1] for r in t['per_seed']]):>20s} {describe([r[4] for r in t['per_seed']]):>15s} "
              f"{describe([r[16] for r in t['per_seed']]):>15s}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "rows": table}, indent=1, default=str))


if __name__ == "__main__":
    main()
