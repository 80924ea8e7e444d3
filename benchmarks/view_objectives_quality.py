"""One epoch on wiki_sample.txt from all-MiniLM-L6-v2, same seed, for SimCSE, HiCL (alpha 0.05, L 32),
LA(SER)^3 self-reference and CompCSE: STS-B dev Spearman x100 and the elongation-attack figure
(Spearman and mean cosine shift on STS-B dev with each side repeated m times within the max length).

    python benchmarks/view_objectives_quality.py --max-length 64 --attack 1 4 16
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from common import STSB_DEV, WIKI, machine, train_run
from raycse.evaluation.length_attack import length_attack
from raycse.evaluation.sts import read_stsb
from raycse.model.encoder import Encoder

RUNS = {
    "SimCSE": ("simcse", {}),
    "HiCL a=0.05 L=32": ("hicl", {"alpha": 0.05, "slice_length": 32}),
    "LA(SER)^3 self-ref": ("laser", {"mode": "self"}),
    "CompCSE (mean)": ("compcse", {"compose": "mean"}),
}


def train_one(objective: str, params: dict, args, out: str) -> dict:
    result = train_run(out, {"data.corpus": str(WIKI), "data.max_sentences": args.sentences,
                             "objective.name": objective, "objective.params": params,
                             "model.max_length": args.max_length, "train.batch_size": 64, "train.lr": 3e-5,
                             "train.seed": 42, "train.log_steps": 50})
    return {"metrics": result.metrics["last"], "model": str(result.model_dir)}


def attack(model_dir: str, dev, ms, max_length: int) -> dict:
    enc = Encoder.from_pretrained(model_dir)
    dtype = torch.bfloat16  # the attack compares encoders against themselves; bf16 keeps it quick here
    rows = length_attack(lambda xs: enc.encode(xs, batch_size=128, max_length=max_length, autocast_dtype=dtype),
                         [dev], ms, enc.tokenizer, max_length)
    return {r["m"]: (r["spearman"], r["mean_shift"]) for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=None)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--attack", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--attack-max-length", type=int, default=256)
    args = ap.parse_args()
    dev = read_stsb(STSB_DEV, "stsb_dev")
    print(f"# {machine()}; {WIKI.name}, 1 epoch, batch 64, lr 3e-5, seed 42, max length {args.max_length}, "
          f"precision auto; attack: m in {args.attack} within {args.attack_max_length} tokens")
    table = {"all-MiniLM-L6-v2 (start)": {"dev": None, "attack": attack("default", dev, args.attack, args.attack_max_length)}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (objective, params) in RUNS.items():
            r = train_one(objective, params, args, f"{tmp}/{objective}")
            table[name] = {"dev": r["metrics"]["stsb_dev_spearman"],
                           "attack": attack(r["model"], dev, args.attack, args.attack_max_length)}
    head = " ".join(f"{'m=' + str(m) + ' rho/shift':>20s}" for m in args.attack)
    print(f"{'run':26s} {'dev':>6s} {head}")
    for name, row in table.items():
        dev_s = f"{row['dev']:6.2f}" if row["dev"] is not None else f"{'-':>6s}"
        cells = " ".join(f"{row['attack'][m][0]:11.2f}/{row['attack'][m][1]:+.4f}" for m in args.attack)
        print(f"{name:26s} {dev_s} {cells}")


if __name__ == "__main__":
    main()
