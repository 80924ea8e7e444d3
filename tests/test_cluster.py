"""Cluster operation: cluster YAMLs, `ray job submit` to a real local head, damaged checkpoints."""

import json
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import build_raycse_wheel


ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- cluster files
@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_cluster_launcher_yamls_validate_against_rays_schema(name):
    import jsonschema
    import ray

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    cfg = yaml.safe_load((ROOT / "cluster" / name).read_text())
    jsonschema.validate(cfg, schema)
    workers = [t for n, t in cfg["available_node_types"].items() if n != cfg["head_node_type"]]
    assert any(t["resources"].get("GPU", 0) >= 1 and t["min_workers"] == 0 and t["max_workers"] >= 1 for t in workers)
    assert "GPU" not in cfg["available_node_types"][cfg["head_node_type"]]["resources"]
    assert any("raycse" in c for c in cfg["setup_commands"])
    assert any("--dashboard-host=127.0.0.1" in c for c in cfg["head_start_ray_commands"])


def _strict(schema):
    """A Kubernetes structural schema as JSON Schema that refuses unknown fields (kubectl's
    --validate=strict), except where the schema preserves them."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields") \
                and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def test_kuberay_rayjob_validates_against_kuberays_crd():
    """KubeRay's own RayJob CRD (ray-operator/config/crd/bases/ray.io_rayjobs.yaml at tag v1.7.0,
    kept gzipped in tests/data/kuberay/) validates the manifest, unknown fields refused."""
    import gzip

    import jsonschema

    # the CRD is 1.4 MB of YAML: libyaml's loader where PyYAML has it (4 s -> 0.5 s here)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(gzip.decompress((ROOT / "tests" / "data" / "kuberay" / "ray.io_rayjobs-v1.7.0.yaml.gz")
                                    .read_bytes()), Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(version["schema"]["openAPIV3Schema"])
    # the schema checked against its metaschema once (3.5 s); jsonschema.validate() would redo it per call
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema)
    job = yaml.safe_load((ROOT / "cluster" / "kuberay-rayjob.yaml").read_text())
    validator.validate(job)
    broken = yaml.safe_load((ROOT / "cluster" / "kuberay-rayjob.yaml").read_text())
    broken["spec"]["shutdownAfterJobFinish"] = True  # a typo KubeRay would silently drop
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(broken)
    spec = job["spec"]
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob" and spec["shutdownAfterJobFinishes"] is True
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert "pip" in env and env["env_vars"]["RAYCSE_BUCKET"]
    # everything the run leaves goes to the bucket: the cluster's disks are deleted after the job
    for flag in ("--corpus", "--storage-path", "--output"):
        assert f"{flag} s3://$RAYCSE_BUCKET/" in spec["entrypoint"]
    cluster = spec["rayClusterSpec"]
    # KubeRay's submitter reaches the job API through the head's Service, not from the head itself
    assert cluster["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    pods = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    assert all(p["template"]["spec"]["containers"][0]["envFrom"] for p in pods)  # S3 credentials on every node
    gpu = cluster["workerGroupSpecs"][0]
    assert gpu["minReplicas"] == 0 and gpu["maxReplicas"] >= 1
    assert "nvidia.com/gpu" in gpu["template"]["spec"]["containers"][0]["resources"]["limits"]


# ----------------------------------------------------------------------------- ray job submit
def test_job_submitted_to_a_real_head_succeeds_and_its_model_loads(tiny_model, corpus, stsb_dev, tmp_path, own_ray):
    from fake_cluster import LocalHead

    out = tmp_path / "job_out"
    head = LocalHead(own_ray, tmp_path)
    try:
        job = head.submit(f"{sys.executable} -m raycse train --model {tiny_model} --corpus {corpus} --output {out} "
                          f"--stsb-dev {stsb_dev} --num-workers 1 --cpus-per-worker 1 --batch-size 16 "
                          f"--max-length 16 --max-steps 4 --eval-steps 2", {"HF_HUB_OFFLINE": "1"}, working_dir=ROOT,
                          excludes=[".venv", ".git", "outputs", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".ruff_cache"])
        status = head.wait_job(job, 300)
        logs = head.client.get_job_logs(job)
        assert status == "SUCCEEDED", logs[-2000:]
        assert "STS-B dev Spearman" in logs
    finally:
        head.stop()
    from sentence_transformers import SentenceTransformer

    assert SentenceTransformer(str(out / "model")).encode(["a city"]).shape == (1, 32)


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_a_job_that_pip_installs_raycse_keeps_the_clusters_ray_and_trains_and_tunes(tiny_model, corpus, stsb_dev,
                                                                                    tmp_path, own_ray):
    """Issue 92, item 6: `ray job submit --runtime-env-json '{"pip": [raycse]}'` to a head of this Ray (the
    floor's, under scripts/floors.sh): pip installs raycse into the job's environment beside the cluster's
    Ray (with no index to reach for another one), and a 2-trial `raycse tune` succeeds there: each trial
    is a `raycse train` fit, scored on STS-B dev (a `raycse train` job of its own: the test above; one here
    too cost the suite ~60 s, Ray's actors starting 3-4x slower in a pip runtime env)."""
    import ray
    from fake_cluster import LocalHead

    wheel = build_raycse_wheel(tmp_path / "build")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "run": {"model": {"name_or_path": str(tiny_model), "max_length": 16}, "data": {"corpus": str(corpus)},
                "train": {"batch_size": 16, "max_steps": 2, "num_workers": 1}, "eval": {"stsb_dev": str(stsb_dev)}},
        "search": {"lr": {"loguniform": [1e-5, 1e-4]}}}))
    probe = "import ray, raycse; print('job ray', ray.__version__, 'raycse from', raycse.__file__)"
    head = LocalHead(own_ray, tmp_path)
    try:
        job = head.submit(f"python -c \"{probe}\" && python -m raycse tune --space {space} --num-samples 2 "
                          f"--seeds 1 --rungs 1 --storage-path {tmp_path / 'exp'} --name job",
                          {"HF_HUB_OFFLINE": "1"}, pip={"packages": [str(wheel)], "pip_install_options": ["--no-index"]})
        status = head.wait_job(job, 600)
        logs = head.client.get_job_logs(job)
    finally:
        head.stop()
    assert status == "SUCCEEDED", logs[-3000:]
    line = next(x for x in logs.splitlines() if x.startswith("job ray "))
    assert line.split()[2] == ray.__version__, line  # the cluster's Ray, not one pip chose
    assert str(ROOT) not in line and "raycse from" in line  # the installed wheel, not this checkout
    results = sorted((tmp_path / "exp" / "job").glob("trial_*/result.json"))
    assert len(results) == 2
    scores = [json.loads(line) for r in results for line in r.read_text().splitlines() if line.strip()]
    import math

    assert len(scores) == 2 and all(len(s["seed_scores"]) == 1 and math.isfinite(s["seed_scores"][0])
                                    for s in scores), scores  # each trial trained and was scored on STS-B dev


