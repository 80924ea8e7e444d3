"""A private local Ray on free ports: Ray's public ``ray start --head --block`` in a child process.

Why not ``ray.init(address="local")``: it gives the node's dashboard agent Ray's default port 52365
(``ray.init`` has no parameter for it) and the dashboard's and autoscaler's metrics 44227 and 44217.
A user's own ``ray start --head`` beside a running raycse command came up without a job agent, and
every ``ray job submit`` then failed with "No available agent". ``ray start`` takes each port; every
one is chosen free here (GCS, dashboard, agent HTTP and gRPC, runtime-env agent, metrics, Ray
Client), the dashboard listens on 127.0.0.1 only, and the temporary root is this user's own
(``ray start`` writes there the address file that ``ray.init()`` and ``RAY_ADDRESS=auto`` follow:
a user's ``/tmp/ray`` keeps naming the user's own cluster).

The ``ray start`` runs under a keeper (:data:`KEEPER`, a few lines of the standard library in a
process of its own) that holds a pipe from the command: when the command closes it (:func:`stop`,
at exit or after a signal) or dies (SIGKILL, the OOM killer: the pipe closes with it, from any
thread), the keeper stops Ray's process group, SIGTERM then SIGKILL, within a bound.
:func:`raycse.platform.processes.sweep_killed_rays` is the last resort (the keeper itself killed). Ports are
picked free and given to Ray at once; one taken in between fails that start, which is tried again
(``ensure_ray``).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional

START_TIMEOUT_VAR = "RAYCSE_RAY_START_TIMEOUT_S"
START_TIMEOUT_S = 120.0  # Ray's own waits inside `ray start` are 30 s each
READY_LINE = "Ray runtime started"  # what `ray start` prints once its node is up (2.x)
TIMED_OUT = "timed out during startup"  # Ray's error when its node did not come up in its 30 s
PORT_TAKEN = "address already in use"
LOG_PREFIX = "raycse-start-"  # {raycse pid}-{keeper pid}.log, beside the session directories

# `ray start` options per port; Ray's metrics servers of the head read environment variables instead
PORT_OPTIONS = ("--port", "--dashboard-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                "--runtime-env-agent-port", "--metrics-export-port", "--ray-client-server-port")
PORT_VARIABLES = ("DASHBOARD_METRIC_PORT", "AUTOSCALER_METRIC_PORT")
# Each worker's and the driver's own port: left to the system when they bind (Ray's "random ports"). By default
# every raylet hands out 10002, 10003, ... after checking each is free: two Rays started at once both handed
# 10002 to their drivers, and the one that bound it second died in Ray's check ("Failed to start the grpc server").
WORKER_PORTS = ("--min-worker-port=0", "--max-worker-port=0")


class StartTimedOut(RuntimeError):
    """Ray's node did not come up in time (a loaded machine), or a port chosen free was taken before
    Ray bound it: worth another try."""


@dataclass
class PrivateRay:
    process: subprocess.Popen
    started: int  # the process's start time (clock ticks): a reused pid is not it
    gcs_port: int
    dashboard_port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"


_current: dict = {}


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (the sockets are held until all are chosen)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


# Ray's longest Unix socket path below its root ("/session_<date>_<time>_<pid>/sockets/dash_MetricsHead",
# a 7-digit pid) with room to spare, and the longest such path Linux takes (AF_UNIX: 108 bytes with its NUL)
RAY_SOCKET_TAIL = 72
AF_UNIX_PATH_MAX = 107


def root_path() -> Path:
    """Where this user's private Rays live: ``raycse-UID`` in RAY_TMPDIR or the temporary directory (as
    Ray's own root), or in /tmp where that one's path is too long for Ray's sockets (the dashboard did not
    start, and `ray start` waited 60 s for it)."""
    name = f"raycse-{os.getuid()}"
    base = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir())
    return base / name if len(str(base / name)) + RAY_SOCKET_TAIL <= AF_UNIX_PATH_MAX else Path("/tmp") / name


def temp_root() -> Path:
    """:func:`root_path`, made 0700 if new (Ray then makes it 0777, as it does its own root); refused in
    one line if it is a symlink or not this user's own (someone else's could be read or replaced under
    the running Ray)."""
    from raycse.errors import ResourceError

    root = root_path()
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(root)
    except OSError as exc:
        raise ResourceError(f"cannot make the private Ray's directory {root}: {exc.strerror}; set RAY_TMPDIR to a "
                            f"writable directory") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ResourceError(f"{root} is not a directory of this user's own (a symlink, or another user's): remove it, "
                            f"or set RAY_TMPDIR to a directory of your own")
    return root


def start_command(ports: list[int], root: Path, num_cpus: Optional[int], system_config: dict,
                  node_options: dict) -> list[str]:
    """The ``ray start`` command line: Ray's console script beside the interpreter running raycse (no
    PATH lookup: an unactivated venv's), else that interpreter running the module behind it."""
    script = Path(sys.executable).parent / "ray"
    ray = [str(script)] if script.is_file() else [sys.executable, "-m", "ray.scripts.scripts"]
    command = [*ray, "start", "--head", "--block",
               "--dashboard-host=127.0.0.1", f"--temp-dir={root}",
               f"--system-config={json.dumps(system_config)}", *WORKER_PORTS]
    command += [f"{option}={port}" for option, port in zip(PORT_OPTIONS, ports)]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    for name, value in node_options.items():
        value = json.dumps(value) if isinstance(value, dict) else value
        command.append(f"--{name.replace('_', '-')}={value}")
    return command


