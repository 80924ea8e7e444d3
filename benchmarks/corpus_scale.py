"""The corpus pipeline's cost curve: seconds and peak memory per stage, from 100k to 10M sentences.

    python benchmarks/corpus_scale.py --sizes 100000 1000000 4000000 --workdir /tmp/raycse-scale
    python benchmarks/corpus_scale.py --sizes 100000 --embed-sample 100000   # + the embedding rate
    python benchmarks/corpus_scale.py --sizes 1000000 10000000 --knn-only    # the kNN search alone

Builds synthetic corpora of unique lines (wiki_sample.txt sentences with words swapped, each line
made unique by a hex serial; cached in ``--workdir``), then for each size runs raycse's own
pipeline on a private local Ray in this process, stage by stage:

- ``read+clean``: the files read and cleaned (``raw_dataset``, materialized);
- ``+shuffle``: the same plus the seeded pre-shuffle (``load_corpus`` without dedup);
- ``+dedup``: plus global deduplication and numbering (``load_corpus`` as train runs it);
- ``layout``: one epoch's random order packed into batches of 64 and read per rank;
- ``kNN search``: the grouping search on N synthetic 384-d vectors, normalised float16 as grouping
  keeps a large corpus's (``knn.search``, auto);
- ``train``: ``raycse train --max-steps 3 --stsb-dev none`` on the corpus, as a separate command
  (its own Ray): wall time to exit, and its time to the first step from its log.

Memory, sampled every 0.5 s: the driver's own unique memory (USS), the Ray worker processes' USS
added up, and the object store's bytes in use and spilled (Ray's own accounting,
``get_memory_info_reply``, what ``ray memory`` prints). USS counts a page shared by several
processes in none of them, so the store's pages are counted once, by the store. The embedding
step is measured at ``--embed-sample`` sentences and projected linearly; the projection is
marked as such. The last lines print each stage's growth exponent between sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import WIKI, machine, refuse  # noqa: E402

MB = 1024 * 1024


def build_corpus(n: int, workdir: Path, seed: int = 0) -> Path:
    """``n`` unique lines: wiki sentences with ~1 in 4 words swapped for another of the sample's words."""
    path = workdir / f"corpus-{n}.txt"
    if path.exists():
        return path
    base = [line.split() for line in WIKI.read_text(encoding="utf-8").splitlines() if line.strip()]
    vocab = np.array(sorted({w for words in base for w in words}))
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        for start in range(0, n, 100000):
            lines = []
            for i in range(start, min(n, start + 100000)):
                words = list(base[i % len(base)])
                swap = rng.random(len(words)) < 0.25
                for j in np.flatnonzero(swap):
                    words[j] = vocab[rng.integers(len(vocab))]
                lines.append(" ".join(words) + f" {i:x}")
            f.write("\n".join(lines) + "\n")
    tmp.rename(path)
    return path


class Sampler:
    """Peak memory of this process, of Ray's workers and of the object store, per stage."""

    def __init__(self, driver_pid: int, ray_connected: bool):
        import psutil

        self.psutil, self.driver = psutil, psutil.Process(driver_pid)
        self.ray_connected, self.warned = ray_connected, False
        self.peak: dict = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)

    def _uss(self, proc) -> int:
        try:
            return proc.memory_full_info().uss
        except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
            return 0

    def _workers(self) -> int:
        total = 0
        for proc in self.psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.pid != self.driver.pid and ("ray::" in cmd or "default_worker.py" in cmd):
                total += self._uss(proc)
        return total

    def _store(self) -> tuple[int, int]:
        if not self.ray_connected:
            return 0, 0
        try:
            import ray._private.internal_api as api

            stats = api.get_memory_info_reply(api.get_state_from_address(), timeout_seconds=5).store_stats
            return stats.object_store_bytes_used, stats.spilled_bytes_total
        except Exception as exc:  # the store is being started or stopped
            if not self.warned:
                print(f"# object store not measured: {exc!r}", flush=True)
                self.warned = True
            return 0, 0

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            sample = {"driver_mb": self._uss(self.driver), "workers_mb": self._workers()}
            sample["store_mb"], sample["spilled_mb"] = self._store()
            for key, value in sample.items():
                self.peak[key] = max(self.peak.get(key, 0), value)

    def take(self) -> dict:
        peak, self.peak = self.peak, {}
        return {k: round(v / MB) for k, v in peak.items()}


def staged(name: str, sampler: Sampler, fn) -> tuple[dict, object]:
    t0 = time.perf_counter()
    out = fn()
    row = {"stage": name, "seconds": round(time.perf_counter() - t0, 1), **sampler.take()}
    print(json.dumps(row), flush=True)
    return row, out


def pipeline_stages(path: Path, n: int, seed: int) -> list[dict]:
    import ray

    from raycse.config import DataConfig, GroupingConfig
    from raycse.data.dataset import load_corpus, raw_dataset
    from raycse.grouping import epoch_batches

    d = DataConfig(corpus=str(path))
    rows = []
    with Sampler(os.getpid(), ray_connected=True) as s:
        s.take()
        rows.append(staged("read+clean", s, lambda: raw_dataset(d, seed, shuffle=False).materialize().count())[0])
        rows.append(staged("+shuffle", s, lambda: load_corpus(d, seed, dedup=False).num_examples)[0])
        row, corpus = staged("+dedup", s, lambda: load_corpus(d, seed, dedup=True))
        rows.append(row)
        grouping = GroupingConfig(strategy="random")
        rows.append(staged("layout", s, lambda: epoch_batches(corpus, grouping, 64, 2, seed, 0, 0).steps)[0])
        del corpus
        rows += knn_stage(n, seed, s)
    ray.shutdown()
    return rows


