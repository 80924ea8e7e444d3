"""scripts/gpu_check.sh stays runnable where no GPU is: its part one on the CPU with a tiny BERT."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import bare_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.full_tier  # (tests/conftest.py: the whole check in a subprocess, ~50 s)
def test_gpu_check_part_one_smoke_on_cpu(tmp_path):
    out = tmp_path / "report.json"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--model", "tiny",
                        "--batch", "8", "--lengths", "16", "32", "--reps", "1", "--loop-steps", "3", "--speed-batches", "4",
                        "--part", "1", "--train-batch", "8", "--profile-steps", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=600,
                       env=bare_env(HOME=str(tmp_path), HF_HUB_OFFLINE="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["device"] == "CPU"
    assert set(report["objective_steps"]) == {"simcse", "hicl", "compcse", "sgopt", "laser", "bsc"}
    assert all(v["ok"] for v in report["objective_steps"].values())
    for length in ("len16", "len32"):
        row = report["unpad_vs_sdpa"][length]
        assert row["equal"] and row["sdpa_padded"]["sent_per_s"] > 0 and row["unpadded"]["sent_per_s"] > 0
    assert report["simcse_loop"]["steps"] == 3
    assert set(report["step_speed"]) == {"batch4_buckets1", "batch4_buckets2", "batch4_buckets1_fresh",
                                         "batch4_buckets2_fresh"}
    assert all(v["sent_per_s"] > 0 for v in report["step_speed"].values())
    st = report["st_trainer"]["batch4"]  # sentence-transformers' own trainer, same batch and length
    assert st["sent_per_s"] > 0 and st["seconds_to_step_10"] is None  # (6 steps here: no 10th)
    profile = report["plain_step_profile"]  # steps 6..7, after 5 warm-up ones
    assert profile["steps"] == "6..7" and set(profile["phases_s"]) == {"raycse.collate", "raycse.step"}
    assert "[gpu-check] profile without Ray, batch 8, steps 6..7" in r.stdout
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                       env=bare_env(HOME=str(tmp_path)))
    assert r.returncode == 2 and "no CUDA device here" in r.stderr  # a CPU box says so


@pytest.mark.full_tier  # (tests/conftest.py: the check and a raycse train in subprocesses, ~15 s)
def test_gpu_check_part_two_fails_when_its_training_run_fails(tmp_path):
    """Part two's `raycse train --use-gpu` refused (no GPU here): the check exits non-zero and names it."""
    out = tmp_path / "report.json"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--model", "tiny",
                        "--part", "2", "--json", str(out)], capture_output=True, text=True, timeout=300,
                       env=bare_env(HOME=str(tmp_path), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled"))
    assert r.returncode == 1 and "FAILED: raycse train (1_workers)" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    part_two = json.loads(out.read_text())["part_two"]
    assert part_two["1_workers"]["rc"] == 2 and "needs 1 GPU(s)" in part_two["1_workers"]["tail"]
    assert set(part_two) == {"1_workers"}  # no inline-collate comparison without a first run


def test_the_loop_gap_scripts_train_fit_is_bounded():
    """scripts/gpu_loop_gap.py waits for its Ray Train worker's rows at most FIT_BOUND_S: a fit that hangs ends
    the check in a TimeoutError naming what it waited for; a fit's own error is raised as it is."""
    import sys
    import threading
    import time

    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_loop_gap import FIT_BOUND_S, bounded

    assert 0 < FIT_BOUND_S <= 3600
    never = threading.Event()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="the rows did not come within 0.3 s"):
        bounded(never.wait, 0.3, "the rows")
    assert time.monotonic() - start < 5
    never.set()

    def fails():
        raise ValueError("worker group failed")

    with pytest.raises(ValueError, match="worker group failed"):
        bounded(fails, 5, "the rows")
    done = []
    bounded(lambda: done.append(1), 5, "the rows")
    assert done == [1]
