"""Corpora of many sentences (issue 67): what the driver holds does not grow with the text."""

import tracemalloc

import numpy as np


def _corpus(path, n: int) -> None:
    rng = np.random.default_rng(n)
    words = np.array(["river", "city", "north", "music", "festival", "village", "summer", "king", "road", "built"])
    with open(path, "w") as f:
        for start in range(0, n, 50000):
            rows = rng.integers(0, len(words), size=(min(50000, n - start), 12))
            f.write("\n".join(" ".join(words[r]) + f" {start + i:x}" for i, r in enumerate(rows)) + "\n")


def _driver_peak(path) -> tuple[int, int]:
    """Peak bytes the driver allocates (Python and NumPy via tracemalloc, Arrow via its pool) while
    reading, shuffling, deduplicating and numbering the corpus and planning an epoch, as train does."""
    import pyarrow as pa

    from raycse.config import DataConfig, GroupingConfig
    from raycse.data.dataset import load_corpus
    from raycse.grouping import plan_epoch

    arrow_before = pa.default_memory_pool().max_memory() or 0
    tracemalloc.start()
    try:
        corpus = load_corpus(DataConfig(corpus=str(path)), seed=0)
        plan = plan_epoch(corpus, GroupingConfig(strategy="random"), 64, 2, 0, 0, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    arrow = (pa.default_memory_pool().max_memory() or 0) - arrow_before
    assert corpus.num_examples == plan.packing.batches.size + plan.packing.dropped
    return peak, max(arrow, 0), corpus.num_examples


def test_the_drivers_memory_grows_by_row_ids_and_hashes_not_by_text(ray_cluster, tmp_path):
    """Ten times the sentences (~70 bytes of text each) grow the driver's peak by what the
    module promises (8-byte hashes, row ids and the epoch's order: a few dozen bytes a row), not
    by the text: gathering the text would cost >= 70 bytes a row in Arrow alone."""
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    _corpus(small, 30000)
    _corpus(large, 300000)
    py_small, arrow_small, n_small = _driver_peak(small)
    py_large, arrow_large, n_large = _driver_peak(large)
    assert (n_small, n_large) == (30000, 300000)  # unique lines: nothing dropped
    per_row = (py_large + arrow_large - py_small - arrow_small) / (n_large - n_small)
    text_per_row = large.stat().st_size / n_large
    assert text_per_row > 70
    assert per_row < 48, f"the driver's peak grew by {per_row:.0f} bytes a row"
