"""Outputs and models on object storage, against a real S3-compatible server on 127.0.0.1 (moto in
server mode): published whole (manifest last), refused when incomplete, fetched once into a cache;
`raycse train` with corpus, checkpoints and output on S3, and `raycse eval` of the model there."""

import json
import tempfile
from pathlib import Path

import pytest

from raycse.cli import main
from raycse.errors import DataError, RaycseError
from raycse.platform.object_store import MANIFEST, fetch, publish

from conftest import joining, own_lines


def _local_dir(tmp_path, name="out"):
    d = tmp_path / name
    (d / "model").mkdir(parents=True)
    (d / "model" / "config.json").write_text('{"a": 1}')
    (d / "model" / "weights.bin").write_bytes(bytes(range(256)) * 100)
    (d / "metrics.json").write_text("{}")
    return d


def test_publish_fetch_and_incomplete_prefixes(s3_server, tmp_path):
    import boto3

    bucket = s3_server()
    uri = f"s3://{bucket}/runs/one"
    publish(_local_dir(tmp_path), uri, parts=("model",))
    s3 = boto3.client("s3")
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == sorted(["runs/one/metrics.json", f"runs/one/model/{MANIFEST}", "runs/one/model/config.json",
                           "runs/one/model/weights.bin", f"runs/one/{MANIFEST}"])
    cache = tmp_path / "cache"
    model = fetch(f"{uri}/model", cache)
    assert (model / "weights.bin").read_bytes() == bytes(range(256)) * 100
    assert fetch(f"{uri}/model", cache) == model  # cached: the same directory, not fetched again
    with pytest.raises(RaycseError, match="is not empty; pass --overwrite"):
        publish(_local_dir(tmp_path, "again"), uri)
    # a prefix without its manifest (an upload that stopped) is refused
    s3.put_object(Bucket=bucket, Key="runs/half/model/config.json", Body=b"{}")
    with pytest.raises(DataError, match="has no raycse_manifest.json: it is not a complete raycse output"):
        fetch(f"s3://{bucket}/runs/half/model", cache)
    # a file changed after publishing is refused
    s3.put_object(Bucket=bucket, Key="runs/one/model/weights.bin", Body=b"changed")
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"runs/one/model/{MANIFEST}")["Body"].read())
    manifest["files"]["extra"] = {"size": 1, "sha256": "0" * 64}  # a new manifest: not in the cache
    s3.put_object(Bucket=bucket, Key=f"runs/one/model/{MANIFEST}", Body=json.dumps(manifest).encode())
    with pytest.raises(DataError, match="does not match its manifest|missing"):
        fetch(f"{uri}/model", cache)
    assert not [p for p in cache.rglob("*") if ".partial-" in p.name]


def test_unusable_uris_fail_before_ray_with_one_line(s3_server, tiny_model, corpus, tmp_path, capsys):
    """A corpus object that is not there, a bucket that does not exist, an empty corpus prefix, objects
    holding no text: one line and exit 2 from train (corpus and --storage-path) and mine, before Ray
    starts; nothing written."""
    import boto3

    bucket, blank = s3_server(), s3_server()
    s3 = boto3.client("s3")
    s3.put_object(Bucket=blank, Key="blank.txt", Body=b"\n  \n\t\n")  # blank lines only
    s3.put_object(Bucket=blank, Key="corpus/a.txt", Body=b"")
    s3.put_object(Bucket=blank, Key="corpus/b.jsonl", Body=b"   \n")
    out = tmp_path / "out"
    base = ["--model", str(tiny_model), "--stsb-dev", "none", "--output", str(out), "--max-steps", "2"]
    cases = [
        # a corpus with no text on object storage: refused before Ray, as a local one is
        (["train", "--corpus", f"s3://{blank}/blank.txt", *base], "the corpus has no usable text"),
        (["train", "--corpus", f"s3://{blank}/corpus/", *base], "the corpus has no usable text"),
        (["train", "--corpus", f"s3://{bucket}/missing.txt", *base], f"corpus not found: s3://{bucket}/missing.txt"),
        (["train", "--corpus", f"s3://{bucket}/corpus/", *base], "corpus not found"),
        (["train", "--corpus", f"{corpus},s3://no-such-bucket-raycse/c.txt", *base],
         "bucket 'no-such-bucket-raycse' does not exist"),
        (["train", "--corpus", str(corpus), "--storage-path", "s3://no-such-bucket-raycse/ckpt", *base],
         "cannot use s3://no-such-bucket-raycse/ckpt: bucket 'no-such-bucket-raycse' does not exist"),
        # Ray Train records its storage path as given: a credential there is refused, named without it
        (["train", "--corpus", str(corpus), "--storage-path", _secret_uri(f"s3://{bucket}/ckpt"), *base],
         f"--storage-path s3://***@{bucket}/ckpt carries credentials inside the URI"),
        (["tune", "--space", str(corpus), "--storage-path", _secret_uri(f"s3://{bucket}/tune")],
         f"--storage-path s3://***@{bucket}/tune carries credentials inside the URI"),
        (["tune", "--resume", _secret_uri(f"s3://{bucket}/tune/x")],
         f"--resume s3://***@{bucket}/tune/x carries credentials inside the URI"),
        (["mine", "--corpus", f"s3://{bucket}/pairs.jsonl", "--text-column", "q", "--pair-column", "a",
          "--model", str(tiny_model), "--output", str(tmp_path / "mined.jsonl")], "corpus not found"),
    ]
    for argv, expected in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and err[0].startswith("raycse: error:") and expected in err[0], (argv, err)
        assert SECRET not in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [corpus.name]
    assert "Contents" not in boto3.client("s3").list_objects_v2(Bucket=bucket)


