"""Data in (issue 45 item 5): a corpus handed to the Python API as a ray.data.Dataset or a Hugging Face
datasets.Dataset, and --format hf reading a save_to_disk directory or a builder over local files
(data_files), all offline; each read back through raycse's own corpus reader."""

from __future__ import annotations

import contextlib
import json
import sys

import pytest

from conftest import make_sentences
from raycse.config import DataConfig, RunConfig
from raycse.errors import DataError

datasets = pytest.importorskip("datasets")
SENTENCES = make_sentences(40, seed=11)


_AUDIT = {"events": None, "seen": []}


@contextlib.contextmanager
def _audited(events: tuple):
    """The audit events ``events`` this process raises inside the block (Python's audit hooks, which
    cannot be removed: the one hook records only while a block is open)."""
    if _AUDIT["events"] is None:
        sys.addaudithook(lambda event, args: _AUDIT["seen"].append((event, args))
                         if _AUDIT["events"] and event in _AUDIT["events"] else None)
    _AUDIT["events"], _AUDIT["seen"] = events, []
    try:
        yield _AUDIT["seen"]
    finally:
        _AUDIT["events"] = ()


def _texts(corpus) -> list[str]:
    return sorted(r["text"] for r in corpus.dataset.iter_rows())


def test_hf_format_reads_a_saved_directory_and_local_data_files(ray_cluster, tmp_path, monkeypatch):
    from raycse.data.dataset import load_corpus

    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"body": SENTENCES, "n": list(range(40))}).save_to_disk(str(saved))
    corpus = load_corpus(DataConfig(corpus=str(saved), format="hf", text_column="body"), seed=1)
    assert corpus.num_examples == 40 and _texts(corpus) == sorted(SENTENCES)

    both = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": SENTENCES[:10]}),
                          "validation": datasets.Dataset.from_dict({"text": SENTENCES[10:25]})}).save_to_disk(str(both))
    assert _texts(load_corpus(DataConfig(corpus=str(both), format="hf", split="validation"), seed=1)) == \
        sorted(SENTENCES[10:25])
    with pytest.raises(DataError, match="holds splits train, validation, not 'test'"):
        load_corpus(DataConfig(corpus=str(both), format="hf", split="test"), seed=1)

    records = tmp_path / "part.jsonl"
    records.write_text("\n".join(json.dumps({"text": s}) for s in SENTENCES[:30]) + "\n")
    # Ray's from_huggingface reloaded a "json" builder by name, which globbed the working directory
    # (150 s from the checkout) and then asked huggingface.co without a timeout: neither happens now
    workdir = tmp_path / "workdir"
    (workdir / "sub").mkdir(parents=True)
    monkeypatch.chdir(workdir)
    with _audited(("os.scandir", "os.listdir", "socket.getaddrinfo", "socket.connect")) as seen:
        corpus = load_corpus(DataConfig(corpus="json", format="hf", data_files=str(records)), seed=1)
    assert _texts(corpus) == sorted(SENTENCES[:30])
    assert not [(e, a) for e, a in seen if e.startswith("socket.") or str(workdir) in str(a[0])], seen


def test_a_private_ray_reports_no_usage_and_polls_no_prometheus(ray_cluster):
    """The private Ray (the fixture's is the product's own, raycse.platform.ray_session.start_local_ray) has usage
    reporting off in the driver and in its tasks: with it on, Ray Data's usage collector asked a Prometheus at
    127.0.0.1:9090 from the driver during an execution (seen by the hub audit above, in CI)."""
    import os

    import ray

    assert os.environ.get("RAY_USAGE_STATS_ENABLED") == "0"
    assert ray.get(ray.remote(lambda: os.environ.get("RAY_USAGE_STATS_ENABLED")).remote(), timeout=120) == "0"


def test_objects_handed_to_the_python_api(ray_cluster, tmp_path):
    import ray.data

    from raycse.data.dataset import load_corpus

    from_ray = load_corpus(DataConfig(), seed=2, source=ray.data.from_items([{"text": s} for s in SENTENCES]))
    assert _texts(from_ray) == sorted(SENTENCES)
    pairs = datasets.Dataset.from_dict({"q": SENTENCES[:20], "a": SENTENCES[20:]})
    from_hf = load_corpus(DataConfig(text_column="q", pair_column="a"), seed=2, source=pairs)
    assert sorted((r["text"], r["pair"]) for r in from_hf.dataset.iter_rows()) == sorted(zip(SENTENCES[:20],
                                                                                               SENTENCES[20:]))
    # a streamed dataset is read as a stream, on Ray Data's public Datasource (issue 92: no Ray internals)
    streamed = pairs.to_iterable_dataset(num_shards=2)
    from_stream = load_corpus(DataConfig(text_column="q", pair_column="a"), seed=2, source=streamed)
    assert sorted((r["text"], r["pair"]) for r in from_stream.dataset.iter_rows()) == sorted(zip(SENTENCES[:20],
                                                                                                   SENTENCES[20:]))
    with pytest.raises(DataError, match="column 'text' not found"):
        load_corpus(DataConfig(), seed=2, source=pairs)
    with pytest.raises(DataError, match="corpus must be a path, a ray.data.Dataset or a datasets.Dataset"):
        load_corpus(DataConfig(), seed=2, source=SENTENCES)


