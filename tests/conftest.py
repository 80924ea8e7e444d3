"""Shared fixtures: a tiny random BERT built from a config, small corpora, one Ray cluster."""

from __future__ import annotations

import functools
import json
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_gloo(worker, args: tuple, nprocs: int = 2) -> None:
    """``worker(rank, *args)`` in ``nprocs`` spawned processes (torch.multiprocessing), each ended by
    :func:`_then_exit` once its worker returned."""
    import torch.multiprocessing as mp

    mp.start_processes(_then_exit, args=(worker, args), nprocs=nprocs, join=True, start_method="spawn")


def _then_exit(rank: int, worker, args: tuple) -> None:
    """``worker``'s process ended at once after it returned (its results written): the interpreter's own exit
    aborted such processes now and then under load ("terminate called without an active exception", SIGABRT, as
    gloo's threads were torn down), after everything was done. A worker that raises ends as spawn ends it."""
    worker(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def stop_process_group(proc, grace_s: float) -> None:
    """Stop a server started with ``start_new_session=True`` and its children: SIGTERM to its process
    group, SIGKILL after ``grace_s``; every wait bounded, and nothing left running either way."""
    import signal
    import subprocess

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            pass


# The S3 server of the tests (moto, started by the s3_server fixture) on a port fixed now, so every
# Ray process, started later, inherits where S3 is. Loopback only: never a real bucket.
S3_PORT = _free_port()
os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{S3_PORT}", AWS_ACCESS_KEY_ID="testing",
                  AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The project's sample data, named the way a user names theirs (raycse.config.DATA_ENV), not found by raycse
os.environ.setdefault("RAYCSE_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests import mlflow themselves (to read runs back): set before that import what raycse sets before
# its own (raycse.train.trackers.mlflow_env: no telemetry thread racing the environment)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


# The fast tier (scripts/test.sh --fast): every test that starts no Ray and no server. A test is in the
# full tier alone when it asks for one of these fixtures: the shared Ray, a server, or own_ray (it starts
# a private Ray of its own: a raycse command in a subprocess, or main() running a fit); or when it is
# marked full_tier by hand (the bad-input table past each command's first case; the compiled steps,
# whose cold inductor compiles alone were 80 of the fast tier's 187 s; the GPU check's runs on CPU, 66 s of
# its 408 test-seconds; the step's operator count, 25 s of two profiled subprocesses).
FULL_TIER_FIXTURES = {"ray_cluster", "s3_server", "mlflow_server", "own_ray"}


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help=f"run only the tests that start no Ray and no server (none of the fixtures "
                          f"{', '.join(sorted(FULL_TIER_FIXTURES))})")


@pytest.hookimpl(tryfirst=True)  # (before xdist's own, which reads the groups given here)
def pytest_collection_modifyitems(config, items):
    full = pytest.mark.full_tier
    for item in items:
        if FULL_TIER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(full)
    if config.getoption("--fast"):
        keep = [i for i in items if not i.get_closest_marker("full_tier")]
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("full_tier")])
        items[:] = keep
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = costliest_groups_first(items, recorded_durations())
        for item in items:  # (--dist loadgroup: a test without a group of its own goes with its file)
            if not item.get_closest_marker("xdist_group"):
                item.add_marker(pytest.mark.xdist_group(group_of(item)))


# Under scripts/test.sh's processes (xdist, --dist loadgroup --no-loadscope-reorder) a test file runs in one
# process, and so do the tests marked xdist_group("heavy"): those that start several Rays, a cluster or a search, one
# after another, never beside each other (two of them at once on 2 cores starved each other's Ray:
# 3-4x their time alone, and timeouts, in the CI run of stop 97). The groups are handed out in the order
# collected: the costliest first, so the run does not end with one process on a long group while the
# other has nothing left. A test's cost is its seconds in tests/durations.json, written by a run with
# RAYCSE_TEST_DURATIONS=tests/durations.json; a test not there yet is guessed from its tier.
DURATIONS_ENV = "RAYCSE_TEST_DURATIONS"
GUESS_S = {"full": 15.0, "fast": 0.3}  # (roughly the tiers' mean seconds a test)


