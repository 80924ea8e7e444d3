"""Experiment tracking against a real MLflow tracking server on 127.0.0.1 (sqlite store in a temp
dir; conftest's mlflow_server), TensorBoard event files and offline W&B runs, read back through their
own readers. A train run's TensorBoard files are checked in test_train_cli, tune experiments' MLflow
runs and TensorBoard files in test_tune: on runs those tests make anyway (each fit costs ~20 s)."""

import json
import time
from pathlib import Path

import numpy as np
import pytest

from raycse.cli import main

from conftest import _free_port, own_lines

pytest.importorskip("mlflow")


def _train_args(model, corpus, out, dev, tracking):
    return ["train", "--model", str(model), "--corpus", str(corpus), "--output", str(out), "--stsb-dev", str(dev),
            "--num-workers", "2", "--cpus-per-worker", "1", "--batch-size", "16", "--max-length", "16",
            "--max-steps", "8", "--eval-steps", "4", "--log-steps", "2", "--tracking", tracking,
            "--score-before", "true"]


SECRET = "SEKRETmlflow41"


def test_train_runs_in_mlflow(ray_cluster, mlflow_server, tiny_model, corpus, stsb_dev, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    # a password inside the tracking URI (HTTP basic auth; this server ignores it) is tracked, printed
    # and saved nowhere (issue 41)
    with_password = mlflow_server.replace("http://", f"http://raycse:{SECRET}@")
    assert main(_train_args(tiny_model, corpus, tmp_path / "run", stsb_dev, f"mlflow:{with_password}")) == 0
    printed = capsys.readouterr()
    assert SECRET not in printed.out + printed.err
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    (run,) = client.search_runs([client.get_experiment_by_name("raycse").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert SECRET not in json.dumps([run.data.params, run.data.tags])
    assert run.data.params["train.tracking"] == "mlflow:" + mlflow_server.replace("http://", "http://***@")
    assert run.data.params["objective.name"] == "simcse" and run.data.params["train.num_workers"] == "2"
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in loss] == [2, 4, 6, 8]  # rank 0 only: one value per logged step
    assert len(client.get_metric_history(run.info.run_id, "lr")) == 4
    assert all(m.value > 0 for m in client.get_metric_history(run.info.run_id, "examples_per_s"))
    dev = client.get_metric_history(run.info.run_id, "stsb_dev_spearman")
    assert sorted(m.step for m in dev) == [0, 4, 8]  # before training, then every eval step
    assert run.data.metrics["best_stsb_dev_spearman"] == pytest.approx(max(m.value for m in dev[1:]))
    # the trained model is the run's "model" artifact, and sentence-transformers loads it back
    from sentence_transformers import SentenceTransformer

    fetched = Path(client.download_artifacts(run.info.run_id, "model", str(tmp_path / "fetched")))
    sentences = ["the city river", "a king was born"]
    np.testing.assert_allclose(SentenceTransformer(str(fetched)).encode(sentences),
                               SentenceTransformer(str(tmp_path / "run" / "model")).encode(sentences), atol=1e-6)
    # a tune experiment's MLflow runs: test_tune's two-trial experiment tracks into this server (one
    # experiment of two trials fewer than one of its own here)


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


def _wandb_records(run_file: Path):
    """The records of a W&B run file (``run-ID.wandb``), read by the format's own rules (a 7-byte header,
    then LevelDB-log chunks in 32 KiB blocks: crc32, length, type FULL/FIRST/MIDDLE/LAST) and parsed
    with wandb's own protobuf classes: offline runs are checked without a W&B server."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def _items(items) -> dict:
    """A record's items (a name in ``key``, or in ``nested_key`` as W&B's service writes it) as a dict."""
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def _wandb_runs(root: Path) -> dict:
    """run id -> {"runs": [its run records], "history": [{metric: value}], "summary": {key: value}} over
    every offline run directory under ``root`` (a W&B run resumed by a later fit has a directory per fit)."""
    out: dict = {}
    for run_file in sorted(root.glob("wandb/offline-run-*/run-*.wandb")):
        for record in _wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = out.setdefault(record.run.run_id, {"runs": [], "history": [], "summary": {}})
                run["runs"].append(record.run)
            elif kind == "history":
                run["history"].append(_items(record.history.item))
            elif kind == "summary":
                run["summary"].update(_items(record.summary.update))
    return out


def test_train_and_tune_runs_in_wandb_offline(ray_cluster, tiny_model, corpus, stsb_dev, tmp_path, monkeypatch):
    """``--tracking wandb:PROJECT`` through Ray's own W&B integration, offline: the train run's fits log
    into one W&B run (config, rank 0's metrics, the final scores in its summary), a tune experiment's
    trials are runs of their own grouped by the experiment. Nothing lands in the output directory."""
    from raycse.tune import TuneSettings, tune_search
    from test_tune import _tiny_space

    wb = tmp_path / "wb"
    # the session's Ray workers were started without these: raycse hands the driver's mode and directory on
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wb))
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert main(_train_args(tiny_model, corpus, tmp_path / "run", stsb_dev, "wandb:raycse-test")) == 0
    (run_id, run), = _wandb_runs(wb).items()
    assert {r.project for r in run["runs"]} == {"raycse-test"} and {r.display_name for r in run["runs"]} == {"run"}
    config = _items(run["runs"][0].config.update)
    assert config["objective"]["name"] == "simcse" and config["train"]["num_workers"] == 2
    steps = lambda key: sorted(h["_step"] for h in run["history"] if key in h)  # noqa: E731
    assert steps("loss") == [2, 4, 6, 8] and steps("lr") == [2, 4, 6, 8]  # rank 0 only
    assert steps("stsb_dev_spearman") == [0, 4, 8]  # before training, then every eval step
    dev = [h["stsb_dev_spearman"] for h in run["history"] if "stsb_dev_spearman" in h and h["_step"] > 0]
    assert run["summary"]["best_stsb_dev_spearman"] == pytest.approx(max(dev))
    assert not [p for p in (tmp_path / "run").rglob("*") if "wandb" in p.name]

    space = _tiny_space(tmp_path, tiny_model, corpus, stsb_dev)
    settings = TuneSettings(space=space, num_samples=2, seeds=[0], rungs=1, scheduler="none", concurrent=1,
                            tracking="wandb:raycse-test")
    exp, results = tune_search(settings, str(tmp_path / "tune"), "exp-wandb")
    assert not any(r.error for r in results)
    trials = {k: v for k, v in _wandb_runs(wb).items() if k != run_id}
    assert len(trials) == 2 and {r.run_group for t in trials.values() for r in t["runs"]} == {"exp-wandb"}
    for t in trials.values():
        assert [h["rung"] for h in t["history"] if "mean" in h] == [1]  # the trial's one rung
        config = _items(t["runs"][0].config.update)
        assert {"lr", "tau"} <= set(config)  # the trial's knobs
    assert sorted(t["history"][-1]["mean"] for t in trials.values()) == pytest.approx(
        sorted(r.metrics["mean"] for r in results))
