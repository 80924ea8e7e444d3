"""What a tracked run left in MLflow and W&B, read back through their own readers (MLflow's client; W&B's
run files parsed with wandb's own protobuf classes, offline). The runs are made by tests that run
anyway: test_train_cli's main run tracks into TensorBoard, MLflow and W&B at once, test_tune's
two-trial experiment into MLflow and W&B (each fit costs ~20 s, so no test makes one just to be
tracked)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

SECRET = "SEKRETmlflow41"


def mlflow_with_password(server: str) -> str:
    """The server's URI with a password inside (HTTP basic auth; the test server ignores it)."""
    return server.replace("http://", f"http://raycse:{SECRET}@")


def mlflow_train_run(server: str, out: Path, printed: str, fetched: Path, logged: list, scored: list) -> None:
    """A train run in MLflow: one finished run named after the output, the resolved config as params
    (the URI's password masked, and printed and saved nowhere: issue 41), rank 0's metrics once per
    logged step, the dev score before training and at each eval, the best score at the end, and the
    model as the run's artifact, which sentence-transformers loads as it loads the output."""
    from mlflow.tracking import MlflowClient
    from sentence_transformers import SentenceTransformer

    client = MlflowClient(tracking_uri=server)
    assert SECRET not in printed
    assert not [p for p in out.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    (run,) = [r for r in client.search_runs([client.get_experiment_by_name("raycse").experiment_id])
              if r.info.run_name == out.name]
    assert run.info.status == "FINISHED"
    assert SECRET not in json.dumps([run.data.params, run.data.tags])
    assert "mlflow:" + server.replace("http://", "http://***@") in run.data.params["train.tracking"].split(",")
    assert run.data.params["objective.name"] == "simcse" and run.data.params["train.num_workers"] == "2"
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in loss] == logged  # rank 0 only: one value per logged step
    assert len(client.get_metric_history(run.info.run_id, "lr")) == len(logged)
    assert all(m.value > 0 for m in client.get_metric_history(run.info.run_id, "examples_per_s"))
    dev = client.get_metric_history(run.info.run_id, "stsb_dev_spearman")
    assert sorted(m.step for m in dev) == scored  # before training, then every eval step
    assert run.data.metrics["best_stsb_dev_spearman"] == pytest.approx(max(m.value for m in dev if m.step > 0))
    got = Path(client.download_artifacts(run.info.run_id, "model", str(fetched)))
    sentences = ["the city river", "a king was born"]
    np.testing.assert_allclose(SentenceTransformer(str(got)).encode(sentences),
                               SentenceTransformer(str(out / "model")).encode(sentences), atol=1e-6)


def wandb_records(run_file: Path):
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


def wandb_runs(root: Path) -> dict:
    """run id -> {"runs": [its run records], "history": [{metric: value}], "summary": {key: value}} over
    every offline run directory under ``root`` (a W&B run resumed by a later fit has a directory per fit)."""
    out: dict = {}
    for run_file in sorted(root.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = out.setdefault(record.run.run_id, {"runs": [], "history": [], "summary": {}})
                run["runs"].append(record.run)
            elif kind == "history":
                run["history"].append(_items(record.history.item))
            elif kind == "summary":
                run["summary"].update(_items(record.summary.update))
    return out


def wandb_offline(monkeypatch, where: Path) -> Path:
    """W&B offline, its files under ``where`` (the session's Ray workers were started without these:
    raycse hands the driver's mode and directory on)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(where))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return where


def wandb_train_run(root: Path, out: Path, logged: list, scored: list) -> None:
    """``--tracking wandb:raycse-test`` through Ray's own W&B integration: the run's fits log into one W&B
    run (config, rank 0's metrics, the final scores in its summary), and nothing lands in the output."""
    (run,) = wandb_runs(root).values()
    assert {r.project for r in run["runs"]} == {"raycse-test"} and {r.display_name for r in run["runs"]} == {out.name}
    config = _items(run["runs"][0].config.update)
    assert config["objective"]["name"] == "simcse" and config["train"]["num_workers"] == 2
    steps = lambda key: sorted(h["_step"] for h in run["history"] if key in h)  # noqa: E731
    assert steps("loss") == logged and steps("lr") == logged  # rank 0 only
    assert steps("stsb_dev_spearman") == scored  # before training, then every eval step
    dev = [h["stsb_dev_spearman"] for h in run["history"] if "stsb_dev_spearman" in h and h["_step"] > 0]
    assert run["summary"]["best_stsb_dev_spearman"] == pytest.approx(max(dev))
    assert not [p for p in out.rglob("*") if "wandb" in p.name]


def wandb_tune_experiment(root: Path, experiment: str, results, rungs: list) -> None:
    """A tune experiment in W&B (Ray's WandbLoggerCallback): a run per trial, grouped by the experiment,
    with the trial's knobs as config and a ``mean`` per rung agreeing with Tune's results."""
    trials = wandb_runs(root)
    assert len(trials) == len(results) and {r.run_group for t in trials.values() for r in t["runs"]} == {experiment}
    for t in trials.values():
        assert [h["rung"] for h in t["history"] if "mean" in h] == rungs, t["history"]
        assert {"lr", "tau"} <= set(_items(t["runs"][0].config.update))  # the trial's knobs
    assert sorted(t["history"][-1]["mean"] for t in trials.values()) == pytest.approx(
        sorted(r.metrics["mean"] for r in results))