def recorded_durations() -> dict[str, float]:
    path = Path(__file__).with_name("durations.json")
    return json.loads(path.read_text()) if path.is_file() else {}


def group_of(item) -> str:
    """The test's xdist group: the one it is marked with, else its file."""
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark is not None else item.nodeid.split("::")[0]


def plain_nodeid(nodeid: str) -> str:
    """``nodeid`` without the ``@group`` xdist adds to it under --dist loadgroup (xdist's own rule)."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def costliest_groups_first(items: list, durations: dict[str, float]) -> list:
    """``items`` with their groups (:func:`group_of`) ordered by total cost, highest first (ties by name);
    a group's tests in their own order. Deterministic, so every process collects the same list, as xdist
    requires."""
    cost: dict[str, float] = {}
    for item in items:
        guess = GUESS_S["full" if item.get_closest_marker("full_tier") else "fast"]
        cost[group_of(item)] = cost.get(group_of(item), 0.0) + durations.get(item.nodeid, guess)
    return sorted(items, key=lambda item: (-cost[group_of(item)], group_of(item)))


def pytest_runtest_logreport(report):
    """With RAYCSE_TEST_DURATIONS set, add up each test's seconds (set-up, call, tear-down: a module
    fixture's start counts for the file's first test); under xdist this runs in the controlling process
    too, for every process's reports."""
    if os.environ.get(DURATIONS_ENV):
        nodeid = plain_nodeid(report.nodeid)
        _seconds[nodeid] = _seconds.get(nodeid, 0.0) + report.duration


_seconds: dict[str, float] = {}


def pytest_sessionfinish(session):
    """Write the added-up seconds to RAYCSE_TEST_DURATIONS (from the controlling process alone), over the
    file's earlier figures for the same tests; tests that are gone (their file, or their function) are dropped."""
    target = os.environ.get(DURATIONS_ENV)
    if not target or not _seconds or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    path = Path(target)
    merged = json.loads(path.read_text()) if path.is_file() else {}
    merged.update({nodeid: round(s, 2) for nodeid, s in _seconds.items()})
    root = Path(session.config.rootpath)
    merged = {k: v for k, v in sorted(merged.items()) if names_a_test(root, k)}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(merged, indent=0) + "\n")
    tmp.replace(path)


