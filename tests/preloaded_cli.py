"""`python -m raycse ARGS` in a process forked from an interpreter that has already imported what the
commands import (torch, transformers, Ray, pyarrow...), for tables of many short commands
(tests/test_bad_inputs.py). Each command still runs in a process of its own, through the package's own
``__main__``, with its own working directory, environment, argv, stdout and stderr; only the interpreter's
start and the imports are shared. What a module reads from the environment when it is imported (the Hugging
Face hub's switches, a ``sitecustomize`` on PYTHONPATH) is fixed by then: commands that change it run in a
fresh interpreter instead.

Run as a script, it serves requests, one JSON line each on stdin, one at a time:
``{"argv": [...], "cwd": DIR, "env": {...}, "out": FILE, "err": FILE}`` -> ``{"pid": N}`` when the child
starts, then ``{"pid": N, "rc": CODE}`` when it ends."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

PRELOAD = ("raycse.cli", "torch", "transformers", "ray", "pyarrow", "pyarrow.parquet", "yaml",
           "safetensors.torch", "raycse.tune.search", "raycse.train.driver", "raycse.evaluation.sts")


def _serve() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)  # never returns
        try:  # (here too: the group exists before the test may need to end it, whichever runs first)
            os.setpgid(pid, pid)
        except OSError:  # it already set it itself, or has already ended
            pass
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "rc": os.waitstatus_to_exitcode(status)}), flush=True)


def _child(request: dict) -> None:
    import atexit
    import runpy
    import traceback

    code = 1
    try:
        os.setpgid(0, 0)  # (its own group: a timeout in the test ends it and whatever it started)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path in ((1, request["out"]), (2, request["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        sys.argv = [sys.argv[0], *request["argv"]]
        try:
            runpy.run_module("raycse", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as end:  # as the interpreter treats it
            if end.code is None or isinstance(end.code, int):
                code = end.code or 0
            else:
                print(end.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as the interpreter prints an uncaught error
            traceback.print_exc()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


class Preloaded:
    """One serving interpreter; :meth:`run` is one command, bounded."""

    def __init__(self, env: dict, server: list | None = None):
        self.env = env
        self.server = subprocess.Popen(server or [sys.executable, __file__], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env, text=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="raycse-preloaded-"))
        # A thread reads the answers into a queue: select() on the pipe would miss a second answer that the
        # first readline() had already buffered (a command that ends at once: both lines arrive together).
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.server.stdout:
            self.answers.put(line)
        self.answers.put("")  # the server ended

    def _answer(self, bound_s: float) -> dict:
        try:
            line = self.answers.get(timeout=bound_s)
        except queue.Empty:
            line = None
        if not line:
            end = "ended" if line == "" else f"gave no answer within {bound_s:g} s"
            raise TimeoutError(f"the preloaded interpreter {end}")
        return json.loads(line)

    def run(self, argv: list, cwd: Path, timeout: float = 300) -> SimpleNamespace:
        out, err = self.scratch / "out", self.scratch / "err"
        self.server.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd), "env": self.env, "out": str(out),
                                            "err": str(err)}) + "\n")
        self.server.stdin.flush()
        pid = self._answer(60)["pid"]
        try:
            rc = self._answer(timeout)["rc"]
        except TimeoutError:
            try:
                os.killpg(pid, 9)
            except ProcessLookupError:  # it ended just as the bound ran out: its answer is on the way
                rc = self._answer(10)["rc"]
            else:
                raise
        return SimpleNamespace(args=argv, pid=pid, returncode=rc, stdout=out.read_text(), stderr=err.read_text())

    def close(self) -> None:
        import shutil

        self.server.stdin.close()
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait(timeout=10)
        shutil.rmtree(self.scratch, ignore_errors=True)


if __name__ == "__main__":
    _serve()
