"""Beyond one machine: a three-node Ray cluster on this machine (ray.cluster_utils.Cluster, what
Ray's own tests use), in its own process: the two Train workers land on different nodes, corpus,
checkpoints and model live on the S3 server, and the driver's disk receives nothing; a worker node
removed mid-run and replaced: the run resumes from its latest checkpoint on S3 and ends with the
planned steps on the nodes alive (one run checks both); a 2-trial tune on the same cluster, its
experiment on S3. A raycse process started beside it without RAY_ADDRESS starts its own Ray
instead of joining it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def real_cluster_env(env: dict) -> dict:
    """``env`` less what raycse sets only for its private local cluster."""
    return {k: v for k, v in env.items() if k != "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"}


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_two_workers_on_two_nodes_with_everything_on_s3(tiny_model, corpus, stsb_dev, tmp_path, own_ray):
    pytest.importorskip("moto.server")
    from conftest import _free_port, make_sentences

    big_corpus = tmp_path / "corpus-1k.txt"
    big_corpus.write_text("\n".join(make_sentences(1024, seed=7)) + "\n")
    run_dir = tmp_path / "driver-cwd"
    run_dir.mkdir()
    r = subprocess.run([sys.executable, str(HERE / "multinode_run.py"), str(tiny_model), str(corpus), str(big_corpus),
                        str(stsb_dev),
                        str(_free_port())], capture_output=True, text=True, timeout=1500, cwd=run_dir,
                       env={**real_cluster_env(own_ray), "PYTHONPATH": str(HERE.parent)})
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    out = json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])
    print("seconds by phase:", out["seconds"])
    replaced = out["replaced"]
    assert replaced["error"] is None and replaced["removed"], replaced
    assert replaced["steps"] == 100  # the planned count, after the restart
    assert replaced["model_dir"] == "s3://raycse-multinode/runs/replaced/model"
    nodes = replaced["worker_nodes"]
    assert len(set(nodes)) == 2  # rank 0 and rank 1 on different nodes
    # the worker nodes alive at the end: the rank that lived on the removed node now runs on its
    # replacement, and nothing on the head (it has no CPUs)
    assert set(nodes) == set(out["cluster_worker_nodes"]) and out["head_node"] not in nodes
    assert replaced["replacement"] in nodes and replaced["removed"] not in nodes
    keys = set(out["s3_keys"])
    assert "runs/replaced/raycse_manifest.json" in keys and "runs/replaced/model/config.json" in keys
    assert any(k.startswith("ckpt-replaced/") for k in keys)
    assert out["cwd_unchanged"] and not list(run_dir.iterdir())  # nothing but logs (Ray's, in /tmp/ray)
    assert out["private_address"] != out["cluster_address"] and not out["private_address"].startswith("failed")
    tune = out["tune"]
    assert tune["exp"] == "s3://raycse-multinode/tune/exp" and not tune["errors"] and tune["complete"] == [True, True]
    assert tune["concurrent"] == 2  # both trials may run at once (a 0.9-CPU worker on each 1-CPU node)
    assert all(loc.startswith("s3://raycse-multinode/tune/exp/trial_") for loc in tune["locations"])
    steps = [s for s, _ in replaced["rank0_steps"]]
    pids = [p for _, p in replaced["rank0_steps"]]
    restart = next(i for i in range(1, len(pids)) if pids[i] != pids[i - 1])  # the new worker group
    # from the latest checkpoint on S3 (every 10 steps), not from step 0, and no step skipped
    assert 0 < steps[restart] <= steps[restart - 1] + 1 and steps[restart] % 10 == 0
    assert steps[restart:] == list(range(steps[restart], 100))
