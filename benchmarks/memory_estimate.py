"""raycse's pre-flight memory estimate (raycse.train.memory) recomputed by the current code for the runs whose peaks
were measured, beside those peaks, as ratios: for a change to the estimate alone (the runs themselves, and so their
peaks, are what they were).

    python benchmarks/memory_estimate.py results/2026-12-06-session68-memory-estimate.json \
        results/2026-12-06-session69-sharding.json

The rows come from benchmarks/gradient_checkpointing.py's JSON (each section's rows: one process, the estimate less
the weights against the peak over the loaded model) and benchmarks/sharding.py's (a 2-worker run's worker: the
whole estimate against the peak resident set); the ~150M Qwen3 is rebuilt from its config as those scripts build it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import machine


def single(settings: dict, row: dict, decoder_path: str) -> float:
    """gradient_checkpointing.py's estimate of ``row`` (MB, less the weights)."""
    from raycse.config import RunConfig
    from raycse.model.loading import resolve_model
    from raycse.train.memory import estimate

    run = RunConfig()
    run.train.precision, run.train.gradient_checkpointing = "fp32", row["checkpointing"]
    run.train.unpad = settings["unpad"] == "true"
    run.train.batch_size, run.model.max_length = settings["batch"], settings["length"]
    if settings["decoder"]:
        run.model.name_or_path, run.model.pooling = decoder_path, "lasttoken"
    run = run.resolved()
    guess = estimate(run, decoder_path if settings["decoder"] else resolve_model("default"))
    return (guess.total - guess.weights) / 2**20


def sharded(settings: dict, row: dict, decoder_path: str) -> float:
    """sharding.py's estimate of ``row``'s worker (MB)."""
    from sharding import _run

    from raycse.train.memory import estimate

    run = _run(decoder_path, row["sharding"], row["checkpointing"], settings["batch"], settings["length"])
    return estimate(run, decoder_path).total / 2**20


def main() -> None:
    from gradient_checkpointing import decoder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+", help="gradient_checkpointing.py or sharding.py JSON files")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    model = decoder(tempfile.gettempdir())
    print(f"# {machine()}; estimates by this checkout, peaks as recorded")
    print(f"{'run':<44} {'peak MB':>8} {'was MB':>8} {'now MB':>8} {'was x':>6} {'now x':>6}")
    # (a sharded row's label ends with the deepest model of its width whose estimate fits the limit: was -> now)
    rows = []
    for path in args.records:
        record = json.loads(Path(path).read_text())
        sections = ({k: v for k, v in record.items() if isinstance(v, dict) and "rows" in v} if "rows" not in record
                    else {"sharding": record})
        for name, section in sections.items():
            for row in section["rows"]:
                way = "sharding" in row
                now = (sharded if way else single)(section["settings"], row, model)
                label = f"{name}: {row['sharding'] if way else 'one process'}" + (" + ckpt" if row["checkpointing"]
                                                                                   else "")
                out = {"record": Path(path).name, "run": label, "peak_mb": row["peak_mb"],
                       "estimate_was_mb": row["estimate_mb"], "estimate_mb": now}
                if way:  # (sharding.py's deepest model of that width whose estimate fits its limit a worker)
                    from sharding import largest_in

                    st = section["settings"]
                    out["largest_layers_in_limit"] = largest_in(st["limit_gb"], model, row["sharding"],
                                                                row["checkpointing"], st["batch"], st["length"])
                    label += f" (layers in {st['limit_gb']:g} GiB: {row['largest_layers_in_limit']} -> " \
                             f"{out['largest_layers_in_limit']})"
                rows.append(out)
                print(f"{label:<44} {row['peak_mb']:>8.0f} {row['estimate_mb']:>8.0f} {now:>8.0f} "
                      f"{row['estimate_mb'] / row['peak_mb']:>6.2f} {now / row['peak_mb']:>6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
