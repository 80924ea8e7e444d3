"""Every objective's recipe over seeds, like with like (issues 20 and 44).

    python benchmarks/objectives_quality.py --seeds 0 1 2 [--only ROW ...] [--json FILE] [--table-only]

Each objective starts from all-MiniLM-L6-v2 (the embedded default) and trains 1 epoch on
wiki_sample.txt at max length 64 with the recipe of its ``configs/*.yaml`` (batch, lr, pooling,
head, knobs); BSC also trains on STS-B train as scored pairs, with raycse's recipe and with the
paper's knobs (``configs/bsc_paper.yaml``, also with random batches). One protocol for every row:

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

The table takes hours on a 2-core box (12-15 minutes a wiki run), so ``--json FILE`` keeps each
run's figures as it ends and a later call with the same file and protocol runs only what is missing;
``--table-only`` prints the table from it, and each paper claim's verdict (``verdicts.py``).
Training and scoring are fp32 by default so that runs made on AVX2 and AVX-512 boxes stay comparable in one table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from common import ROOT, STSB_DEV, STSB_TRAIN, WIKI, machine, refuse, train_run
from verdicts import SEARCHED, print_verdicts

from raycse.evaluation.length_attack import length_attack
from raycse.evaluation.sts import read_stsb
from raycse.model.encoder import Encoder
from raycse.model.precision import resolve_precision

HALVES = Path(__file__).resolve().parent / "stsb_dev_halves.json"
HALVES_SEED = 0

# (row, config file, overrides)
RUNS = [
    ("SimCSE", "simcse", {}),
    ("HiCL over SimCSE", "hicl", {}),
    ("CompCSE (compose_at head)", "compcse", {}),
    ("CompCSE (compose_at encoder)", "compcse", {"objective.params.compose_at": "encoder"}),
    ("SG-OPT (opt3)", "sgopt", {}),
    ("LA(SER)^3 self-ref", "laser", {}),
    ("BSC on wiki (s, s)", "bsc", {"data.format": "auto", "grouping.strategy": "random", "objective.params.mu": 1.0}),
    ("BSC on STS-B pairs", "bsc", {"data.corpus": str(STSB_TRAIN)}),
    # the paper's own knobs (configs/bsc_paper.yaml) on this budget, and its claim that the batch order
    # matters: the same knobs with random batches
    ("BSC on STS-B pairs, paper knobs", "bsc_paper", {"data.corpus": str(STSB_TRAIN)}),
    ("BSC on STS-B pairs, paper knobs, random order", "bsc_paper",
     {"data.corpus": str(STSB_TRAIN), "grouping.strategy": "random"}),
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
                "train.epochs": 1, "train.seed": seed, "train.precision": args.precision, "train.log_steps": 100,
                "eval.stsb_dev": str(select),
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
    if not args.only:
        return rows
    unknown = [name for name in args.only if name not in {r[0] for r in rows}]
    if unknown:
        refuse(f"no row named {unknown}: the rows are {[r[0] for r in rows]}")
    return [next(r for r in rows if r[0] == name) for name in args.only]


def scores(model: str, dev, ms: list[int], dtype, pooling=None) -> dict:
    enc = Encoder.from_pretrained(model, pooling=pooling, mlp_head="none" if pooling else None)
    embed = lambda xs: enc.encode(xs, batch_size=128, max_length=256, autocast_dtype=dtype)
    rows = length_attack(embed, [dev], [1, *ms], enc.tokenizer, 256)
    return {r["m"]: r["spearman"] for r in rows}


def describe(rows: list) -> str:
    v = np.array(rows)
    return f"{v.mean():7.2f} +- {v.std():4.2f}"


def protocol(args) -> dict:
    """What makes two runs comparable: a run recorded under another protocol is not reused."""
    halves = json.loads(HALVES.read_text()) if HALVES.is_file() else None
    return {"corpus": WIKI.name, "sentences": args.sentences, "max_length": args.max_length, "epochs": 1,
            "eval_steps": args.eval_steps, "precision": args.precision, "attack_m": [4, 16],
            "halves_seed": (halves or {}).get("seed", HALVES_SEED)}


class Store:
    """The per-run figures, kept in one JSON file and written after each run, so an interrupted table
    (a session ending, a box going away) goes on where it stopped instead of starting over."""

    def __init__(self, path: Path | None, proto: dict):
        self.path, self.proto = path, proto
        self.data = {"protocol": proto, "before": {}, "runs": []}
        if path and path.is_file():
            try:
                saved = json.loads(path.read_text())
            except ValueError as exc:
                refuse(f"{path} is not a table this script kept ({exc}): name another --json file")
            kept = saved.get("protocol") if isinstance(saved, dict) else None
            if kept != proto:
                refuse(f"{path} holds runs of another protocol ({kept}): name another --json file")
            self.data = saved

    def before(self, pooling: str):
        return self.data["before"].get(pooling)

    def run(self, row: str, seed: int):
        return next((r for r in self.data["runs"] if r["row"] == row and r["seed"] == seed), None)

    def add_before(self, pooling: str, figures: dict) -> None:
        self.data["before"][pooling] = figures
        self.save()

    def add_run(self, row: str, seed: int, pooling: str, head: str, figures: dict, result, started: float,
                **extra) -> None:
        """One finished run, with what every record carries: scores, selected step, time, machine, commit, date."""
        self.data["runs"].append({"row": row, "seed": seed, "pooling": pooling, "head": head, **extra,
                                  "scores": {str(m): s for m, s in figures.items()},
                                  "selected_step": (result.metrics.get("best") or {}).get("step"),
                                  "seconds": round(time.perf_counter() - started, 1), "machine": machine(),
                                  "commit": commit(), "date": time.strftime("%Y-%m-%d")})
        self.save()

    def save(self) -> None:
        if self.path:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
            tmp.replace(self.path)


def commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         check=False, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def print_table(store: Store, rows: list, seeds: list[int]) -> None:
    print(f"\n{'run':48s} {'pooling / head':26s} {'before':>7s} {'after (report half)':>20s} "
          f"{'attack m=4':>15s} {'attack m=16':>15s} seeds")
    searched = dict.fromkeys(r["row"] for r in store.data["runs"] if r["row"].startswith(SEARCHED))
    for name in [r[0] for r in rows] + list(searched):  # (and the row combined_search.py adds)
        done = [r for r in store.data["runs"] if r["row"] == name and r["seed"] in seeds]
        if not done:
            print(f"{name:48s} (not run)")
            continue
        first = done[0]
        before = store.before(first["pooling"]) or {}
        print(f"{name:48s} {first['pooling'] + ' / ' + first['head']:26s} {before.get('1', float('nan')):7.2f} "
              f"{describe([r['scores']['1'] for r in done]):>20s} {describe([r['scores']['4'] for r in done]):>15s} "
              f"{describe([r['scores']['16'] for r in done]):>15s} {len(done)}/{len(seeds)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sentences", type=int, default=None)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--eval-steps", type=int, default=125, help="selection-half scoring cadence (SimCSE's)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "auto"],
                    help="training and scoring precision; fp32 (default) keeps AVX2 and AVX-512 boxes' runs "
                         "comparable in one table, auto uses bf16 where the CPU has it")
    ap.add_argument("--only", nargs="*", help="row names to run, in this order (default: all)")
    ap.add_argument("--json", default=None,
                    help="keep every run's figures here; runs already in it (same protocol) are not run again")
    ap.add_argument("--table-only", action="store_true", help="print the table from --json, run nothing")
    args = ap.parse_args()
    ms = [4, 16]
    store = Store(Path(args.json) if args.json else None, protocol(args))
    rows = rows_to_run(args)
    dtype = resolve_precision("auto", torch.device("cpu")) if args.precision == "auto" else None
    with tempfile.TemporaryDirectory() as tmp:
        select, report_file = dev_halves(Path(tmp))
        report = read_stsb(report_file, "stsb_dev_report_half")
        print(f"# {machine()}; {WIKI.name} ({args.sentences or 'all'} sentences), 1 epoch, max length "
              f"{args.max_length}, seeds {args.seeds}; select on {HALVES.name}'s selection half every "
              f"{args.eval_steps} steps, report on its other half; attack: m in {ms} within 256 tokens; training "
              f"and scoring in {dtype or 'fp32'}", flush=True)
        for name, config, overrides in ([] if args.table_only else rows):
            settings = settings_from(config, overrides, args, args.seeds[0], select)
            pooling = settings.get("model.pooling", "mean")
            head = settings.get("model.mlp_head", "auto")
            if store.before(pooling) is None:  # the untrained model, scored the way this row is
                store.add_before(pooling, {str(m): s for m, s in scores("default", report, ms, dtype, pooling).items()})
            for seed in args.seeds:
                if store.run(name, seed):
                    continue
                start = time.perf_counter()
                result = train_run(f"{tmp}/{config}-{seed}", settings_from(config, overrides, args, seed, select))
                figures = scores(str(result.model_dir), report, ms, dtype)
                store.add_run(name, seed, pooling, head, figures, result, start)
                step = store.run(name, seed)["selected_step"]
                print(f"  {name} seed {seed}: report half {figures[1]:.2f} (step {step}), "
                      f"m=4 {figures[4]:.2f}, m=16 {figures[16]:.2f}", flush=True)
                shutil.rmtree(f"{tmp}/{config}-{seed}", ignore_errors=True)
    print_table(store, rows, args.seeds)
    print_verdicts(store.data, args.seeds)


if __name__ == "__main__":
    main()
