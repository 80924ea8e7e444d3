"""Issue 43 on the CPU stand-in of one GPU (scripts/gpu_share.py --device cpu: one GPU declared to Ray,
the workers training on the CPU): 3 trials at 0.5 GPU run 2 at once and never more, every trial's
worker inside the one GPU (one trial more than fit, so the last must wait; at 0.25 the same check
needs 5 trials, and on these 2 cores 4 concurrent trials took 4x as long each: the stand-in was the
suite's slowest item); two workers of one run share the GPU over gloo and train like one worker
with the double batch; every placement group is gone at the end. On a real GPU the same script
measures (bash scripts/gpu_check.sh share). kNN grouping of a --use-gpu run
embeds on its share of the GPU."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import bare_env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_share import most_at_once  # noqa: E402


def test_most_at_once_counts_overlaps():
    assert most_at_once([(0, 2), (1, 3), (2.5, 4)]) == 2
    assert most_at_once([(0, 1), (1, 2)]) == 1  # one ends as the next starts
    assert most_at_once([(0, 10), (1, 2), (3, 4), (3.5, 5)]) == 3


def test_collectives_said_and_chosen_for_fractional_gpus(capsys):
    from raycse.config import TrainConfig
    from raycse.train.fit import collective_backend, say_devices

    shared = TrainConfig(num_workers=2, use_gpu=True, gpus_per_worker=0.5)
    say_devices(shared)
    assert "2 worker(s) x 0.5 GPU; collectives: gloo" in capsys.readouterr().out
    assert collective_backend(shared) == "gloo" and shared.gpus_needed() == 1
    assert collective_backend(TrainConfig(num_workers=2, use_gpu=True)) == "nccl"
    assert collective_backend(TrainConfig(num_workers=2)) == "gloo"
    assert TrainConfig(num_workers=4, use_gpu=True, gpus_per_worker=0.3).gpus_needed() == 2  # 3 fit one GPU
    assert TrainConfig(num_workers=3, use_gpu=True, gpus_per_worker=2).gpus_needed() == 6


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory, own_ray):  # (its trials run on a private Ray of their own: the full tier)
    tmp = tmp_path_factory.mktemp("gpu-share")
    out = tmp / "report.json"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "share", "--device", "cpu", "--model", "tiny",
                           "--fractions", "0.5", "--trials", "3", "--sentences", "64", "--steps", "2", "--batch", "8",
                           "--probe-steps", "3", "--probe-batch", "8", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=bare_env(HOME=str(tmp), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
                                       TMPDIR=tempfile.gettempdir()))  # (not tmp: Ray's sockets there pass 107 bytes)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_two_workers_share_one_gpu_and_train_like_one_with_double_batch(stand_in):
    probe = stand_in["two_workers_one_gpu"]
    assert [p["gpus"] for p in probe["places"]] == [["0"], ["0"]]  # both ranks on the one GPU
    assert {p["backend"] for p in probe["places"]} == {"gloo"}
    assert len(probe["losses_two_workers"]) == 3
    assert probe["max_loss_diff"] < 1e-5 and probe["max_weight_diff"] < 1e-5
    assert probe["losses_one_worker"][0] != probe["losses_one_worker"][-1]  # it trained


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_half_gpu_trials_run_two_at_once_never_more(stand_in):
    search = stand_in["fractions"]["0.5"]
    assert search["trials"] == 3 and not search["errors"]
    assert search["concurrent"] == 2  # --concurrent left to raycse: 1 GPU / 0.5
    assert most_at_once(search["spans"]) == 2, search["spans"]
    assert search["trial_worker_gpus"] == [[["0"]]] * 3  # every trial's worker inside the one GPU
    assert stand_in["placement_groups_left"] == [] and stand_in["available_gpus_after"] == 1.0


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_knn_grouping_of_a_gpu_run_embeds_on_its_share_of_the_gpu(stand_in):
    """Issue 67: with --use-gpu, the embedding actors that group the corpus before the fit hold the run's
    GPU fraction each while they embed (Ray's count of the GPU free fell by it), and give it back; on a real
    GPU the same check runs on it."""
    grouping = stand_in["grouping"]
    assert grouping["groups"] > 0, grouping
    assert grouping["least_gpu_free"] in (0.0, 0.5), grouping  # one or two actors of 0.5 GPU
    assert grouping["gpu_free_after"] == 1.0, grouping