def names_a_test(root: Path, nodeid: str) -> bool:
    """``file::test[params]`` or ``file::Class::test[params]`` names a test still defined in that file (a renamed
    test's figure goes)."""
    import re

    path, _, name = nodeid.partition("::")
    name = name.split("[", 1)[0].rsplit("::", 1)[-1]
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def {re.escape(name)}\(", _test_file_text(root / path), re.M) is not None


@functools.lru_cache(maxsize=None)
def _test_file_text(path: Path) -> str:
    """A test file's text, read once for all its tests' names ("" where there is no such file)."""
    return path.read_text() if path.is_file() else ""


def private_env() -> dict:
    """The environment for a raycse command that would start a private Ray of its own (no RAY_ADDRESS:
    not the tests' shared one). A fast test whose command is refused before Ray starts uses it directly."""
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


RAY_TRAIN_POLL = ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # (see pytest_configure)


def ray_sessions() -> set[tuple[str, int]]:
    """The Ray sessions on this machine for this process's environment (RAY_TMPDIR, TMPDIR): (directory
    name, pid of the process whose Ray it is). Ray's own root names the process that started Ray; a
    raycse private Ray's root (raycse.platform.private_ray) names its `ray start`, and the start log (named
    after the raycse process) gives that pid."""
    import tempfile

    from raycse.platform import private_ray

    ray_root = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    private_root = private_ray.root_path()
    owner = {}  # `ray start` pid -> raycse pid
    for log in private_root.glob(f"{private_ray.LOG_PREFIX}*-*.log"):
        try:
            first = log.read_text().split("\n", 1)[0]
        except OSError:
            continue
        if first.startswith(private_ray.PID_LINE):
            owner[int(first.split()[-1])] = int(log.stem[len(private_ray.LOG_PREFIX):].split("-")[0])
    found = set()
    for root in (ray_root, private_root):
        for p in root.glob("session_*_*"):
            if not p.is_symlink():
                pid = int(p.name.rsplit("_", 1)[1])
                found.add((p.name, owner.get(pid, pid) if root == private_root else pid))
    return found


def bare_env(**variables) -> dict:
    """A script's environment built from nothing (the Python under test, the system's PATH, the tests'
    Ray Train poll) plus ``variables``."""
    logs = {"RAYCSE_LOG_DIR": os.environ["RAYCSE_LOG_DIR"]} if "RAYCSE_LOG_DIR" in os.environ else {}
    return {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", RAY_TRAIN_POLL[0]: RAY_TRAIN_POLL[1], **logs,
            **census_env(), **variables}


@pytest.fixture(scope="session")
def own_ray() -> dict:
    """:func:`private_env` for a command that does start its private Ray: asking for it puts a test in
    the full tier."""
    return private_env()


def joining(ray_cluster) -> dict:
    """The environment for a raycse command that joins the tests' shared Ray (``ray_cluster``) instead of
    starting a private one of its own."""
    return {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}


def share_the_cores(config) -> None:
    """With N processes running the tests, each (and what it starts) gets its share of the cores as
    OpenMP threads, unless the user set OMP_NUM_THREADS. torch and faiss otherwise start a thread per core
    in every process, and their OpenMP threads spin at each barrier while another process holds the core:
    the fast tier's kNN and cell-join tests took 15-30x their time alone in the whole suite
    (benchmarks/results/2026-12-07-session77-test-threads.json). Set in the controlling process, before
    xdist starts its workers, so they inherit it before torch is imported."""
    workers = getattr(config.option, "numprocesses", None) or 0
    if os.environ.get("PYTEST_XDIST_WORKER") or not isinstance(workers, int) or workers < 2:
        return
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // workers)))


def pytest_configure(config):
    """raycse's per-machine caches (kernel probe, starting scores) in a directory of this session's own,
    so no run of the tests reads what an earlier one left in the home directory. A hook, not module
    code: Ray workers import this module (test functions refer to its helpers) and made one each.
    Named like raycse's own scratch directories, so a killed session's is removed by the next one."""
    from raycse.platform.staging import private_tempdir

    config.addinivalue_line("markers", "full_tier: starts Ray or a server (set by conftest from the fixtures), or "
                                       "runs a long table of interpreters (marked by hand)")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one of the processes scripts/test.sh runs the suite on
        # A temporary directory of this process's own, for the commands and Rays its tests start: what a
        # test counts there (scratch directories, a killed command's record of its Ray processes) is then
        # its own, not a concurrent test's. A short name: Ray's socket paths under it stay within 107 bytes.
        import tempfile

        config._raycse_tmp = str(private_tempdir("rt-"))
        os.environ["TMPDIR"], tempfile.tempdir = config._raycse_tmp, None
    config._raycse_cache = str(private_tempdir("raycse-test-cache-"))
    os.environ["RAYCSE_CACHE"] = config._raycse_cache
    config._raycse_logs = str(private_tempdir("raycse-test-logs-"))  # the commands' log files (platform.console)
    os.environ["RAYCSE_LOG_DIR"] = config._raycse_logs
    start_census(config)
    share_the_cores(config)
    # Ray Train's controller polls its workers every 2 s (Ray's default), so it sees a fit's end late;
    # every Ray started from here inherits 0.2 s (benchmarks/results/2026-11-30-session48.json)
    os.environ.setdefault(RAY_TRAIN_POLL[0], RAY_TRAIN_POLL[1])


# The fit census (RAYCSE_TEST_FITS=FILE): which tests start an end-to-end Ray Train fit or Tune search, seen at
# Ray's trainer and Tuner by tests/census/fit_census.py, which every Python process of the suite's environment
# imports while the census is on (a .pth file in site-packages for the run); FILE gets {test: its fits}, and the
# run's summary says how many tests fit end to end.
FITS_ENV = "RAYCSE_TEST_FITS"
CENSUS = Path(__file__).with_name("census")
CENSUS_PTH = "zz_raycse_test_fit_census.pth"


def census_env() -> dict:
    """What a script's environment built from nothing needs for the census (nothing when it is off)."""
    keys = ("RAYCSE_TEST_FITS_DIR", "PYTEST_CURRENT_TEST")
    return {k: os.environ[k] for k in keys if os.environ.get(FITS_ENV) and k in os.environ}


def _census_pth() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"]) / CENSUS_PTH


def start_census(config) -> None:
    if not os.environ.get(FITS_ENV):
        return
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # (the controlling process; its workers inherit the folder)
        from raycse.platform.staging import private_tempdir

        config._raycse_fits = str(private_tempdir("raycse-test-fits-"))
        os.environ["RAYCSE_TEST_FITS_DIR"] = config._raycse_fits
        _census_pth().write_text(f"{CENSUS}\nimport fit_census\n")
    import importlib

    sys.path.insert(0, str(CENSUS))
    importlib.import_module("fit_census")  # (this process started before the .pth was there)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The census's record of the test this process runs (tests/census/fit_census.py: a fit's nearest pytest)."""
    if os.environ.get(FITS_ENV) and os.environ.get("RAYCSE_TEST_FITS_DIR"):
        Path(os.environ["RAYCSE_TEST_FITS_DIR"], f"current-{os.getpid()}").write_text(plain_nodeid(item.nodeid))


def census() -> dict[str, list[str]]:
    """test -> its fits and searches, each "Class.fit on the shared Ray" or "... on a Ray of its own" (a raycse
    command's private Ray, a cluster the test started, a job's)."""
    folder = Path(os.environ["RAYCSE_TEST_FITS_DIR"])
    shared = {p.read_text() for p in folder.glob("shared-*.addr")}
    found: dict[str, list[str]] = {}
    for part in folder.glob("*.txt"):
        for line in part.read_text().splitlines():
            test, door, address = line.split("\t")
            where = "the shared Ray" if address in shared else "a Ray of its own"
            found.setdefault(plain_nodeid(test), []).append(f"{door} on {where}")
    return dict(sorted(found.items()))


def pytest_terminal_summary(terminalreporter, config):
    if getattr(config, "_raycse_fits", None):
        found = census()
        Path(os.environ[FITS_ENV]).write_text(json.dumps(found, indent=1) + "\n")
        own = [t for t, fits in found.items() if any(f.endswith("of its own") for f in fits)]
        terminalreporter.write_line(
            f"fit census: {len(found)} tests fit or search end to end ({sum(map(len, found.values()))} fits and "
            f"searches), {len(own)} of them on a Ray of their own; listed in {os.environ[FITS_ENV]}")


def pytest_unconfigure(config):
    import shutil

    if getattr(config, "_raycse_fits", ""):
        _census_pth().unlink(missing_ok=True)
    for path in (getattr(config, "_raycse_cache", ""), getattr(config, "_raycse_tmp", ""),
                 getattr(config, "_raycse_logs", ""), getattr(config, "_raycse_fits", "")):
        if path:
            shutil.rmtree(path, ignore_errors=True)


WORDS = (
    "the a of and to in is was for on with as by at from that this it an be are were his her their "
    "city river music film game team school church war king queen party state north south east west "
    "year time world people book song album league club station road bridge island village county "
    "born died played built made known called named used became won lost founded opened closed "
    "first second new old small large early late great major local national public private former "
    "red blue green black white gold stone water fire light dark summer winter spring autumn"
).split()


def make_tiny_model(path: Path, dropout: float = 0.1, seed: int = 0, hidden: int = 32) -> Path:
    """A 2-layer, 32-wide (``hidden``) BERT with random weights and a vocab written here: offline, seconds."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS)) + list("abcdefghijklmnopqrstuvwxyz.,!?")
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(path / "vocab.txt"), do_lower_case=True)
    # transformers 5 ignores ``vocab_file=``: a tokenizer that knows no word makes every test text [UNK]s
    assert tokenizer.unk_token_id not in tokenizer("the city river")["input_ids"], "tiny tokenizer lost its vocab"
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=128, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_tiny_decoder(path: Path, kind: str = "qwen3", seed: int = 0) -> Path:
    """A 2-layer, 32-wide decoder (Qwen3 or Llama) with random weights, built from its config, with the tiny
    BERT's word-piece vocabulary as its tokenizer (any tokenizer serves last-token pooling): offline, seconds."""
    import torch
    from transformers import AutoModel, LlamaConfig, Qwen3Config

    make_tiny_model(path, seed=seed)  # (its tokenizer files; its weights are replaced below)
    for f in ("model.safetensors", "config.json"):
        (path / f).unlink()
    vocab = len((path / "vocab.txt").read_text().splitlines())
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    config = (Qwen3Config(head_dim=8, **common) if kind == "qwen3" else LlamaConfig(**common))
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(path)
    return path


EVIL = '''
import os
from pathlib import Path
from transformers import BertConfig, BertModel

Path(os.environ["EVIL_MARKER"]).write_text("ran")  # what a hostile model would do at import


class EvilConfig(BertConfig):
    model_type = "evil"


class EvilModel(BertModel):
    config_class = EvilConfig
'''


def make_remote_code_model(path: Path, model_type: str = "evil") -> Path:
    """A tiny BERT whose config.json maps AutoConfig and AutoModel to an ``evil.py`` beside it (as a hub
    repository with custom code does); importing evil.py writes the file named by $EVIL_MARKER."""
    make_tiny_model(path)
    (path / "evil.py").write_text(EVIL)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type=model_type, architectures=["EvilModel"],
                  auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"})
    (path / "config.json").write_text(json.dumps(config))
    return path


def run_registries(alive_only: bool = False) -> list[str]:
    """The ids of the RunRegistry actors this cluster has started (Ray's state API, which lists
    ended actors too), or of those alive now."""
    import ray
    from ray.util.state import list_actors

    filters = [("class_name", "=", "RunRegistry")] + ([("state", "=", "ALIVE")] if alive_only else [])
    actors = list_actors(address=ray.get_runtime_context().gcs_address, limit=10000, filters=filters)
    return sorted(a.actor_id for a in actors)


# Ray forwarding a worker's log (log_to_driver; names nest parentheses), or its raylet's (a disk past Ray's
# threshold: "(raylet) file_system_monitor.cc ...", at any moment of a run)
RAY_FORWARDED = re.compile(r"^(\x1b\[\d+m)?\((\S.*? pid=\d+|raylet(, ip=\S+)?\))")


def build_raycse_wheel(out: Path) -> Path:
    """raycse built as a wheel, offline, from a copy of the checkout (setuptools writes build/ beside
    the sources, which must stay as they are)."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[1]
    src = out / "src"
    shutil.copytree(root, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "outputs", "runs"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(out / "wheels"), str(src)], cwd=out, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (out / "wheels").glob("raycse-*.whl")
    return wheel


def own_lines(stderr: str) -> list[str]:
    """A command's own stderr lines: without the lines Ray forwards from workers of earlier runs in this
    session, which can arrive late, while a later command runs. Split on newlines only: a forwarded
    progress bar is one line whose "\r"-separated updates follow the worker's prefix."""
    return [line for line in stderr.strip().split("\n") if line.strip() and not RAY_FORWARDED.match(line)]


def kill_worker_at(record: Path, step: int, thread, bound_s: float = 240.0):
    """SIGKILL the Train worker whose batch record (``train.record_batches``' rank file ``record``) reaches ``step``
    while ``thread`` (the fit) runs; the step it was killed at, or None where the fit ended first."""
    import json
    import signal
    import time

    deadline = time.time() + bound_s
    while time.time() < deadline and thread.is_alive():
        lines = record.read_text().splitlines() if record.is_file() else []
        if lines and json.loads(lines[-1])["step"] >= step:
            last = json.loads(lines[-1])
            try:
                os.kill(last["pid"], signal.SIGKILL)
            except ProcessLookupError:
                continue
            return last["step"]
        time.sleep(0.05)
    return None


def make_sentences(n: int, seed: int = 0, min_len: int = 4, max_len: int = 14) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_len, max_len))) for _ in range(n)]