def knn_stage(n: int, seed: int, sampler: Sampler) -> list[dict]:
    """The grouping search on N synthetic vectors, as grouping keeps a large corpus's (normalised
    float16, raycse.grouping.embed.vector_dtype); none where it would not fit in free memory."""
    import psutil

    from benchmarks.knn_grouping import synthetic
    from raycse.grouping import knn

    need = n * 384 * 2 + knn.memory_needed(n, 384, 64, "cells", normalized=True, itemsize=2)
    if need > psutil.virtual_memory().available:  # knn.search would refuse it in one line (exit 2)
        print(f"# kNN search at {n:,}: skipped, needs {need / 2**30:.1f} GiB with the vectors "
              f"({psutil.virtual_memory().available / 2**30:.1f} GiB free)")
        return []
    x = synthetic(n, "noisy", seed=seed, dtype="float16")
    sampler.take()  # the stage's peak, not the vectors' making
    return [staged("kNN search", sampler, lambda: knn.search(x, 64, assume_normalized=True, recall_sample=0))[0]]


def embed_rate(sample: int) -> float:
    """Sentences a second the embedded model encodes here (max length 32), on ``sample`` sentences."""
    from benchmarks.common import first_sentences
    from raycse.model.encoder import Encoder
    from raycse.model.precision import resolve_precision

    texts = (first_sentences(10**9) * (sample // 11000 + 1))[:sample]
    enc = Encoder.from_pretrained("default")
    t0 = time.perf_counter()
    enc.encode(texts, batch_size=256, max_length=32, autocast_dtype=resolve_precision("auto", enc.device))
    return sample / (time.perf_counter() - t0)


def train_command(path: Path, workdir: Path, n: int) -> dict:
    out = workdir / f"model-{n}"
    cmd = [sys.executable, "-m", "raycse", "train", "--model", "default", "--corpus", str(path), "--stsb-dev",
           "none", "--max-steps", "3", "--batch-size", "64", "--log-steps", "1", "--output", str(out), "--overwrite"]
    t0 = time.perf_counter()
    log = workdir / f"train-{n}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        with Sampler(proc.pid, ray_connected=False) as s:
            first = None
            while proc.poll() is None:
                time.sleep(0.5)
                if first is None and re.search(r"step\s+1\b", log.read_text(errors="replace")):
                    first = time.perf_counter() - t0
            peak = s.take()
    if proc.returncode != 0:
        raise SystemExit(f"raycse train failed at {n:,} sentences (rc {proc.returncode}); see {log}")
    return {"stage": "train (3 steps)", "seconds": round(time.perf_counter() - t0, 1),
            "first_step_s": None if first is None else round(first, 1), **peak}


def exponents(results: dict) -> None:
    sizes = sorted(results)
    for a, b in zip(sizes, sizes[1:]):
        later = {r["stage"]: r for r in results[b]}  # by stage: a stage skipped at one size has no pair
        for ra in results[a]:
            rb = later.get(ra["stage"])
            if rb and ra["seconds"] > 0.5:
                e = np.log(max(rb["seconds"], 1e-3) / ra["seconds"]) / np.log(b / a)
                print(f"# {ra['stage']}: {a:,} -> {b:,}: seconds grow as N^{e:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=int, default=[100000, 1000000])
    ap.add_argument("--workdir", default="/tmp/raycse-corpus-scale", help="where corpora and models are written")
    ap.add_argument("--embed-sample", type=int, default=0, help="measure the embedding rate on this many sentences")
    ap.add_argument("--no-train", action="store_true", help="skip the raycse train command")
    ap.add_argument("--knn-only", action="store_true",
                    help="run only the kNN search stage (no corpus built, no Ray, no train command)")
    ap.add_argument("--json", default=None, help="append the results to this JSON file")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not WIKI.is_file():
        refuse(f"{WIKI} not found: set RAYCSE_SHARED to the folder holding data/wiki_sample.txt")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"# {machine()}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    results = {}
    for n in args.sizes:
        if args.knn_only:
            with Sampler(os.getpid(), ray_connected=False) as sampler:
                results[n] = knn_stage(n, args.seed, sampler)
            continue
        path = build_corpus(n, workdir, args.seed)
        import ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        results[n] = pipeline_stages(path, n, args.seed)
        if not args.no_train:
            results[n].append(train_command(path, workdir, n))
    rate = embed_rate(args.embed_sample) if args.embed_sample else None
    print("\n| N | stage | seconds | driver MB | workers MB | object store MB | spilled MB |")
    print("|---|---|---|---|---|---|---|")
    for n, rows in results.items():
        for r in rows:
            extra = f" (first step {r['first_step_s']} s)" if r.get("first_step_s") else ""
            print(f"| {n:,} | {r['stage']} | {r['seconds']}{extra} | {r.get('driver_mb', '')} | "
                  f"{r.get('workers_mb', '')} | {r.get('store_mb', '')} | {r.get('spilled_mb', '')} |")
        if rate:
            print(f"| {n:,} | embedding (projected from {args.embed_sample:,} at {rate:,.0f}/s) | "
                  f"{n / rate:.0f} | | | | |")
    exponents(results)
    if args.json:
        import datetime

        old = json.load(open(args.json)) if os.path.exists(args.json) else []
        json.dump(old + [{"date": datetime.date.today().isoformat(), "machine": machine(), "n": n, "stages": rows,
                          "embed_per_s": rate} for n, rows in results.items()], open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
