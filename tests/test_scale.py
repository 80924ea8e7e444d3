"""Corpora of many sentences (issue 67): what the driver holds does not grow with the text."""

import json
import pathlib
import subprocess
import sys
import tracemalloc

import numpy as np


def _corpus(path, n: int) -> None:
    rng = np.random.default_rng(n)
    words = np.array(["river", "city", "north", "music", "festival", "village", "summer", "king", "road", "built"])
    with open(path, "w") as f:
        for start in range(0, n, 50000):
            rows = rng.integers(0, len(words), size=(min(50000, n - start), 12))
            f.write("\n".join(" ".join(words[r]) + f" {start + i:x}" for i, r in enumerate(rows)) + "\n")


def _driver_peak(path) -> tuple[int, int, int]:
    """Peak bytes the driver allocates (Python and NumPy via tracemalloc, Arrow via its pool) while
    reading, shuffling, deduplicating and numbering the corpus and planning an epoch, as train does."""
    import pyarrow as pa

    from raycse.config import DataConfig, GroupingConfig
    from raycse.data.dataset import load_corpus
    from raycse.grouping.epochs import plan_epoch

    pool = pa.default_memory_pool()
    pool.release_unused()
    arrow_before = pool.bytes_allocated()
    assert tracemalloc.is_tracing(), "run with python -X tracemalloc"
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    corpus = load_corpus(DataConfig(corpus=str(path)), seed=0)
    plan = plan_epoch(corpus, GroupingConfig(strategy="random"), 64, 2, 0, 0, 0)
    _, peak = tracemalloc.get_traced_memory()
    arrow = pool.bytes_allocated() - arrow_before
    assert corpus.num_examples == plan.packing.batches.size + plan.packing.dropped
    return peak - before, max(arrow, 0), corpus.num_examples


def measure(small: str, large: str) -> None:
    """In a process of its own (no other test's threads, logs or caches in the figures): a private
    Ray, one warm-up read, then the small corpus and the large one. tracemalloc traces from the
    interpreter's start (-X tracemalloc) to its end: CPython 3.11's tracemalloc.start()/stop()
    race with threads that allocate (Ray's), which crashed this process in traceback_new once in CI.
    The result is printed and the process ends without finalizing, for the same reason."""
    import os

    import ray

    from raycse.platform.ray_session import start_local_ray

    start_local_ray(2, object_store_memory=512 * 2**20, log_to_driver=False, configure_logging=False)
    _driver_peak(small)  # imports and Ray Data's first start, out of the figures
    result = {"small": _driver_peak(small), "large": _driver_peak(large)}
    ray.shutdown()
    print("RESULT", json.dumps(result), flush=True)
    os._exit(0)


def test_the_drivers_memory_grows_by_row_ids_and_hashes_not_by_text(own_ray, tmp_path):
    """Ten times the sentences (~70 bytes of text each) grow the driver's peak by what the module
    promises: 8-byte hashes, working memory to find the repeats among them (their concatenation and
    np.unique's sort: ~40 bytes a row at its peak) and the epoch's order (8): ~50 bytes a row
    measured. Not by the text: gathering it costs ~340 bytes a row, and packing a random order with
    a Python list per row (the code before issue 67) ~200."""
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    _corpus(small, 30000)
    _corpus(large, 300000)
    tests_dir = pathlib.Path(__file__).parent
    code = f"import sys; sys.path.insert(0, {str(tests_dir)!r}); import test_scale; " \
           f"test_scale.measure({str(small)!r}, {str(large)!r})"
    # -X tracemalloc, not PYTHONTRACEMALLOC: Ray's workers would inherit the variable and trace too
    done = subprocess.run([sys.executable, "-X", "tracemalloc", "-c", code], env=own_ray,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    (py_small, arrow_small, n_small), (py_large, arrow_large, n_large) = result["small"], result["large"]
    assert (n_small, n_large) == (30000, 300000)  # unique lines: nothing dropped
    per_row = (py_large + arrow_large - py_small - arrow_small) / (n_large - n_small)
    assert large.stat().st_size / n_large > 70
    assert per_row < 64, f"the driver's peak grew by {per_row:.0f} bytes a row"
