"""A private local Ray on free ports: Ray's public ``ray start --head --block`` in a child process.

Why not ``ray.init(address="local")``: it gives the node's dashboard agent Ray's default port 52365
(``ray.init`` has no parameter for it) and the dashboard's and autoscaler's metrics 44227 and 44217.
A user's own ``ray start --head`` beside a running raycse command came up without a job agent, and
every ``ray job submit`` then failed with "No available agent". ``ray start`` takes each port; every
one is chosen free here (GCS, dashboard, agent HTTP and gRPC, runtime-env agent, metrics, Ray
Client), the dashboard listens on 127.0.0.1 only, and the temporary root is this user's own
(``ray start`` writes there the address file that ``ray.init()`` and ``RAY_ADDRESS=auto`` follow:
a user's ``/tmp/ray`` keeps naming the user's own cluster).

The child ends with the command: :func:`stop` at exit and after a signal, Linux's parent-death
signal if the command is killed (its reaper then ends Ray's process group), and
:func:`raycse.processes.sweep_killed_rays` as the last resort. Ports are picked free and given to
Ray at once; one taken in between fails that start, which is tried again (``ensure_ray``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
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
LOG_PREFIX = "raycse-start-"  # {raycse pid}-{ray start pid}.log, beside the session directories

# `ray start` options per port; Ray's metrics servers of the head read environment variables instead
PORT_OPTIONS = ("--port", "--dashboard-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                "--runtime-env-agent-port", "--metrics-export-port", "--ray-client-server-port")
PORT_VARIABLES = ("DASHBOARD_METRIC_PORT", "AUTOSCALER_METRIC_PORT")


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


def temp_root() -> Path:
    """This user's root for private Rays (RAY_TMPDIR or the temporary directory, as Ray's own; Ray
    makes it 0777 as it does its own); refused in one line if it is a symlink or not this user's own
    (someone else's could be read or replaced under the running Ray)."""
    from raycse.errors import ResourceError

    root = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / f"raycse-ray-{os.getuid()}"
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
    """The ``ray start`` command line (the interpreter running raycse: no PATH lookup)."""
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
               "--dashboard-host=127.0.0.1", f"--temp-dir={root}",
               f"--system-config={json.dumps(system_config)}"]
    command += [f"{option}={port}" for option, port in zip(PORT_OPTIONS, ports)]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    for name, value in node_options.items():
        value = json.dumps(value) if isinstance(value, dict) else value
        command.append(f"--{name.replace('_', '-')}={value}")
    return command


def _die_with_parent() -> None:
    """In the child, before ``ray start`` runs: SIGTERM it when the thread that started it ends
    (the command killed by SIGKILL or the OOM killer); Ray's reaper then ends its process group."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _spawn(command: list[str], env: dict, log: IO) -> subprocess.Popen:
    # Linux ties the parent-death signal to the starting thread: set only from the main thread, whose
    # end is the process's (a thread of a Python API caller may end while its process keeps Ray)
    watch = threading.current_thread() is threading.main_thread() and sys.platform == "linux"
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_die_with_parent if watch else None)


def _log_tail(path: Path, lines: int = 1) -> str:
    try:
        text = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])


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
                               f"{_log_tail(private.log)} (whole log: {private.log})")
        if time.monotonic() > deadline:
            raise StartTimedOut(f"`ray start` did not bring this command's private Ray up within {timeout_s:g} s "
                                f"(set by {START_TIMEOUT_VAR}; log: {private.log})")
        time.sleep(0.1)


def start(num_cpus: Optional[int], system_config: dict, node_options: Optional[dict] = None) -> PrivateRay:
    """Start the private Ray and return once its node is up; what started is ended on any failure
    (an interrupt included). One already started by this process is stopped first."""
    from raycse.conversion import env_seconds

    stop()
    timeout_s = env_seconds(START_TIMEOUT_VAR, START_TIMEOUT_S)
    root = temp_root()
    ports = free_ports(len(PORT_OPTIONS) + len(PORT_VARIABLES))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({name: str(port) for name, port in zip(PORT_VARIABLES, ports[len(PORT_OPTIONS):])})
    command = start_command(ports, root, num_cpus, system_config, node_options or {})
    log_path = root / f"{LOG_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.log"
    with open(log_path, "w") as log:
        process = _spawn(command, env, log)
    named = root / f"{LOG_PREFIX}{os.getpid()}-{process.pid}.log"  # (tells whose each Ray session is)
    log_path.rename(named)
    private = PrivateRay(process, _start_time(process.pid), ports[0], ports[1], named)
    _current["ray"] = private
    try:
        _wait_ready(private, timeout_s)
    except BaseException:
        stop()
        raise
    return private


def _start_time(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(text[text.rindex(")") + 2:].split()[19])


def current() -> Optional[PrivateRay]:
    """The private Ray this process started and has not stopped, if any."""
    return _current.get("ray")


def stop() -> list[int]:
    """End this process's private Ray (``ray start`` and every process below it) within
    :data:`raycse.processes.END_BOUND_S`; the pids still running then. The driver is disconnected
    first, if connected. Nothing to do: []."""
    from raycse import processes

    private = _current.pop("ray", None)
    if private is None:
        return []
    import ray

    if ray.is_initialized() and ray.get_runtime_context().gcs_address.endswith(f":{private.gcs_port}"):
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - the processes are ended below either way
            pass
    procs = [(private.process.pid, private.started)]
    left = processes.end(procs)
    try:
        private.process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        pass
    return left
