"""A long command's console (`raycse train`, `raycse tune`): raycse's own lines, warnings,
errors, tracebacks and the command's results on the terminal, and for train one progress bar there (steps,
loss, examples/s, ETA) when it is a terminal; every line, Ray's INFO lines and the workers'
weight-loading bars among them, in the command's log file, whose path is said once. ``--verbose`` puts
everything on the terminal as it comes, without a bar.

It works on the text of the driver's streams, as Ray forwards the workers' lines there (Ray looks
``sys.stdout`` / ``sys.stderr`` up at each write), so it needs no Ray API, public or private."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from raycse.errors import RaycseError
from raycse.platform.redact import StreamWrapper, redact

# Rank 0's step line, written by the training loop and read back here for the bar: one definition.
STEP_FORMAT = "[raycse] step {step}/{total} ({pct:.0f}%) epoch {epoch} loss {loss:.4f} lr {lr:.2e} {speed:.1f} examples/s"
STEP_PATTERN = re.compile(r"\[raycse\] step (?P<step>\d+)/(?P<total>\d+) \(\d+%\) epoch (?P<epoch>\d+) "
                          r"loss (?P<loss>\S+) lr (?P<lr>\S+) (?P<speed>\S+) examples/s")
# A line for people: raycse's own, or one that reports a problem. (Ray's INFO lines carry no level.)
FOR_PEOPLE = re.compile(r"\[raycse\]|^raycse:|warn|error|exception|traceback|fatal|abort|killed|fail|denied",
                        re.IGNORECASE)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RAY_PREFIX = re.compile(r"^\((?P<who>[^)]*)\)\s?")  # "(RayTrainWorker pid=12) " as Ray forwards a line
TRACEBACK_GO_ON = re.compile(r"^(\s|Traceback|During handling|The above exception|$)")


def step_line(step: int, total: int, epoch: int, loss: float, lr: float, speed: float) -> str:
    return STEP_FORMAT.format(step=step, total=total, pct=100 * step / max(total, 1), epoch=epoch, loss=loss,
                              lr=lr, speed=speed)


def log_dir() -> Path:
    """Where commands' log files go: RAYCSE_LOG_DIR, else $XDG_STATE_HOME/raycse/logs (~/.local/state)."""
    if os.environ.get("RAYCSE_LOG_DIR"):
        return Path(os.environ["RAYCSE_LOG_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "raycse" / "logs"


def new_log_path(command: str) -> Path:
    """A file of this process's own (the time and pid in its name): no run writes into another's log."""
    return log_dir() / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


class LogFile:
    """The command's log, opened at the first line the terminal does not show (the lines before it kept
    for it). Its path is said once the workers speak (:meth:`say_path`): a command refused or
    interrupted before that stays one line, and its file is removed (:meth:`discard`)."""

    def __init__(self, path: Path, say):
        self.path, self._say, self._file, self._early, self.failed, self.said = path, say, None, [], False, False

    def write(self, line: str) -> None:
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        elif not self.failed:
            self._early.append(line)

    def open(self) -> bool:
        """True once the file is open; False (said once) where the directory cannot be written."""
        if self._file is None and not self.failed:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "x", encoding="utf-8", errors="replace")
            except OSError as exc:
                self.failed = True
                self._say(f"[raycse] no log file ({exc.strerror}: {self.path.parent}); every line shows here "
                          f"(RAYCSE_LOG_DIR=DIR moves it)")
                return False
            for line in self._early:
                self.write(line)
            self._early = []
        return self._file is not None

    def say_path(self) -> None:
        if self._file is not None and not self.said:
            self.said = True
            self._say(f"[raycse] log: {self.path} (Ray's and the workers' other lines; --verbose shows them here)")

    def discard(self) -> None:
        """This command's own file, never named to the user, removed."""
        if self._file is not None and not self.said:
            self._file.close()
            self._file = None
            self.path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Console:
    """The routing of complete lines: all to ``log`` (redacted, without colours); back to the stream they
    came from those for people (the driver's own stdout, the command's results, always); step lines into
    a tqdm bar on ``bar_stream`` when ``bar`` (a terminal). Where no log file can be written, every line
    shows."""

    def __init__(self, bar_stream, log: LogFile, bar: bool):
        self.bar_stream, self.log, self.use_bar = bar_stream, log, bar
        self.bar = None
        # Ray forwards the workers' lines from a thread of its own while the main thread writes: one at a
        # time (reentrant: a signal's handler may write from inside a write)
        self.lock = threading.RLock()
        self.in_traceback: set = set()  # the senders whose traceback is being shown

    def line(self, text: str, out, results: bool = False, transient: bool = False) -> None:
        """One line without its end, written to ``out`` (``results``: the command's stdout); ``transient``:
        a progress bar's redraw (ended by \\r), not logged."""
        plain = ANSI.sub("", text)
        if not transient and plain.strip():
            self.log.write(redact(plain))
        prefix = RAY_PREFIX.match(plain)
        who, message = (prefix["who"], plain[prefix.end():]) if prefix else ("", plain)
        step = STEP_PATTERN.search(message) if self.use_bar else None
        if step:
            self.log.open()
            self.log.say_path()
            self._advance(step)
        elif (results and not prefix) or not transient and self._for_people(who, message):
            if prefix:  # the workers speak: the run is under way
                self.log.say_path()
            self._show(text, out, transient)
        elif not self.log.open():  # hidden, where no file can hold it: shown, as without a console
            self._show(text, out, transient)

    def _for_people(self, who: str, message: str) -> bool:
        if who in self.in_traceback:
            if not TRACEBACK_GO_ON.match(message):
                self.in_traceback.discard(who)  # the exception's own line ends it, and is shown
            return True
        if "Traceback (most recent call last)" in message:
            self.in_traceback.add(who)
            return True
        return bool(FOR_PEOPLE.search(message))

    def _show(self, text: str, out, transient: bool) -> None:
        if self.bar is not None:
            self.bar.clear()
        if not _is_terminal(out):  # (Ray colours its workers' prefixes whatever the stream: not in a file or CI log)
            text = ANSI.sub("", text)
        out.write(text + ("\r" if transient else "\n"))
        out.flush()
        if self.bar is not None:
            self.bar.refresh()

    def _advance(self, m) -> None:
        step, total = int(m["step"]), int(m["total"])
        if self.bar is None:
            from tqdm.auto import tqdm

            # (a resumed fit's first report starts the bar where the fit stood, so the ETA counts this run)
            self.bar = tqdm(total=total, initial=step, unit="step", file=self.bar_stream, dynamic_ncols=True,
                            desc="training", leave=True)
        elif step >= self.bar.n:
            self.bar.update(step - self.bar.n)
        else:  # a worker group restarted from an earlier checkpoint
            self.bar.reset(total=total)
            self.bar.update(step)
        self.bar.set_postfix_str(f"epoch {m['epoch']}, loss {m['loss']}, {m['speed']} examples/s", refresh=True)
        if step >= total:  # the fit's end: the bar stays as it ended, above what the command says next
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class ConsoleStream(StreamWrapper):
    """``sys.stdout`` / ``sys.stderr`` cut into lines for a :class:`Console`."""

    def __init__(self, stream, console: Console, results: bool = False):
        self._stream, self._console, self._pending, self._results = stream, console, "", results

    def write(self, text: str) -> int:
        with self._console.lock:
            data, self._pending = self._pending + text, ""
            while True:
                cut = min((i for i in (data.find("\n"), data.find("\r")) if i >= 0), default=-1)
                if cut < 0:
                    break
                line, ending, data = data[:cut], data[cut], data[cut + 1:]
                self._console.line(line, self._stream, self._results, transient=ending == "\r")
            self._pending = data
        return len(text)

    def flush(self) -> None:
        self._stream.flush()  # (a part line waits for its end: tqdm flushes after each redraw)

    def close_line(self) -> None:
        with self._console.lock:
            if self._pending:
                line, self._pending = self._pending, ""
                self._console.line(line, self._stream, self._results)


@contextmanager
def console(command: str, verbose: bool = False, log_path: Optional[Path] = None, bar: bool = True):
    """Inside the block, the streams go through a :class:`Console` with a log file of ``command``'s own
    (its path said once, on stderr, when a first line goes there). ``verbose``: the streams as they are;
    ``bar``: rank 0's step lines drive a progress bar where stderr is a terminal (one fit's)."""
    if verbose:
        yield None
        return
    saved = sys.stdout, sys.stderr
    out = saved[1]

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    log = LogFile(log_path or new_log_path(command), say)
    routing = Console(out, log, bar=bar and _is_terminal(out))
    sys.stdout, sys.stderr = ConsoleStream(saved[0], routing, results=True), ConsoleStream(out, routing)
    try:
        yield log
    except (RaycseError, KeyboardInterrupt):  # a refusal or an interrupt: its one line, and no file unnamed
        log.discard()
        raise
    finally:
        log.say_path()  # (a success, or a crash whose traceback follows: the log holds what led to it)
        for stream in (sys.stdout, sys.stderr):
            try:
                if isinstance(stream, ConsoleStream):
                    stream.close_line()
                stream.flush()
            except (OSError, ValueError):
                pass
        routing.close()
        sys.stdout, sys.stderr = saved
        log.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False