SECRET = "SEKRETraycse41"


def _secret_uri(uri: str) -> str:
    """``uri`` with credentials inside it (pyarrow reads them; moto takes any)."""
    return uri.replace("s3://", f"s3://AKIDraycse41:{SECRET}@", 1)


def _bucket_text(s3, bucket: str) -> str:
    listed = s3.list_objects_v2(Bucket=bucket, MaxKeys=5000).get("Contents", [])
    return "\n".join(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read().decode("latin-1") for o in listed)


def _tree_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("latin-1") for p in root.rglob("*") if p.is_file())


def test_train_on_s3_killed_resumes_publishes_whole_then_eval_and_mine(ray_cluster, s3_server, tiny_model, stsb_dev,
                                                                         tmp_path, capsys):
    """`raycse train` with its model, corpus, checkpoints and output on S3 on 2 workers: the driver killed mid-run
    (a lost session) leaves no half output; the same command again resumes from a checkpoint there, ends with the
    planned steps and publishes the output whole; eval and mine then read the model there. Also issue 41:
    credentials inside the model, corpus and output URIs (and eval's and mine's) work and appear in no object,
    local file or printed line."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import boto3

    from conftest import make_sentences

    bucket = s3_server()
    s3 = boto3.client("s3")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(make_sentences(600, seed=4)) + "\n")
    s3.upload_file(str(corpus), bucket, "data/c.txt")
    publish(tiny_model, f"s3://{bucket}/base")  # the starting model, on S3 too
    out = f"s3://{bucket}/out"
    argv = ["train", "--model", _secret_uri(f"s3://{bucket}/base"), "--corpus", _secret_uri(f"s3://{bucket}/data/c.txt"),
            "--output", _secret_uri(out), "--storage-path", f"s3://{bucket}/ckpt", "--stsb-dev", str(stsb_dev),
            "--num-workers", "2", "--cpus-per-worker", "1", "--batch-size", "8", "--max-length", "16",
            "--epochs", "2", "--max-steps", "40", "--eval-steps", "1000", "--log-steps", "5",
            "--set", "train.checkpoint_steps=4"]
    before = set(p.name for p in tmp_path.iterdir())
    output_builds = lambda: set(Path(tempfile.gettempdir()).glob("raycse-output-*"))  # noqa: E731 - local builds
    builds_before = output_builds()
    proc = subprocess.Popen([sys.executable, "-m", "raycse", *argv], env=joining(ray_cluster), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def whole_checkpoints():
        listed = s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/train/").get("Contents", [])
        return [o["Key"] for o in listed if o["Key"].endswith("state/MANIFEST.json")]

    deadline = time.time() + 300
    try:
        while len(whole_checkpoints()) < 2:
            assert proc.poll() is None, "the run ended before it was killed"
            assert time.time() < deadline, "no checkpoint reached S3 in time"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver dies mid-run, like a lost session
        proc.wait()
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="out/")  # no half-published output
    left = output_builds() - builds_before
    assert left  # the killed driver's local build of the output
    time.sleep(3)  # Ray notices the dead driver and ends its Train run
    capsys.readouterr()
    worker_copies = lambda: set(Path(tempfile.gettempdir()).glob("raycse-ckpt-*"))  # noqa: E731 - workers' copies
    copies_before = worker_copies()
    assert main(argv) == 0  # the same command again
    printed = capsys.readouterr()
    resumed = [line for line in printed.out.splitlines() if "resumed from step" in line]
    assert resumed and int(resumed[0].split("resumed from step ")[1].split()[0]) >= 4, printed.out[-2000:]
    assert f"model saved to {out.replace('s3://', 's3://***@')}/model" in printed.out
    streams = printed.out + printed.err
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    assert {f"out/{MANIFEST}", f"out/model/{MANIFEST}", "out/metrics.json", "out/model/config.json",
            "out/model/README.md"} <= keys
    # Ray Train copied each checkpoint to S3 in the background, whole: both ranks' manifests and RNG states; then
    # it removed the workers' local copies
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/", MaxKeys=5000)["Contents"]]
    ckpts = sorted({k.split("/")[2] for k in keys if k.endswith("state/MANIFEST.json")})
    assert len(ckpts) >= 2, ckpts
    for c in ckpts:
        assert {f"ckpt/train/{c}/state/{n}" for n in ("MANIFEST.json", "MANIFEST.rank1.json", "rng_rank0.pt",
                                                      "rng_rank1.pt")} <= set(keys), c
    assert not worker_copies() - copies_before
    assert not any(p.exists() for p in left)  # the killed driver's build, removed by the run after it
    assert set(p.name for p in tmp_path.iterdir()) == before  # nothing but S3 received the run
    metrics = json.loads(s3.get_object(Bucket=bucket, Key="out/metrics.json")["Body"].read())
    assert metrics["last"]["step"] == 40 and metrics["last"]["checkpoint_seconds"] > 0
    assert metrics["last"]["checkpoint_upload"] == "async"  # auto: in the background to object storage
    # eval and mine by URIs with credentials; the same train again (the output exists) is refused in one line
    assert main(["eval", _secret_uri(f"{out}/model"), "--stsb-dev", str(stsb_dev)]) == 0
    printed = capsys.readouterr()
    assert "STSB-dev" in printed.out
    streams += printed.out + printed.err
    pairs = "\n".join(json.dumps({"q": f"query {w}", "a": f"answer {w}"}) for w in corpus.read_text().split()[:40])
    s3.put_object(Bucket=bucket, Key="data/pairs.jsonl", Body=pairs.encode())
    mined = tmp_path / "mined.jsonl"
    assert main(["mine", "--corpus", _secret_uri(f"s3://{bucket}/data/pairs.jsonl"), "--text-column", "q",
                 "--pair-column", "a", "--model", _secret_uri(f"{out}/model"), "--output", str(mined),
                 "--embed-actors", "1", "--max-length", "16"]) == 0
    assert mined.read_text().count("\n") >= 1
    mined.unlink()
    assert main(argv) == 2
    printed = capsys.readouterr()
    err = own_lines(printed.err)
    assert len(err) == 1 and "already exists and is not empty" in err[0]
    streams += printed.out + printed.err
    assert "s3://***@" in streams and SECRET not in streams and "AKIDraycse41" not in streams
    assert SECRET not in _bucket_text(s3, bucket)  # config.yaml, metrics.json, the card, checkpoints
    assert SECRET not in _tree_text(tmp_path)


def test_tune_on_s3_interrupted_resumed_analyzed_and_exported(ray_cluster, s3_server, tiny_model, corpus, stsb_dev,
                                                               tmp_path, capsys):
    """`raycse tune --storage-path s3://...` killed the moment its first trial saved its rung (before
    or after Tune's own record of it reached S3), resumed by URI: that trial is told to Tune again,
    not trained again, and the resumed search keeps the first driver's --corpus (the space names a file
    that is not there). `raycse analyze` reads the experiment from S3, writes its plots and the best
    model there, and `raycse eval` loads it. (The same search on a local directory resumes by the same
    path through the same code: checked here once, on S3.)"""
    import os
    import signal
    import subprocess
    import sys
    import time

    import boto3

    import yaml

    from raycse.analysis import analyze, load_trials
    from raycse.tune.trial import RUNGS
    from test_tune import _tiny_space

    bucket = s3_server()
    s3 = boto3.client("s3")
    exp = f"s3://{bucket}/tune/exp"
    # the space names a corpus that is not there: --corpus replaces it, for the first driver and the resume
    space = _tiny_space(tmp_path, tiny_model, tmp_path / "not-this-corpus.txt", stsb_dev)
    local_files = {p.name for p in tmp_path.iterdir()}
    argv = ["tune", "--space", space, "--num-samples", "2", "--seeds", "1", "--rungs", "1", "--concurrent", "1",
            "--corpus", str(corpus), "--storage-path", f"s3://{bucket}/tune", "--name", "exp"]
    env = joining(ray_cluster)
    proc = subprocess.Popen([sys.executable, "-m", "raycse", *argv], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.time() + 300
    saved = []
    try:
        while not saved:
            assert proc.poll() is None, "tune exited before a trial finished"
            assert time.time() < deadline, "no trial saved its rung on S3 in time"
            time.sleep(0.5)
            listed = s3.list_objects_v2(Bucket=bucket, Prefix="tune/exp/").get("Contents", [])
            saved = [o["Key"] for o in listed if o["Key"].endswith(f"/{RUNGS}")]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the experiment's driver dies, like a lost laptop session
        proc.wait()
    first = saved[0].split("/")[2]
    rungs = json.loads(s3.get_object(Bucket=bucket, Key=saved[0])["Body"].read())
    model = f"tune/exp/{first}/seed0/model_out/{MANIFEST}"
    written = s3.head_object(Bucket=bucket, Key=model)["LastModified"]
    time.sleep(3)  # Ray notices the dead driver and releases its trial actors
    capsys.readouterr()
    assert main(["tune", "--resume", exp]) == 0
    trials = load_trials(exp)
    assert len(trials) == 2 and all(t.complete for t in trials)
    again = next(t for t in trials if t.name == first)
    assert [r["seed_scores"] for r in again.results] == [[rungs["scores"]["0"][0]]]
    assert s3.head_object(Bucket=bucket, Key=model)["LastModified"] == written  # not trained again
    assert all(t.location.startswith(f"{exp}/trial_") for t in trials)
    recorded = lambda name: s3.get_object(Bucket=bucket, Key=f"tune/exp/{name}")["Body"].read()  # noqa: E731
    assert yaml.safe_load(recorded("space.yaml"))["run"]["data"]["corpus"] == str(corpus)
    assert json.loads(recorded("raycse_tune.json"))["num_samples"] == 2
    assert len(analyze(exp, plots=False).table.splitlines()) == 4
    from test_tune import _same_as_rays_own_reading

    _same_as_rays_own_reading(exp, trials)  # Ray's own reading, from S3
    # each seed's model is on S3, published whole; the trials' resumable Train checkpoints were freed
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="tune/exp/", MaxKeys=5000)["Contents"]}
    for t in trials:
        assert f"tune/exp/{t.name}/seed0/model_out/{MANIFEST}" in keys
        assert not [k for k in keys if k.startswith(f"tune/exp/{t.name}/seed0/train/")]
    assert {p.name for p in tmp_path.iterdir()} == local_files  # the driver's directory received nothing
    # the Optuna study is kept beside the experiment, and opens with Optuna's own API
    import tempfile

    import optuna

    with tempfile.TemporaryDirectory() as held:
        db = Path(held) / "optuna.db"
        db.write_bytes(s3.get_object(Bucket=bucket, Key="tune/exp/optuna.db")["Body"].read())
        kept = optuna.load_study(study_name="exp", storage=f"sqlite:///{db}")
        told = [t for t in kept.trials if t.state == optuna.trial.TrialState.COMPLETE]
        assert told and all(any(t.value == pytest.approx(r.last["target"]) for r in trials) for t in told)
        assert all(set(t.params) == {"tau", "lr"} for t in told)
        assert not [t for t in kept.trials if t.state == optuna.trial.TrialState.RUNNING]  # none left running

    capsys.readouterr()
    best = f"s3://{bucket}/best"
    assert main(["analyze", exp, "--export-best", _secret_uri(best)]) == 0  # credentials in the URI: masked
    out = capsys.readouterr().out
    assert f"best model exported to {best.replace('s3://', 's3://***@')}" in out
    assert len(out.split("----")[0].splitlines()) >= 1 and SECRET not in out
    assert SECRET not in _bucket_text(s3, bucket)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert {f"best/{MANIFEST}", "best/config.json", "best/README.md"} <= keys
    assert {f"tune/exp/plots/{n}.png" for n in ("optimization_history", "seed_spread")} <= keys
    assert main(["eval", best, "--stsb-dev", str(stsb_dev)]) == 0
    assert "STSB-dev" in capsys.readouterr().out
    # the same export again is refused in one line; an experiment URI with nothing there too
    assert main(["analyze", exp, "--no-plots", "--export-best", best]) == 2
    assert main(["analyze", f"s3://{bucket}/tune/missing"]) == 2
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 2 and "is not empty" in err[0] and "not a raycse tune experiment" in err[1]
