"""SIGINT, SIGTERM, SIGHUP and SIGQUIT end a command the same way: one line, exit 128 + the signal's
number (130, 143, 129, 131), nothing half-written.

The CLI installs :func:`install`'s handler, which raises :class:`Interrupted` in the main thread, so
every ``except``/``finally`` on the way out runs (staging directories removed, runs released). Ray
replaces SIGTERM's handler when it starts (``ray.init``: ``sys.exit``) and Ray Train and Tune
replace SIGINT's while they run, so :func:`reinstall` puts raycse's back after Ray starts, a Train fit
runs in a thread of its own (Ray Train leaves the handler alone there), and a Tune search asks
:func:`graceful` for Tune's own orderly stop (its experiment state saved for ``--resume``) and
raises the interruption once the search has stopped.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Optional

# a closed terminal or SSH session (SIGHUP) and Ctrl-\\ (SIGQUIT) end a command as SIGTERM does
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Interrupted(KeyboardInterrupt):
    """The command received ``signum``; ``detail`` says what was kept and how to go on.

    A KeyboardInterrupt: code catching ``Exception`` does not swallow it, and Ray's blocking calls
    (``ray.get``, ``ray.wait``) end at once, as they do only for a KeyboardInterrupt (any other
    exception waited for the call to end). They raise a bare KeyboardInterrupt in its place, which
    :func:`interrupted` turns back into this."""

    def __init__(self, signum: int, detail: str = ""):
        super().__init__(signum, detail)
        self.signum, self.detail = signum, detail

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        name = signal.Signals(self.signum).name
        return f"interrupted ({name}){'; ' + self.detail if self.detail else ''}"


_state = {"installed": False, "graceful": None, "pending": None, "last": None}


def _handler(signum, _frame) -> None:
    _state["last"] = signum
    stop: Optional[Callable] = _state["graceful"]
    if stop is not None and _state["pending"] is None:
        _state["pending"] = signum  # the first signal asks for the orderly stop; a second one raises now
        stop(signum)
        return
    raise Interrupted(signum)


def interrupted(stop: KeyboardInterrupt, detail: str = "") -> Interrupted:
    """``stop`` as an :class:`Interrupted`: itself, or for a bare KeyboardInterrupt (Ray raises one in
    place of raycse's), one for the last signal raycse's handler received (SIGINT if none)."""
    if isinstance(stop, Interrupted):
        return stop
    return Interrupted(_state["last"] or signal.SIGINT, detail)


def install() -> None:
    """raycse's handler for :data:`SIGNALS` (from the main thread; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, _handler)
    _state["installed"] = True


def installed() -> bool:
    return bool(_state["installed"])


def reinstall() -> None:
    """Put raycse's handler back after something replaced it (``ray.init``), if it was installed."""
    if _state["installed"]:
        install()


@contextmanager
def graceful(stop: Callable[[int], None]):
    """Within the block a first signal calls ``stop(signum)`` (an orderly stop of the work in
    progress) instead of raising; :class:`Interrupted` is raised when the block ends."""
    _state["graceful"], _state["pending"] = stop, None
    try:
        yield
    finally:
        signum = _state["pending"]
        _state["graceful"], _state["pending"] = None, None
    if signum is not None:
        raise Interrupted(signum)


@contextmanager
def sigterm_as_interrupt():
    """Around ``ray.init``: its start-up puts in a SIGTERM handler that exits with 15 and no line; a SIGTERM
    then ends the command as raycse's own handler does (its line, 143, its Ray's processes ended)."""
    try:
        yield
    except SystemExit as exc:
        if exc.code == signal.SIGTERM:
            raise Interrupted(signal.SIGTERM) from None
        raise
