"""Experiment tracking: the refusals, here. The tracked runs themselves are checked on runs other tests
make anyway (each fit costs ~20 s), read back through each tracker's own reader (``tracked``):
test_train_cli's main run tracks into TensorBoard, MLflow (conftest's real server on 127.0.0.1) and
W&B (offline) at once; test_tune's two-trial experiment into MLflow and W&B."""

import time

import pytest

from raycse.cli import main
from raycse.config import parse_tracking
from raycse.errors import ConfigError

from conftest import _free_port, own_lines
from tracked import SECRET, mlflow_with_password

pytest.importorskip("mlflow")


def _train_args(model, corpus, out, dev, tracking):
    return ["train", "--model", str(model), "--corpus", str(corpus), "--output", str(out), "--stsb-dev", str(dev),
            "--num-workers", "2", "--cpus-per-worker", "1", "--batch-size", "16", "--max-length", "16",
            "--max-steps", "8", "--eval-steps", "4", "--log-steps", "2", "--tracking", tracking,
            "--score-before", "true"]


def test_several_trackers_are_one_spec_of_each_kind():
    assert parse_tracking("tensorboard:tb, mlflow:http://h:5000,wandb:team/p") == [
        ("tensorboard", "tb"), ("mlflow", "http://h:5000"), ("wandb", "team/p")]
    assert parse_tracking(None) == [] and parse_tracking("none") == []
    with pytest.raises(ConfigError, match="names mlflow twice"):
        parse_tracking("mlflow:http://a:1,mlflow:http://b:2")
    with pytest.raises(ConfigError, match="tracking must be mlflow:URI"):
        parse_tracking("tensorboard:tb,")
    with pytest.raises(ConfigError, match="is not a W&B project"):
        parse_tracking("tensorboard:tb,wandb:a/b/c")


def test_unreachable_tracking_server_fails_fast_and_writes_nothing(tiny_model, corpus, stsb_dev, tmp_path, capsys):
    out = tmp_path / "run"
    t0 = time.time()
    argv = _train_args(tiny_model, corpus, out, stsb_dev, f"mlflow:http://raycse:{SECRET}@127.0.0.1:{_free_port()}")
    assert main(argv) == 2
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and "cannot reach the MLflow tracking server http://***@127.0.0.1:" in err[0]
    assert SECRET not in err[0]
    assert time.time() - t0 < 60 and not out.exists() and not list(tmp_path.glob(".run.partial-*"))
    assert main(_train_args(tiny_model, corpus, out, stsb_dev, "neptune:x")) == 2
    assert "tracking must be mlflow:URI" in capsys.readouterr().err
    # one bad spec among several: refused the same way, before anything starts
    assert main(_train_args(tiny_model, corpus, out, stsb_dev, f"tensorboard:{tmp_path / 'tb'},neptune:x")) == 2
    assert "tracking must be mlflow:URI" in capsys.readouterr().err
    assert not (tmp_path / "tb").exists() and not out.exists()


def test_a_tracker_that_fails_to_open_leaves_no_run_open(mlflow_server, tiny_model, corpus, stsb_dev, tmp_path,
                                                         monkeypatch, capsys):
    """MLflow opened, then W&B cannot make its directory: the run fails at once, in one line; the MLflow
    run it had opened is marked FAILED, not left RUNNING, and nothing is written."""
    from mlflow.tracking import MlflowClient

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(blocker / "wandb"))
    out = tmp_path / "half-open"
    argv = _train_args(tiny_model, corpus, out, stsb_dev, f"mlflow:{mlflow_with_password(mlflow_server)},wandb:p")
    assert main(argv) != 0
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and SECRET not in err[0], err
    client = MlflowClient(tracking_uri=mlflow_server)
    runs = [r for r in client.search_runs([client.get_experiment_by_name("raycse").experiment_id])
            if r.info.run_name == "half-open"]
    assert [r.info.status for r in runs] == ["FAILED"]
    assert not out.exists() and not list(tmp_path.glob(".half-open.partial-*"))


def test_mlflow_takes_metric_names_it_would_refuse(tmp_path):
    """MLflow refuses '@' in a metric name, and the whole batch with it: a run selecting by BEIR
    (beir_ndcg@10) with --tracking mlflow:URI failed at its first log. The sink writes MLflow's form."""
    from mlflow.tracking import MlflowClient

    from raycse.train.tracking import Tracking, close_run, get

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("names")).info.run_id
    tracking = Tracking(kind="mlflow", target=uri, run_id=run_id)
    get("mlflow").sink(tracking).log({"beir_ndcg@10": 0.5, "loss": 1.0}, step=1)
    close_run(tracking, ok=True, final={"best_beir_mrr@10": 0.25})
    assert client.get_run(run_id).data.metrics == {"beir_ndcg_at_10": 0.5, "loss": 1.0, "best_beir_mrr_at_10": 0.25}


def test_a_wandb_logging_actor_returns_with_its_run_on_disk_and_wandb_s_service_gone(ray_cluster, tmp_path):
    """Ray's W&B callback kills a trial's logging actor as soon as its ``run`` returns, and Ray ends a
    killed worker's children: W&B's service (wandb-core, the actor's child) must have written the run and
    exited by then. With Ray's own actor it was still running, and a run lost its history under load."""
    import psutil
    from ray.air.integrations.wandb import _QueueItem
    from ray.util.queue import Queue
    from ray.util.state import list_actors

    from raycse.tune.callbacks import tracking_callback
    from tracked import wandb_runs

    callback = tracking_callback("wandb", "p", "exp")
    queue = Queue(actor_options={"num_cpus": 0})
    for rung in (1, 2):
        queue.put((_QueueItem.RESULT, {"training_iteration": rung, "rung": rung, "mean": -float(rung)}))
    queue.put((_QueueItem.END, None))
    actor = ray_cluster.remote(num_cpus=0)(callback._logger_actor_cls).remote(
        logdir=str(tmp_path), queue=queue, exclude=[], to_config=[], id="trial1", project="p",
        dir=str(tmp_path / "wb"), mode="offline", group="exp")
    ray_cluster.get(actor.run.remote(), timeout=120)
    (state,) = list_actors(address=ray_cluster.get_runtime_context().gcs_address,  # (not another process's Ray)
                           filters=[("actor_id", "=", actor._actor_id.hex())], timeout=30)
    children = [p.name() for p in psutil.Process(state.pid).children(recursive=True)]
    ray_cluster.kill(actor)  # what the callback does next
    assert not [name for name in children if "wandb" in name], children
    (run,) = wandb_runs(tmp_path / "wb").values()
    assert [(h["rung"], h["mean"]) for h in run["history"]] == [(1, -1.0), (2, -2.0)]


def test_a_wandb_callback_alive_at_interpreter_exit_prints_nothing(tmp_path):
    """`raycse tune --tracking wandb:P` ended every run with Ray's ``WandbLoggerCallback.__del__`` failing
    at interpreter exit (``'NoneType' object has no attribute 'is_initialized'``: its module's globals were
    already cleared). Here the callback outlives the modules it reads, as the experiment's did."""
    import os
    import subprocess
    import sys

    program = ("import os\n"
               "from raycse.tune.callbacks import tracking_callback\n"
               "os._kept_until_exit = tracking_callback('wandb', 'p', 'exp')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)})
    assert done.returncode == 0 and "Exception ignored" not in done.stderr, done.stderr