def test_raycse_train_takes_a_datasets_dataset(ray_cluster, tiny_model, stsb_dev, tmp_path):
    """A ``datasets.Dataset`` handed over as the corpus (``raycse.train(run, corpus=...)``) is read by the driver's plan
    and trained on by the worker loop (both in this process: tests/local_session.py); the published output holds the
    model."""
    from local_session import fit_in_process

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(tiny_model), 16
    run.train.batch_size, run.train.max_steps, run.train.cpus_per_worker = 8, 2, 1
    run.eval.stsb_dev = str(stsb_dev)
    run.output_dir = str(tmp_path / "out")
    fit = fit_in_process(run, tmp_path / "ckpt", source=datasets.Dataset.from_dict({"text": SENTENCES}))
    assert fit.planned.num_examples == 40 and fit.last["step"] == 2
    out = fit.publish(tmp_path / "out")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_examples"] == 40 and metrics["last"]["step"] == 2 and (out / "model" / "config.json").is_file()


def test_the_sample_corpus_is_found_through_its_setting_then_the_hub_cache(tmp_path):
    """Issue 69 item 6: the quickstart's corpus is $RAYCSE_DATA/wiki_sample.txt; else SimCSE's wiki1m file from the
    Hugging Face hub cache (here a prefilled one, the hub off), capped to the sample's size; with neither, one line
    naming what to pass and exit 2. The arguments are ``raycse train``'s."""
    import os
    import subprocess

    from raycse.cli import build_parser, resolve_train_config
    from raycse.data.sample import HUB_FILE, HUB_REPO, HUB_SENTENCES

    cache = tmp_path / "hub"
    env = {k: v for k, v in os.environ.items() if k != "RAYCSE_DATA"}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"), HF_HUB_CACHE=str(cache))

    def find(**extra):
        proc = subprocess.run([sys.executable, "-m", "raycse.data.sample"], env={**env, **extra}, capture_output=True,
                              text=True, timeout=120)
        return proc.returncode, proc.stdout.splitlines(), proc.stderr.strip().splitlines()

    code, out, err = find()
    assert (code, out, len(err)) == (2, [], 1)
    assert "RAYCSE_DATA" in err[0] and HUB_REPO in err[0]

    revision = "0123456789abcdef0123456789abcdef01234567"  # as the hub client lays out a download
    repo = cache / f"datasets--{HUB_REPO.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    cached = repo / "snapshots" / revision / HUB_FILE
    cached.parent.mkdir(parents=True)
    cached.write_text("\n".join(make_sentences(50)) + "\n")
    code, out, err = find(RAYCSE_DATA=str(tmp_path / "no_such_folder"))
    assert (code, out) == (0, ["--corpus", str(cached), "--max-sentences", str(HUB_SENTENCES)])
    assert len(err) == 1 and HUB_FILE in err[0]
    run = resolve_train_config(build_parser().parse_args(["train", "--config", "simcse", *out]))
    assert (run.data.corpus, run.data.max_sentences) == (str(cached), HUB_SENTENCES)

    data = tmp_path / "data"
    data.mkdir()
    (data / "wiki_sample.txt").write_text("\n".join(make_sentences(20)) + "\n")
    code, out, err = find(RAYCSE_DATA=str(data))
    assert (code, out, err) == (0, ["--corpus", str(data / "wiki_sample.txt")], [])


def test_sigint_while_the_sample_corpus_is_fetched_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C while the hub is asked for the sample corpus (here a hub that accepts and never answers) ends
    `python -m raycse.data.sample` with one line and 130, and the quickstart passes that code on."""
    import os
    import signal
    import socket
    import subprocess
    import time
    from pathlib import Path

    server, conn = socket.socket(), None
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        env = {k: v for k, v in os.environ.items() if k != "RAYCSE_DATA"}
        env.update(HF_HUB_OFFLINE="0", HF_ENDPOINT=f"http://127.0.0.1:{server.getsockname()[1]}",
                   HF_HOME=str(tmp_path / "hf_home"), HF_HUB_CACHE=str(tmp_path / "hub"))
        proc = subprocess.Popen([sys.executable, "-m", "raycse.data.sample"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the client has connected: it waits for an answer now
            server.settimeout(0.5)
            try:
                conn, _ = server.accept()
                break
            except OSError:
                continue
        time.sleep(1.0)  # (the probe's connection closes at once; the download's stays)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if conn is not None:
            conn.close()
        server.close()
    lines = [line for line in err.splitlines() if line.strip()]
    assert (proc.returncode, out) == (130, "") and len(lines) == 1 and "interrupted (SIGINT)" in lines[0], err
    assert "exit $?" in (Path(__file__).parents[1] / "scripts" / "quickstart.sh").read_text()