# The keeper: starts `ray start` (argv) in a session of its own and says its pid on the log. When its
# stdin (the pipe from the raycse command) reaches EOF: SIGTERM to `ray start` (it stops its node in
# order, faster than a SIGTERM to every process at once), then SIGKILL to what is left of its process
# group, whatever happened. The terminal's signals (Ctrl-C reaches the whole foreground group) are the
# command's to act on: a Tune search stops in order on SIGINT, with its Ray still up; the keeper
# ignores them.
KEEPER = """
import os, select, signal, subprocess, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, signal.SIG_IGN)
ray = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, start_new_session=True,
                       preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (2, 15, 1, 3)])
print("ray start pid:", ray.pid, flush=True)
while ray.poll() is None:
    if select.select([0], [], [], 1.0)[0] and not os.read(0, 4096):
        break
for kill, sig, wait_s in ((os.kill, signal.SIGTERM, float(sys.argv[1])), (os.killpg, signal.SIGKILL, 10.0)):
    try:
        kill(ray.pid, sig)
    except ProcessLookupError:
        pass
    until = time.monotonic() + wait_s
    while ray.poll() is None and time.monotonic() < until:
        time.sleep(0.05)
print("ray start ended:", ray.returncode, flush=True)
sys.exit(ray.returncode if ray.returncode is not None else 1)
"""
PID_LINE = "ray start pid:"
ENDED_LINE = "ray start ended:"  # then its exit status: negative, the signal that ended it


def _spawn(command: list[str], env: dict, log: IO) -> subprocess.Popen:
    from raycse.platform.processes import END_GRACE_S

    return subprocess.Popen([sys.executable, "-c", KEEPER, str(END_GRACE_S), *command], env=env,
                            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)


def _last_line(path: Path) -> str:
    try:
        text = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return text[-1] if text else ""


def _wait_ready(private: PrivateRay, timeout_s: float) -> None:
    """Until ``ray start`` says its node is up; its exit or the bound first is the error."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if READY_LINE in private.log.read_text(errors="replace"):
                return
        except OSError:
            pass
        code = private.process.poll()
        if code is not None:
            text = private.log.read_text(errors="replace") if private.log.exists() else ""
            if TIMED_OUT in text:
                raise StartTimedOut(f"Ray's node did not start within Ray's 30 s wait ({private.log})")
            if PORT_TAKEN in text.lower():
                raise StartTimedOut(f"a port chosen for this command's private Ray was taken before Ray bound it "
                                    f"({private.log})")
            raise RuntimeError(f"`ray start` for this command's private Ray exited with {code}: "
                               f"{_last_line(private.log)} (whole log: {private.log})")
        if time.monotonic() > deadline:
            raise StartTimedOut(f"`ray start` did not bring this command's private Ray up within {timeout_s:g} s "
                                f"(set by {START_TIMEOUT_VAR}; log: {private.log})")
        time.sleep(0.1)


def start(num_cpus: Optional[int], system_config: dict, node_options: Optional[dict] = None) -> PrivateRay:
    """Start the private Ray and return once its node is up; what started is ended on any failure
    (an interrupt included). One already started by this process is stopped first, once the settings
    are found good."""
    from raycse.platform import compat, processes
    from raycse.platform.conversion import env_seconds

    timeout_s = env_seconds(START_TIMEOUT_VAR, START_TIMEOUT_S)
    root = temp_root()
    stop()  # (after the refusals above: a bad setting leaves a running private Ray alone)
    ports = free_ports(len(PORT_OPTIONS) + len(PORT_VARIABLES))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({name: str(port) for name, port in zip(PORT_VARIABLES, ports[len(PORT_OPTIONS):])})
    env.update(compat.PRIVATE_RAY_NODE_ENV)
    command = start_command(ports, root, num_cpus, system_config, node_options or {})
    log_path = root / f"{LOG_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.log"
    with open(log_path, "w") as log:
        process = _spawn(command, env, log)
    named = root / f"{LOG_PREFIX}{os.getpid()}-{process.pid}.log"  # (tells whose each Ray session is)
    log_path.rename(named)
    private = PrivateRay(process, processes.start_time(process.pid), ports[0], ports[1], named)
    _current["ray"] = private
    try:
        _wait_ready(private, timeout_s)
    except BaseException:
        stop()
        raise
    return private


def stop() -> list[int]:
    """End this process's private Ray within :data:`raycse.platform.processes.END_BOUND_S`: the driver
    disconnected (if connected to it), the keeper's pipe closed (it stops Ray's process group), and
    whatever is still running below the keeper then ended. Returns the pids still running after
    that; nothing to stop: []."""
    from raycse.platform import processes

    private = _current.pop("ray", None)
    if private is None:
        return []
    import ray

    if ray.is_initialized() and ray.get_runtime_context().gcs_address.endswith(f":{private.gcs_port}"):
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - the processes are ended below either way
            pass
    procs = [(private.process.pid, private.started)] + processes.descendants(private.process.pid)
    try:
        private.process.stdin.close()
        private.process.wait(timeout=processes.END_BOUND_S)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return processes.end(procs, grace_s=0.5)