README_HEAD_PORTS = (6379, 8265, 52365)  # cluster/README.md's head: GCS, dashboard, and Ray's default agent port
NODE_WAIT = "Timed out waiting for node info"  # (Ray's client server, when its raylet registered after 30 s)


def _readme_head_command() -> list[str]:
    """The `ray start` line of cluster/README.md ("Try the cluster on one machine"), as it is written there."""
    import re
    import shlex

    text = (ROOT / "cluster" / "README.md").read_text()
    block = text[text.index("## Try the cluster on one machine"):]
    line = re.search(r"^(RAY_FAKE_CLUSTER=1 .*?ray start --head .*?)\n(?!\s)", block.replace("\\\n", " "), re.M)
    assert line, "cluster/README.md has no `ray start --head` line"
    return shlex.split(line.group(1))


@pytest.mark.xdist_group("heavy")  # (two Rays, one with an autoscaler; in CI, beside other tests, its head took no job)
def test_the_readme_head_beside_a_running_raycse_command_takes_jobs(tiny_model, tmp_path, own_ray):
    """Issue 86: a raycse command's private Ray held Ray's default agent port (52365), so the README's
    head started beside it came up without a job agent ("No available agent to submit job"). The head is
    started as cluster/README.md writes it (its ports, its config), while `raycse train` runs; a job
    submitted to it succeeds, and the train command still ends as a signal makes it, in its one line."""
    import re
    import signal
    import socket
    import subprocess

    from conftest import make_sentences, stop_process_group
    from test_untrusted import _read_until, _rest, _start

    for port in README_HEAD_PORTS:  # (checked before raycse starts: its own Ray holding one is the failure)
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"port {port} is taken on this machine by something else")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(make_sentences(2000)) + "\n")
    train = _start(["train", "--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", "none",
                    "--batch-size", "8", "--max-length", "16", "--epochs", "50", "--log-steps", "5",
                    "--output", str(tmp_path / "out")], tmp_path, own_ray)
    head = None
    try:
        _read_until(train, r"\[raycse\] step \d+/")
        argv = _readme_head_command()
        first = argv.index("ray")  # (the variables set before it)
        env, argv = {**own_ray, **dict(a.split("=", 1) for a in argv[:first])}, argv[first:]
        assert argv[:3] == ["ray", "start", "--head"] and "--port=6379" in argv, argv

        def start_head():
            temp = tempfile_short()
            with open(tmp_path / "head.log", "wb") as log:  # (what `ray start` says, for a failure's message)
                return temp, subprocess.Popen([str(Path(sys.executable).parent / "ray"), *argv[1:], "--block",
                                               f"--temp-dir={temp}", "--disable-usage-stats"], cwd=ROOT,
                                              env={**env, "RAY_AUTH_MODE": "disabled"}, start_new_session=True,
                                              stdout=log, stderr=subprocess.STDOUT)

        temp, head = start_head()
        from ray.job_submission import JobStatus, JobSubmissionClient

        # (180 s: a head and its autoscaler beside a fit, on 2 cores)
        deadline, client, job, retried = time.time() + 180, None, None, False
        while job is None:
            try:
                client = client or JobSubmissionClient("http://127.0.0.1:8265")
                job = client.submit_job(entrypoint=f"{sys.executable} -c \"print('the job ran')\"")
            except Exception as exc:  # noqa: BLE001 - the head still starting; its agent comes after the dashboard
                if head.poll() is not None and NODE_WAIT in (tmp_path / "head.log").read_text(errors="replace") \
                        and time.time() < deadline - 60 and not retried:
                    # Ray's own start gave up: its client server waits a fixed 30 s for the raylet's registration,
                    # which a loaded 2-core box can take longer to make (seen: 56 s); once more, as a user would
                    stop_process_group(head, 3)
                    shutil.rmtree(temp, ignore_errors=True)
                    (temp, head), retried = start_head(), True
                    continue
                assert head.poll() is None and time.time() < deadline, \
                    f"the README's head took no job in 180 s: {exc}\n{_head_logs(head, tmp_path / 'head.log', temp)}"
                time.sleep(1)
        while client.get_job_status(job) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            assert time.time() < deadline + 60, client.get_job_logs(job)
            time.sleep(1)
        assert client.get_job_status(job) == JobStatus.SUCCEEDED and "the job ran" in client.get_job_logs(job)
        assert train.poll() is None  # (the raycse command ran all along)
        train.send_signal(signal.SIGINT)  # (Python's KeyboardInterrupt; SIGHUP to a fit: test_untrusted)
        tail = _rest(train, 60)
        assert train.wait(timeout=10) == 130, tail[-5:]
        own = [line for line in tail if line.startswith("raycse:")]
        assert len(own) == 1 and re.fullmatch(
            rf"raycse: interrupted \(SIGINT\); stopped at step \d+; nothing was written to "
            rf"{re.escape(str(tmp_path / 'out'))}; pass --storage-path DIR to make a run resumable after an "
            rf"interruption\n", own[0]), tail[-10:]
    finally:
        if train.poll() is None:
            train.kill()
        if head is not None:
            stop_process_group(head, 3)
            shutil.rmtree(temp, ignore_errors=True)