def write_stsb(path: Path, n: int = 40, seed: int = 1, gold=None) -> Path:
    """An STS-B file of n pairs of make_sentences(2n, seed): gold scores random in [0, 5], or
    ``gold(sentences)`` (one score per pair) when given."""
    rng = random.Random(seed)
    sents = make_sentences(2 * n, seed=seed)
    scores = ([f"{rng.uniform(0, 5):.3f}" for _ in range(n)] if gold is None
              else [f"{g:.6f}" for g in gold(sents)])
    rows = [f"main-news\tfile\t2012\t{i:04d}\t{scores[i]}\t{sents[2 * i]}\t{sents[2 * i + 1]}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tiny_model_no_dropout(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_bert_nodrop"), dropout=0.0)


@pytest.fixture
def corpus(tmp_path) -> Path:
    p = tmp_path / "corpus.txt"
    p.write_text("\n".join(make_sentences(256)) + "\n")
    return p


@pytest.fixture
def stsb_dev(tmp_path) -> Path:
    return write_stsb(tmp_path / "sts-dev.csv")


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for the session: 4 logical CPUs on 2 cores so a 2-worker run schedules."""
    import ray

    if not ray.is_initialized():
        from raycse.platform.ray_session import start_local_ray

        # the product's own local cluster (raycse.platform.ray_session.ensure_ray), with a smaller object store
        start_local_ray(4, object_store_memory=512 * 2**20, log_to_driver=True, configure_logging=False)
    if os.environ.get("RAYCSE_TEST_FITS_DIR"):  # (the census tells fits on this Ray from fits on a Ray of their own)
        Path(os.environ["RAYCSE_TEST_FITS_DIR"], f"shared-{os.getpid()}.addr").write_text(
            ray.get_runtime_context().gcs_address)
    yield ray
    ray.shutdown()


def make_beir_dir(root):
    """Six topics, a document and a query each; q3 shares its id with a document (ignored as BEIR does),
    q5 has only a score-0 judgement (skipped), q6 is not in the qrels (not evaluated)."""
    (root / "qrels").mkdir(parents=True)
    words = ["city river", "king north", "summer music", "road village", "festival built", "small old"]
    docs = [{"_id": f"d{i}", "title": w.split()[0], "text": f"the {w} was there"} for i, w in enumerate(words)]
    docs.append({"_id": "q3", "title": "", "text": "the road village"})  # the query's own id
    (root / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    queries = [{"_id": f"q{i}", "text": f"the {w}"} for i, w in enumerate(words)] + [{"_id": "q6", "text": "x"}]
    (root / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries) + "\n")
    rows = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t{1 + i % 2}" for i in range(5)] + ["q5\td5\t0"]
    (root / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n")
    return root


@pytest.fixture(scope="session")
def s3_server():
    """An S3-compatible server (moto's server mode) on 127.0.0.1; yields a fresh-bucket factory."""
    import time
    import urllib.request

    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=S3_PORT, verbose=False)
    server.start()
    deadline = time.time() + 30  # bounded wait for the server
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{S3_PORT}/", timeout=2)
            break
        except OSError as exc:
            if getattr(exc, "code", None):  # an HTTP answer: the server is up
                break
            if time.time() > deadline:
                raise RuntimeError(f"S3 server on 127.0.0.1:{S3_PORT} did not start in 30 s") from None
            time.sleep(0.2)
    import boto3

    client = boto3.client("s3")
    count = iter(range(10**6))

    def bucket() -> str:
        name = f"raycse-test-{next(count)}"
        client.create_bucket(Bucket=name)
        return name

    yield bucket
    server.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on 127.0.0.1 (sqlite store in a temp dir), once per session: it
    takes 20-45 s to start on 2 cores."""
    import subprocess
    import sys
    import time
    import urllib.request

    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--default-artifact-root", str(root / "art"),
           "--workers", "1"]
    log = open(root / "server.log", "w")
    # No job runner (MLflow 3's huey consumer, unused here: its store, a dir in /dev/shm per start, was
    # left behind at stop); its own process group, so the teardown stops the uvicorn child as well.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90  # bounded: a server that does not come up fails the tests, it never hangs them
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            stop_process_group(proc, 0)
            raise RuntimeError(f"MLflow server did not start in 90 s: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield url
    stop_process_group(proc, 20)
    log.close()


def seed_hf_datasets_cache(datasets_cache: Path, repo: str, split: str, columns: dict,
                           revision: str = "0" * 40) -> None:
    """What a machine that loaded the hub dataset ``repo`` online leaves in its Hugging Face datasets cache
    (``{org}___{name}/default/0.0.0/{revision}/{name}-{split}.arrow`` and its dataset_info.json), built
    here from ``columns``: ``datasets`` then loads it with the hub switched off."""
    import shutil

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    work = datasets_cache.parent / f"seed-{repo.replace('/', '_')}"
    work.mkdir(parents=True)
    pq.write_table(pa.table(columns), work / "rows.parquet")
    datasets.load_dataset("parquet", data_files={split: str(work / "rows.parquet")}, cache_dir=str(work / "built"))
    (prepared,) = [p for p in (work / "built").glob("parquet/*/0.0.0/*") if p.is_dir()]
    org, name = repo.split("/")
    target = datasets_cache / f"{org}___{name}" / "default" / "0.0.0" / revision
    target.mkdir(parents=True)
    shutil.copy(prepared / "dataset_info.json", target)
    shutil.copy(prepared / f"parquet-{split}.arrow", target / f"{name}-{split}.arrow")


@pytest.fixture
def hub_off(tmp_path, monkeypatch):
    """The hub switched off and an empty Hugging Face datasets cache of this test's own; yields the cache."""
    import datasets.config
    import huggingface_hub.constants

    cache = tmp_path / "hf" / "datasets"
    cache.mkdir(parents=True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


# ----------------------------------------------------------------------------------------------- batches
# An epoch's batch rows as the train workers read them (raycse.train.batches), per rank: what the grouping tests
# look at (the product lays out and reads them in the fit: raycse.train.prepare, raycse.grouping.layout).

def lay_out(corpus, plans: list, world_size: int) -> dict:
    """The planned epochs' batch rows as the workers read them (raycse.train.batches): ``rank{r}`` -> rows in step
    order."""
    import ray

    from raycse.grouping.epochs import layouts
    from raycse.grouping.layout import CorpusTable, epoch_rows

    table = CorpusTable(ray.get(corpus.blocks))
    return {f"rank{r}": [row for p, layout in zip(plans, layouts(plans))
                         for row in epoch_rows(table, layout, r, world_size, p.first_step)]
            for r in range(world_size)}


@dataclass
class EpochBatches:
    rows: dict  # rank{r} -> that rank's batch rows, in step order
    steps: int
    packing: object
    order: object
    info: dict


def epoch_batches(corpus, grouping, batch_size: int, world_size: int, seed: int, epoch: int, first_step: int,
                  vectors=None, max_steps=None) -> EpochBatches:
    """One epoch planned (raycse.grouping.epochs.plan_epoch) and read as the workers read it."""
    from raycse.grouping.epochs import plan_epoch

    plan = plan_epoch(corpus, grouping, batch_size, world_size, seed, epoch, first_step, vectors, max_steps)
    return EpochBatches(lay_out(corpus, [plan], world_size), plan.packing.steps(world_size), plan.packing,
                        plan.order, plan.info)
