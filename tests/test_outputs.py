"""A run killed before it could clean up (SIGKILL, the OOM killer) leaves its staging directory
behind: the next run beside it removes it, and never one of a process still running."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from raycse.platform.staging import private_tempdir, staging_dir

MAKE = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from raycse.platform.staging import private_tempdir, staging_dir
    staging = staging_dir(Path(sys.argv[1]))
    (staging / "weights.bin").write_bytes(b"x" * 1024)
    scratch = private_tempdir(sys.argv[2])
    (scratch / "state").write_text("partial")
    print(staging, scratch, flush=True)
    if sys.argv[3] == "die":
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no atexit: what a killed run leaves
    time.sleep(120)
""")


def start(dest: Path, prefix: str, how: str) -> tuple[subprocess.Popen, Path, Path]:
    proc = subprocess.Popen([sys.executable, "-c", MAKE, str(dest), prefix, how], stdout=subprocess.PIPE, text=True)
    staging, scratch = proc.stdout.readline().split()
    return proc, Path(staging), Path(scratch)


def test_a_killed_runs_staging_is_removed_by_the_next_run_and_a_live_ones_kept(tmp_path, capfd):
    dest = tmp_path / "model"
    prefix = f"raycse-test-sweep-{os.getpid()}-"
    killed, dead_staging, dead_scratch = start(dest, prefix, "die")
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert dead_staging.is_dir() and dead_scratch.is_dir()  # what the killed run left
    manual = tmp_path / ".model.partial-kept"  # a name no raycse process made: not ours to judge
    manual.mkdir()
    capfd.readouterr()
    mine, scratch = staging_dir(dest), private_tempdir(prefix)  # the next run beside it
    assert not dead_staging.exists() and not dead_scratch.exists() and manual.is_dir()
    err = capfd.readouterr().err
    assert str(dead_staging) in err and str(dead_scratch) in err and f"process {killed.pid}" in err
    alive, live_staging, live_scratch = start(dest, prefix, "live")
    try:
        staging_dir(dest), private_tempdir(prefix)  # a run beside a running one and this process's own
        assert live_staging.is_dir() and live_scratch.is_dir() and mine.is_dir() and scratch.is_dir()
    finally:
        alive.kill()
        alive.wait()
        from raycse.platform.staging import sweep_killed_stagings

        sweep_killed_stagings()  # (the killed helper's record: not a later test's command's to report)
        for path in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
            shutil.rmtree(path, ignore_errors=True)
