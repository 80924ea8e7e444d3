"""Issue 86: a hostile user's inputs. A model's own Python never runs unless the user trusts it, a YAML
alias bomb is refused at once, and the other promises of docs/security.md, each on the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import make_remote_code_model, own_lines, private_env, write_stsb

def _raycse(argv: list, cwd: Path, env_extra: dict, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**private_env(), **env_extra}
    return subprocess.run([sys.executable, "-m", "raycse", *argv], cwd=cwd, env=env, input=stdin, text=True,
                          capture_output=True, timeout=300)


@pytest.mark.parametrize("model_type", ["evil", "bert"])
def test_a_model_s_own_code_never_runs_even_when_stdin_says_yes(tmp_path, model_type):
    model = make_remote_code_model(tmp_path / "m_remote", model_type)
    dev = write_stsb(tmp_path / "dev.csv")
    marker = tmp_path / "marker"
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = _raycse(["eval", str(model), "--stsb-dev", str(dev)], tmp_path, {"EVIL_MARKER": str(marker)},
                   stdin="y\ny\ny\n")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not marker.exists()
    assert "Do you wish" not in proc.stdout + proc.stderr
    lines = own_lines(proc.stderr)
    assert len(lines) == 1, lines
    assert "config.json: auto_map AutoConfig -> evil.EvilConfig" in lines[0] and "--trust-remote-code" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_trust_remote_code_is_the_user_s_opt_in(tmp_path):
    model = make_remote_code_model(tmp_path / "m_remote")
    dev = write_stsb(tmp_path / "dev.csv")
    marker = tmp_path / "marker"
    proc = _raycse(["eval", str(model), "--stsb-dev", str(dev), "--trust-remote-code"], tmp_path,
                   {"EVIL_MARKER": str(marker)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert marker.read_text() == "ran"  # the code the user trusted ran, and the model scored
    assert "STSBenchmark" in proc.stdout or "sts" in proc.stdout.lower()


def test_train_refuses_a_model_with_its_own_code_before_ray_starts(tmp_path):
    from raycse.cli import main
    from raycse.config import RunConfig

    model = make_remote_code_model(tmp_path / "m_remote")
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n" * 10)
    assert main(["train", "--model", str(model), "--corpus", str(corpus), "--output", str(tmp_path / "out"),
                 "--stsb-dev", "none"]) == 2
    assert not (tmp_path / "out").exists()
    assert RunConfig().model.trust_remote_code is False


BOMB_LEVELS = 9


def yaml_bomb(levels: int = BOMB_LEVELS, width: int = 9) -> str:
    """The "billion laughs": 1 KB of YAML whose aliases stand for width**levels strings."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["config", "space", "set"])
def test_a_yaml_alias_bomb_is_refused_in_one_line_within_a_second(tmp_path, capsys, where):
    from raycse.cli import main

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(yaml_bomb())
    assert len(bomb.read_bytes()) < 1200
    argv = {"config": ["train", "--config", str(bomb), "--output", str(tmp_path / "out")],
            "space": ["tune", "--space", str(bomb)],
            "set": ["train", "--set", "objective.tau=" + yaml_bomb().replace("\n", ", ").join("{}"),
                    "--output", str(tmp_path / "out")]}[where]
    before = sorted(p.name for p in tmp_path.iterdir())
    start = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - start < 30  # (the command's imports included; the old code took 264-300 s)
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and "aliases expand it past 100,000 values" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_reading_the_bomb_takes_under_a_second(tmp_path):
    from raycse.config import load_yaml
    from raycse.errors import ConfigError

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(yaml_bomb(levels=10))
    start = time.monotonic()
    with pytest.raises(ConfigError, match="aliases expand it past"):
        load_yaml(bomb)
    assert time.monotonic() - start < 1.0


def test_yaml_anchors_a_config_really_uses_still_load(tmp_path):
    from raycse.config import load_yaml

    f = tmp_path / "c.yaml"
    f.write_text("base: &b {lr: 1.0e-5, batch_size: 8}\ntrain: *b\nobjective: {tau: 5e-2}\n")
    assert load_yaml(f) == {"base": {"lr": 1e-5, "batch_size": 8}, "train": {"lr": 1e-5, "batch_size": 8},
                            "objective": {"tau": 0.05}}


