"""Joining the cluster a user names (RAY_ADDRESS): the address checked, the wait for it bounded."""

from __future__ import annotations

import logging
from typing import Optional

CONNECT_TIMEOUT_VAR = "RAYCSE_RAY_CONNECT_TIMEOUT_S"
CONNECT_TIMEOUT_S = 60.0


def connect_timeout_s() -> float:
    """How long joining the cluster in RAY_ADDRESS may take (RAYCSE_RAY_CONNECT_TIMEOUT_S, default 60 s)."""
    from raycse.platform.conversion import env_seconds

    return env_seconds(CONNECT_TIMEOUT_VAR, CONNECT_TIMEOUT_S)


def cluster_endpoint(address: str) -> Optional[tuple[str, int]]:
    """(host, port) of a Ray address (``HOST:PORT``, ``[IPv6]:PORT``, ``ray://HOST:PORT``); None for
    ``auto`` and ``local``, which Ray resolves itself. A malformed one, or one carrying credentials, is
    refused in one line (its user-info masked): Ray's own refusal was a traceback that printed it."""
    import re

    from raycse.errors import ConfigError
    from raycse.platform.redact import redact

    if address in ("auto", "local"):
        return None
    shown = redact(address)
    if "@" in address:
        raise ConfigError(f"RAY_ADDRESS {shown} carries credentials, which a Ray address never holds; give "
                          f"HOST:PORT (a cluster with token authentication reads RAY_AUTH_TOKEN)")
    found = re.fullmatch(r"(?:ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+):(\d{1,5})/?", address)
    if not found or not 0 < int(found.group(2)) < 65536:
        raise ConfigError(f"RAY_ADDRESS {shown!r} is not a Ray address; give HOST:PORT (the head's GCS, as "
                          f"`ray start --head` prints it), ray://HOST:PORT or auto")
    return found.group(1).strip("[]"), int(found.group(2))


def join_cluster(address: str) -> None:
    """``ray.init(address)`` within :func:`connect_timeout_s`: the head's port is tried until it answers
    (Ray itself retried an unreachable address for longer than 300 s), then Ray joins with the time left,
    which an alarm bounds. A signal meanwhile is raycse's (Ray's start-up puts its own SIGTERM handler in,
    which exits with 15 and no line)."""
    import signal
    import threading
    import time

    import ray

    from raycse.errors import ResourceError
    from raycse.platform import compat, interrupts
    from raycse.platform.redact import redact

    bound, endpoint = connect_timeout_s(), cluster_endpoint(address)
    deadline = time.monotonic() + bound
    unreachable = ResourceError(f"the Ray cluster at {redact(address)} (RAY_ADDRESS) did not answer within "
                                f"{bound:g} s; check that its head runs and that this machine reaches it, or "
                                f"raise {CONNECT_TIMEOUT_VAR}")
    if endpoint is not None:
        _wait_for_port(*endpoint, deadline, unreachable)
    compat.import_before_log_thread()
    main = threading.current_thread() is threading.main_thread()

    def _timed_out(_signum, _frame):
        raise unreachable

    previous = signal.signal(signal.SIGALRM, _timed_out) if main else None
    if main:
        signal.setitimer(signal.ITIMER_REAL, max(1.0, deadline - time.monotonic()))
    try:
        with interrupts.sigterm_as_interrupt():
            ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
    except ResourceError:  # (the alarm: whatever of the connection was made is let go)
        ray.shutdown()
        raise
    finally:
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _wait_for_port(host: str, port: int, deadline: float, unreachable: Exception) -> None:
    """Return once ``host:port`` accepts a TCP connection; ``unreachable`` at ``deadline``."""
    import socket
    import time

    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise unreachable from None
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