def _head_logs(head, log: Path, temp: str) -> str:
    """Why a head started by a test took no job: `ray start`'s exit code and output, and the ends of the logs
    of the processes the dashboard needs (a CI box's log is all there is to read)."""
    from fake_cluster import session_log_tails

    status = f"ray start: {'running' if head.poll() is None else f'ended {head.returncode}'}"
    return "\n".join([status, *log.read_text(errors="replace").splitlines()[-15:], session_log_tails(
        temp, ("gcs_server.out", "raylet.out", "dashboard.log", "dashboard.err", "dashboard_agent.log"), 1500)])


def tempfile_short() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths < 108 chars


# ----------------------------------------------------------------------------- fault tolerance
# A Train worker killed mid-fit resuming from its latest checkpoint is tested where it checks most:
# test_regroup.py (SIGKILL of a worker; the batches replayed equal an uninterrupted run's, weights to
# the bit) and test_multinode.py (a worker node removed; the default random order, checkpoints on S3).
def test_truncated_checkpoint_is_skipped_with_a_warning(ray_cluster, tiny_model, corpus, stsb_dev, tmp_path, capsys):
    """The worker loop in the test process (tests/local_session.py: what this proves is the checkpointer's choice,
    not Ray Train's start): a checkpoint cut short in storage is passed over, named, and the run resumes from the
    one before it; the second run copies its checkpoints in the background (async) and waits for each."""
    from local_session import fit_in_process

    from raycse.config import RunConfig
    from raycse.train.checkpoints import files as ckpt
    from raycse.train.fit import report_resume
    from raycse.train.plan import TuneHooks

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(tiny_model), 16
    run.data.corpus = str(corpus)
    run.train.num_workers, run.train.cpus_per_worker, run.train.batch_size = 1, 1, 16
    run.train.max_steps, run.train.checkpoint_steps, run.train.epochs = 6, 2, 3
    run.eval.stsb_dev, run.eval.eval_steps = str(stsb_dev), 1000
    run.output_dir = str(tmp_path / "a")
    run.train.checkpoint_upload = "sync"
    store = tmp_path / "store"
    assert fit_in_process(run, store, hooks=TuneHooks(stop_at=6)).last["checkpoint_upload"] == "sync"
    dirs = sorted(d for d in (store / "train").glob("checkpoint_*") if d.is_dir())
    steps = {d: ckpt.step_of(d) for d in dirs}
    latest = max(dirs, key=steps.get)
    assert steps[latest] == 6
    weights = latest / ckpt.STATE_DIR / "module.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut short
    step, path = ckpt.latest_valid(store / "train")
    assert step == 4 and Path(path) != latest
    capsys.readouterr()
    run.output_dir, run.train.max_steps, run.train.checkpoint_upload = str(tmp_path / "b"), 8, "async"
    fit = fit_in_process(run, store)
    report_resume(fit.last["resumed"])  # (what the driver says after the fit)
    out = capsys.readouterr().out
    assert f"skipped damaged checkpoint {latest.name}" in out and "resumed from step 4" in out
    assert fit.last["step"] == 8 and fit.last["checkpoint_upload"] == "async"


def test_waiting_for_a_checkpoint_upload_is_bounded(tmp_path):
    """Under train.checkpoint_upload async, a checkpoint first waits for the previous one to reach
    storage (Ray removes its local directory then), at most train.checkpoint_upload_timeout_s."""
    from raycse.train.checkpoints.in_fit import wait_for_upload

    local = tmp_path / "raycse-ckpt-x"
    local.mkdir()
    start = time.monotonic()  # before the timer: on a loaded box the timer may fire before the next line
    threading.Timer(0.4, shutil.rmtree, args=(local,)).start()  # Ray's upload thread, done after 0.4 s
    wait_for_upload(local, 4, 30.0, "s3://bucket/ckpt/train")
    assert not local.exists() and 0.4 <= time.monotonic() - start < 10
    local.mkdir()  # an upload that never ends
    start = time.monotonic()
    with pytest.raises(TimeoutError) as err:
        wait_for_upload(local, 8, 0.5, "s3://bucket/ckpt/train")
    assert 0.5 <= time.monotonic() - start < 10
    assert "step 8 has not reached s3://bucket/ckpt/train in 0.5 s" in str(err.value)
    assert "train.checkpoint_upload_timeout_s" in str(err.value)