def test_the_bomb_s_expanded_size_is_counted_by_a_second_walk():
    """raycse.platform.safe_yaml counts each shared node once; here a plain walk of the composed graph that follows
    every alias (as whatever reads the config would) gives the same count on a small bomb."""
    import yaml

    from raycse.platform.safe_yaml import expanded_size

    node = yaml.compose(yaml_bomb(levels=4, width=3), Loader=yaml.SafeLoader)

    def walk(n):
        if isinstance(n, yaml.SequenceNode):
            return 1 + sum(walk(c) for c in n.value)
        if isinstance(n, yaml.MappingNode):
            return 1 + sum(walk(k) + walk(v) for k, v in n.value)
        return 1

    assert expanded_size(node, 10**9) == walk(node) == 1 + 4 * 1 + (1 + 3) + (1 + 3 * 4) + (1 + 3 * 13) + (1 + 3 * 40)


def _start_train(tmp_path: Path, env_extra: dict) -> subprocess.Popen:
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\nthe dog ran in the park\n" * 40)
    env = {**private_env(), **env_extra}
    return subprocess.Popen([sys.executable, "-m", "raycse", "train", "--corpus", str(corpus), "--stsb-dev", "none",
                             "--output", str(tmp_path / "out")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:  # bound, never listening: a connect is refused at once
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_cluster_is_given_up_within_the_bound_in_one_line(tmp_path):
    port = _closed_port()
    start = time.monotonic()
    proc = _start_train(tmp_path, {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAYCSE_RAY_CONNECT_TIMEOUT_S": "3"})
    out, err = proc.communicate(timeout=120)  # (the old code was still retrying after 300 s)
    assert proc.returncode == 2, err[-2000:]
    assert time.monotonic() - start < 60
    lines = own_lines(err)
    assert lines == [f"raycse: error: the Ray cluster at 127.0.0.1:{port} (RAY_ADDRESS) did not answer within 3 s; "
                     f"check that its head runs and that this machine reaches it, or raise "
                     f"RAYCSE_RAY_CONNECT_TIMEOUT_S"], lines
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("address, says", [
    ("u:SECRET@127.0.0.1:1", "RAY_ADDRESS ***@127.0.0.1:1 carries credentials"),
    ("http://u:SECRET@127.0.0.1:1", "RAY_ADDRESS http://***@127.0.0.1:1 carries credentials"),
    ("127.0.0.1", "RAY_ADDRESS '127.0.0.1' is not a Ray address; give HOST:PORT"),
    ("127.0.0.1:99999", "RAY_ADDRESS '127.0.0.1:99999' is not a Ray address"),
])
def test_a_malformed_ray_address_is_refused_with_its_secret_masked(address, says):
    from raycse.errors import ConfigError
    from raycse.platform.joining import join_cluster

    with pytest.raises(ConfigError) as refused:
        join_cluster(address)  # (before any connection: the address alone decides)
    assert says in str(refused.value) and "SECRET" not in str(refused.value)


def test_the_cli_s_refusal_of_a_credential_in_ray_address_is_one_masked_line(tmp_path):
    proc = _start_train(tmp_path, {"RAY_ADDRESS": "u:SECRET@127.0.0.1:1"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "SECRET" not in out + err
    lines = own_lines(err)
    assert len(lines) == 1 and "RAY_ADDRESS ***@127.0.0.1:1 carries credentials" in lines[0], err[-2000:]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux signals and /proc")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGQUIT", "SIGINT"])
def test_a_signal_while_joining_a_cluster_is_raycse_s_line_and_128_plus_n(tmp_path, signame):
    import signal

    proc = _start_train(tmp_path, {"RAY_ADDRESS": f"127.0.0.1:{_closed_port()}", "RAYCSE_RAY_CONNECT_TIMEOUT_S": "120"})
    line = proc.stdout.readline()  # the driver's first line: the command is past its imports, waiting on the head
    assert "driver on" in line, line
    time.sleep(1.0)
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + getattr(signal, signame), err[-2000:]
    lines = own_lines(err)
    assert len(lines) == 1 and lines[0].startswith(f"raycse: interrupted ({signame}); stopped; nothing was written "
                                                   f"to {tmp_path / 'out'}"), err[-2000:]
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_killed_command_s_staging_folder_is_removed_by_the_next_command(tmp_path):
    """SIGKILL leaves the staging folder of an output; the next raycse command, whatever its output, removes
    it, and a record naming a folder that is not that process's staging removes nothing."""
    import signal

    from raycse.platform.owners import host
    from raycse.platform.staging import STAGING_RECORD_PREFIX, sweep_killed_stagings

    dest = tmp_path / "out"
    code = (f"import os, signal; from pathlib import Path; from raycse.platform import interrupts; "
            f"from raycse.platform.staging import staging_dir; interrupts.install(); s = staging_dir(Path({str(dest)!r})); (s / 'model.safetensors').write_text('x'); print(s, flush=True); "
            f"os.kill(os.getpid(), signal.SIGKILL)")
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env=private_env())
    assert killed.returncode == -signal.SIGKILL
    staging = Path(killed.stdout.strip())
    assert staging.is_dir() and staging.parent == tmp_path
    # a forged record of a dead process that names the user's own folder
    import tempfile

    users = tmp_path / "mine"
    users.mkdir()
    (users / "thesis.tex").write_text("keep me")
    forged = Path(tempfile.gettempdir()) / f"{STAGING_RECORD_PREFIX}{host()}-{killed.args and 999999}-ffffffff.json"
    forged.write_text(json.dumps({"path": str(users), "prefix": ".mine.partial-"}))
    nxt = subprocess.run([sys.executable, "-m", "raycse", "objectives"], capture_output=True, text=True, timeout=120,
                         env=private_env())
    assert nxt.returncode == 0
    assert f"removed {staging}: left by process" in nxt.stderr
    assert not staging.exists()
    assert (users / "thesis.tex").read_text() == "keep me" and not forged.exists()
    assert sweep_killed_stagings() == []


NO_TEXT = ["\u200b\u00a0\u0007", "\u200d\u200e\u2060 \t", "\ufeff\u00ad", "\u3000\u2028\x1f"]


def test_lines_the_tokenizer_makes_nothing_of_are_dropped_and_counted(tiny_model):
    """The tokenizer itself is the second opinion: each line dropped as without text gives it no token."""
    from transformers import AutoTokenizer

    from raycse.data.corpus import CorpusStats, clean_pair, clean_text, has_text

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    for line in NO_TEXT:
        assert tok(line, add_special_tokens=False)["input_ids"] == [], repr(line)
        assert not has_text(line)
    for line in ["a", "é", "日本", "—", "3", "\u200bcity\u200b"]:
        assert has_text(line)
    stats = CorpusStats()
    assert [clean_text(x, 100, stats) for x in NO_TEXT + ["the city"]] == [None] * 4 + ["the city"]
    assert clean_pair(("the city", "\u200b\u00a0"), 100, 1.0, "row 1", stats) is None
    assert stats.empty_dropped == 5 and stats.kept == 1


def test_a_corpus_without_text_or_smaller_than_a_batch_is_refused_before_ray_starts(tmp_path, capsys, tiny_model):
    from conftest import make_sentences, ray_sessions
    from raycse.cli import main

    blank = tmp_path / "blank.txt"
    blank.write_text("".join(NO_TEXT[i % 4] + "\n" for i in range(244)))
    small = tmp_path / "small.txt"
    small.write_text("\n".join(make_sentences(256)) + "\n")
    half = tmp_path / "half.txt"
    half.write_text("".join(f"{s}\n{NO_TEXT[0]}\n" for s in make_sentences(40)))
    sessions = ray_sessions()
    base = ["train", "--model", str(tiny_model), "--stsb-dev", "none", "--output", str(tmp_path / "out")]
    expected = [(["--corpus", str(blank)], "blank.txt has no usable text after cleaning (lines_read=244, kept=0, "
                                           "empty_dropped=244"),
                (["--corpus", str(small), "--num-workers", "64"],
                 "the corpus has 256 usable example(s), fewer than one global batch (64 x 64 worker(s))"),
                (["--corpus", str(half), "--batch-size", "64"],
                 "the corpus has 40 usable example(s) (40 line(s) without text dropped), fewer than one global batch")]
    for extra, says in expected:
        start = time.monotonic()
        assert main(base + extra) == 2
        assert time.monotonic() - start < 30  # (was 156 s and two Ray starts)
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and says in err[0], err
    assert ray_sessions() == sessions and not (tmp_path / "out").exists()


def test_a_corpus_directory_s_fifos_sockets_and_link_loops_are_skipped_and_counted(tmp_path, capsys):
    import os
    import socket

    from raycse.data.dataset import resolve_sources
    from raycse.errors import DataError

    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("the city\n")
    os.mkfifo(d / "pipe.txt")  # a read of it blocks until someone writes
    (d / "loop.txt").symlink_to(d / "loop.txt")
    (d / "dangling.txt").symlink_to(tmp_path / "nowhere")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(d / "sock"))
        assert resolve_sources(str(d)) == [str(d / "a.txt")]
    assert "skipped 4 entries that are not a regular file" in capsys.readouterr().out
    with pytest.raises(DataError, match="pipe.txt is not a regular file"):
        resolve_sources(str(d / "pipe.txt"))
    os.unlink(d / "a.txt")
    with pytest.raises(DataError, match="has no files"):
        resolve_sources(str(d))


def test_a_corpus_path_that_is_not_utf8_is_one_line_naming_it(tmp_path, capsys):
    import os

    from raycse.cli import main

    name = os.fsdecode(b"corpus-\xe9t\xe9.txt")  # Latin-1 bytes: Python keeps them as surrogates
    (tmp_path / name).write_text("the city by the river\n" * 100)
    for corpus in (str(tmp_path / name), str(tmp_path)):
        assert main(["train", "--corpus", corpus, "--stsb-dev", "none", "--output", str(tmp_path / "out")]) == 2
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and "corpus-\\xe9t\\xe9.txt is not valid UTF-8" in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_trusted_run_s_card_says_its_model_runs_code_of_its_own():
    import dataclasses

    from raycse.config import RunConfig
    from raycse.model.card import model_card

    run = RunConfig()
    run.model.trust_remote_code = True
    summary = {"score_key": "stsb_dev", "best": None, "last": {"step": 2}}
    trusted = model_card(dataclasses.asdict(run), summary, "out/model")
    assert "**Runs code of its own.**" in trusted and "trust_remote_code=True" in trusted
    run.model.trust_remote_code = False
    assert "Runs code of its own" not in model_card(dataclasses.asdict(run), summary, "out/model")


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan"])
def test_a_bad_connect_bound_is_one_line_naming_the_variable(monkeypatch, value):
    from raycse.errors import ConfigError
    from raycse.platform.joining import join_cluster

    monkeypatch.setenv("RAYCSE_RAY_CONNECT_TIMEOUT_S", value)
    with pytest.raises(ConfigError, match=f"RAYCSE_RAY_CONNECT_TIMEOUT_S must be a number of seconds > 0, got '{value}'"):
        join_cluster("127.0.0.1:1")


# ----------------------------------------------------------------------------- the private Ray's ports and root (item 8)
RAY_DEFAULT_PORTS = {6379, 8265, 52365, 52366, 44217, 44227, 10001}


def test_the_private_ray_start_line_names_every_port_free_and_none_of_rays_defaults(tmp_path):
    from raycse.platform import private_ray

    ports = private_ray.free_ports(len(private_ray.PORT_OPTIONS) + len(private_ray.PORT_VARIABLES))
    assert len(set(ports)) == len(ports) and not set(ports) & RAY_DEFAULT_PORTS
    command = private_ray.start_command(ports, tmp_path, 2, {"num_workers_soft_limit": 22},
                                        {"object_store_memory": 1 << 30})
    given = dict(a.split("=", 1) for a in command if a.startswith("--") and "=" in a)
    assert {o: int(given[o]) for o in private_ray.PORT_OPTIONS} == dict(zip(private_ray.PORT_OPTIONS, ports))
    assert given["--dashboard-host"] == "127.0.0.1" and given["--temp-dir"] == str(tmp_path)
    assert given["--num-cpus"] == "2" and given["--object-store-memory"] == str(1 << 30)
    assert "start" in command and "--head" in command and "--block" in command
    assert given["--min-worker-port"] == given["--max-worker-port"] == "0"  # (the system's choice: the test below)


def test_a_private_rays_driver_and_workers_listen_on_ports_the_system_chose(ray_cluster):
    """Ray's raylet hands its workers and drivers ports 10002, 10003, ... in turn (after a check that each is free, then
    the bind): two private Rays started at once (two raycse commands on one machine, or the suite's two processes)
    handed both their drivers 10002, and the second to bind it died in Ray's own check (Ray 2.55, scripts/floors.sh).
    The suite's Ray is the product's private Ray (tests/conftest.py): its driver, this process, and a worker of it
    listen only on ports the system chose (its ephemeral range here, far above Ray's 10002-19999)."""
    import psutil

    def listening() -> list:  # (this process's: the driver's here, the actor's there)
        return [c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN]

    @ray_cluster.remote(num_cpus=0)
    class Listener:
        def ports(self) -> list:
            return listening()

    actor = Listener.remote()
    try:
        worker = ray_cluster.get(actor.ports.remote(), timeout=120)
    finally:
        ray_cluster.kill(actor)
    driver = listening()
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert worker and driver and min(worker + driver) >= low, (driver, worker)


def test_the_private_ray_root_leaves_room_for_rays_socket_paths(monkeypatch):
    """Under the tests' TMPDIR (/tmp/rt-<tag>-<pid>-<random>) the root's sockets were 114 bytes: Ray's
    dashboard did not start and `ray start` waited 60 s for it, every start."""
    import tempfile

    from raycse.platform import private_ray

    uid = os.getuid()
    short = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    try:
        monkeypatch.setenv("RAY_TMPDIR", short)
        assert private_ray.root_path() == Path(short) / f"raycse-{uid}"
        monkeypatch.setenv("RAY_TMPDIR", "/tmp/" + "x" * 40)
        assert private_ray.root_path() == Path("/tmp") / f"raycse-{uid}"
        longest = "/session_2026-12-02_02-16-28_728212_4194304/sockets/dash_MetricsHead"
        for base in (short, "/tmp/rt-0a7c9cdf-10898-nx1dfjru", "/tmp/" + "x" * 40):
            monkeypatch.setenv("RAY_TMPDIR", base)
            assert len(str(private_ray.root_path()) + longest) <= 107
    finally:
        os.rmdir(short)


def test_a_private_ray_root_that_is_a_symlink_or_a_bad_bound_is_refused_before_anything_starts(tmp_path, monkeypatch):
    import tempfile

    from raycse.errors import ConfigError, ResourceError
    from raycse.platform import private_ray
    from raycse.platform.processes import descendants

    short = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    try:
        monkeypatch.setenv("RAY_TMPDIR", str(short))
        elsewhere = tmp_path / "someone-elses"
        elsewhere.mkdir()
        (short / f"raycse-{os.getuid()}").symlink_to(elsewhere)
        before = descendants(os.getpid())
        # this process's running private Ray (the suite's shared one, under scripts/test.sh) is not stopped by
        # a refusal: it was, and every later test of the process found no Ray
        running = object()
        monkeypatch.setitem(private_ray._current, "ray", running)
        with pytest.raises(ResourceError, match="is not a directory of this user's own"):
            private_ray.start(1, {})
        monkeypatch.setenv("RAYCSE_RAY_START_TIMEOUT_S", "0")
        with pytest.raises(ConfigError, match="RAYCSE_RAY_START_TIMEOUT_S must be a number of seconds > 0"):
            private_ray.start(1, {})
        assert not set(descendants(os.getpid())) - set(before) and not list(elsewhere.iterdir())  # (none started)
        assert private_ray._current["ray"] is running
    finally:
        (short / f"raycse-{os.getuid()}").unlink()
        short.rmdir()


STOP_PROBE = """
import sys, time, ray
from raycse.platform import private_ray, processes, ray_session
processes.END_GRACE_S = float(sys.argv[1])  # (the keeper's grace, read as the private Ray starts)
ray_session.ensure_ray(1)
assert ray.data.range(100).map_batches(lambda b: b).count() == 100  # (as a corpus is prepared)
log = private_ray._current["ray"].log
started = time.monotonic()
left = private_ray.stop()
print("stopped in", round(time.monotonic() - started, 2), "left", left, "log", log)
"""


def test_a_private_ray_stops_in_order_within_the_grace_not_by_sigkill(tmp_path, own_ray):
    """Ray 2.60's node drains on SIGTERM for up to 30 s, until its leases come back; after a Ray Data
    execution it never got them back, so every command's private Ray waited out the keeper's 5 s grace
    and was SIGKILLed (each command 3-4 s longer than it needed, and Ray never stopped in order).
    The keeper's grace is 12 s here: beside the suite's other process on a 2-core AVX2 box, Ray's ordered
    stop itself took past 5 s (SIGKILLed in the whole suite of sessions 75 and 76), while a drain waiting
    for its leases still outlasts it."""
    grace = 12.0  # (within stop()'s own wait for the keeper, processes.END_BOUND_S: 15 s)
    done = subprocess.run([sys.executable, "-c", STOP_PROBE, str(grace)], cwd=tmp_path, env=own_ray, text=True,
                          capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("stopped in"))
    seconds, left, log = float(line.split()[2]), line.split(" left ")[1].split(" log ")[0], line.split(" log ")[1]
    ended = [x for x in Path(log).read_text().splitlines() if x.startswith("ray start ended:")]
    assert ended == ["ray start ended: 1"], ended  # (Ray's SIGTERM handler ends its node, then exits 1; -9: killed)
    # In order is the line above (the keeper SIGKILLs only once its grace is out). The whole stop also
    # counts the keeper's noticing (a 1 s poll) and the sweep after it.
    assert seconds < grace + 5 and left == "[]", line
