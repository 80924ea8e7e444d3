"""The console of `raycse train` (raycse.platform.console, issue 87 item 4): raycse's lines, problems and
the command's results on the terminal, one progress bar there on a terminal, every line in the log file."""

import io
import os
import sys

from raycse.platform import console as con

C, R = "\x1b[36m", "\x1b[0m"  # Ray's colours around a forwarded line's sender
WORKER, CONTROLLER = f"{C}(RayTrainWorker pid=12){R} ", f"{C}(TrainController pid=11){R} "

RAY_NOISE = [  # what a run printed here, 2026-12-03, that is Ray's or the libraries' and not a problem
    CONTROLLER + "Requesting resources: {'CPU': 2} * 1",
    WORKER + "Setting up process group for: env:// [rank=0, world_size=1]",
    WORKER + "Moving model to device: cpu",
    WORKER + "Checkpoint successfully created at: Checkpoint(filesystem=local, path=/tmp/x/checkpoint_1)",
]
OURS = [
    WORKER + "[raycse] 1 worker(s), steps 0..18 of 18, global batch 16, precision fp32, threads 2",
    WORKER + "[raycse] step 18: STS-B dev Spearman 61.20",
]
PROBLEMS = [
    WORKER + "/x/site-packages/torch/nn/modules/module.py:1: UserWarning: something deprecated",
    "2026-12-03 14:20:13,137 ERROR worker.py:1 -- a driver-side error of Ray's",
]
TRACEBACK = [
    WORKER + "Traceback (most recent call last):",
    WORKER + '  File "/x/loop.py", line 3, in fit',
    WORKER + "    step()",
    WORKER + "ZeroDivisionError: division by zero",
    WORKER + "Loading weights again",  # the traceback ended: noise again
]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def routed(tmp_path, monkeypatch, writes, verbose=False, terminal=False, bar=True):
    """What the terminal's stdout and stderr got from ``writes`` ((stream name, text) in order), and the log."""
    out, err = (Terminal() if terminal else io.StringIO()), (Terminal() if terminal else io.StringIO())
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("TERM", "xterm")
    log_path = tmp_path / "logs" / "train.log"
    with con.console("train", verbose=verbose, log_path=log_path, bar=bar) as log:
        assert verbose or log.path == log_path
        for name, text in writes:
            getattr(sys, name).write(text)
    assert (sys.stdout, sys.stderr) == (out, err)  # the streams are given back
    return out.getvalue(), err.getvalue(), log_path.read_text() if log_path.exists() else None


def lines(texts, stream="stderr"):
    return [(stream, t + "\n") for t in texts]


def test_the_terminal_gets_raycse_s_lines_problems_and_results_and_the_log_gets_every_line(tmp_path, monkeypatch):
    results = ["[raycse] model saved to /x/model", "a table the command prints"]
    writes = (lines(RAY_NOISE + OURS[:1]) + lines(PROBLEMS + TRACEBACK) + lines(OURS[1:])
              + lines(results, "stdout") + lines([WORKER + "a worker's print()"], "stdout")
              + [("stderr", WORKER + "Loading weights:   0%|  | 0/39\r"), ("stderr", "Loading weights: 100%|##| 39/39\n")]
              + [("stderr", WORKER + "[raycse] a line "), ("stderr", "in two writes\n")])
    out, err, log = routed(tmp_path, monkeypatch, writes)
    assert out.splitlines() == results  # the command's results, and nothing a worker printed
    shown = err.splitlines()
    assert shown[0].startswith(f"[raycse] log: {tmp_path / 'logs' / 'train.log'}")
    # (not a terminal: without Ray's colours, as in a CI log or a redirected file; issue 109)
    assert shown[1:] == [con.ANSI.sub("", t) for t in OURS[:1] + PROBLEMS + TRACEBACK[:4] + OURS[1:]
                         + [WORKER + "[raycse] a line in two writes"]]
    assert "\x1b" not in err
    # the log: every line once, in order, without colours; a bar's redraws only in its last state
    logged = log.splitlines()
    plain = [con.ANSI.sub("", t) for t in RAY_NOISE + OURS[:1] + PROBLEMS + TRACEBACK + OURS[1:]]
    assert logged[:len(plain)] == plain
    assert logged[len(plain):] == results + ["(RayTrainWorker pid=12) a worker's print()",
                                             "Loading weights: 100%|##| 39/39",
                                             "(RayTrainWorker pid=12) [raycse] a line in two writes"]


def test_a_terminal_keeps_rays_colours(tmp_path, monkeypatch):
    _, err, log = routed(tmp_path, monkeypatch, lines(RAY_NOISE + OURS), terminal=True, bar=False)
    assert [line for line in err.splitlines() if not line.startswith("[raycse] log:")] == OURS
    assert "\x1b" not in log


def test_verbose_shows_everything_as_it_comes(tmp_path, monkeypatch):
    out, err, log = routed(tmp_path, monkeypatch, lines(RAY_NOISE + OURS), verbose=True)
    assert err.splitlines() == RAY_NOISE + OURS and out == "" and log is None


def test_a_command_that_hides_nothing_writes_no_log_and_says_no_path(tmp_path, monkeypatch):
    """A refusal is one line, and writes nothing."""
    out, err, log = routed(tmp_path, monkeypatch, lines(["raycse: error: --corpus x: no such file"]))
    assert err == "raycse: error: --corpus x: no such file\n" and log is None and not (tmp_path / "logs").exists()


def test_a_credential_in_a_forwarded_line_is_masked_in_the_log(tmp_path, monkeypatch):
    _, _, log = routed(tmp_path, monkeypatch, lines([WORKER + "reading s3://AKIA:SECRET@bucket/c.txt"]))
    assert "SECRET" not in log and "bucket/c.txt" in log


def step(n, total=40, loss=1.5):
    return WORKER + con.step_line(n, total, 0, loss, 1e-5, 30.0)


def test_on_a_terminal_the_step_lines_drive_one_bar_with_its_eta(tmp_path, monkeypatch):
    writes = lines([step(10), OURS[1], step(20, loss=1.25), step(40, loss=1.0)])
    out, err, log = routed(tmp_path, monkeypatch, writes, terminal=True)
    assert "[raycse] step 10/40" not in err  # the bar instead of the lines
    assert OURS[1] in err  # another raycse line printed above the bar
    final = err.replace("\r", "\n").splitlines()
    bar = [line for line in final if line.startswith("training:")]
    assert bar and "40/40" in bar[-1] and "loss 1.0000" in bar[-1] and "30.0 examples/s" in bar[-1]
    assert any("<" in line for line in bar)  # tqdm's elapsed<remaining
    assert [line for line in log.splitlines() if "[raycse] step " in line and "/40" in line] == \
        [con.ANSI.sub("", step(n, loss=v)) for n, v in ((10, 1.5), (20, 1.25), (40, 1.0))]


def test_off_a_terminal_the_step_lines_stay_plain_lines(tmp_path, monkeypatch):
    _, err, _ = routed(tmp_path, monkeypatch, lines([step(10), step(40)]))
    assert err.splitlines() == [con.ANSI.sub("", step(n)) for n in (10, 40)] and "training:" not in err


def test_a_resumed_or_restarted_fit_moves_the_bar_where_the_fit_stands(tmp_path, monkeypatch):
    _, err, _ = routed(tmp_path, monkeypatch, lines([step(30), step(10), step(20)]), terminal=True)
    bar = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("training:")]
    assert "30/40" in bar[0] and "20/40" in bar[-1]


def test_tunes_console_keeps_every_trials_step_lines_and_tunes_tables_and_logs_rays_lines(tmp_path, monkeypatch):
    """`raycse tune` (bar=False): on a terminal too, the trials' step lines stay lines (two trials' would
    fight over one bar); Tune's tables (the driver's stdout) show; Ray's lines and Optuna's INFO go to the log."""
    other = WORKER.replace("pid=12", "pid=13")
    table = ["Trial status: 1 RUNNING", "│ Trial name           status   │"]
    writes = (lines(["[I 2026-12-06 00:26:12,967] A new study created in RDB with name: e1"]) + lines(table, "stdout")
              + lines(RAY_NOISE + [step(10), other + con.step_line(10, 40, 0, 2.0, 1e-5, 30.0), step(20)]))
    out, err, log = routed(tmp_path, monkeypatch, writes, terminal=True, bar=False)
    assert out.splitlines() == table and "training:" not in err
    assert err.splitlines()[1:] == [step(10), other + con.step_line(10, 40, 0, 2.0, 1e-5, 30.0), step(20)]
    assert "A new study created" in log and all(con.ANSI.sub("", line) in log for line in RAY_NOISE)


def test_a_log_directory_that_cannot_be_written_leaves_the_console_as_it_was(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with con.console("train", log_path=blocked / "logs" / "train.log"):
        sys.stderr.write(RAY_NOISE[0] + "\n" + RAY_NOISE[1] + "\n")
    assert err.getvalue().splitlines()[1:] == [con.ANSI.sub("", t) for t in RAY_NOISE[:2]]  # (not a terminal)
    assert err.getvalue().startswith("[raycse] no log file (") and "RAYCSE_LOG_DIR" in err.getvalue()


def test_each_command_gets_a_log_file_of_its_own_where_raycse_log_dir_says(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYCSE_LOG_DIR", str(tmp_path / "logs"))
    path = con.new_log_path("train")
    assert path.parent == tmp_path / "logs" and path.name.startswith("train-") and f"-{os.getpid()}." in path.name
    monkeypatch.delenv("RAYCSE_LOG_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert con.log_dir() == tmp_path / "state" / "raycse" / "logs"


def test_the_step_line_reads_back_as_it_was_written():
    m = con.STEP_PATTERN.search(step(7, 9, 0.25))
    assert (m["step"], m["total"], m["loss"], m["speed"]) == ("7", "9", "0.2500", "30.0")


def test_lines_written_from_two_threads_at_once_stay_whole(tmp_path, monkeypatch):
    """Ray forwards the workers' lines from a thread of its own while the command writes its own."""
    import threading

    def writer(name, n):
        for i in range(n):
            sys.stderr.write(f"{WORKER}[raycse] {name} line {i}\n")
            sys.stderr.write(f"{WORKER}noise {i}\n")

    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with con.console("train", log_path=tmp_path / "train.log"):
        threads = [threading.Thread(target=writer, args=(name, 2000)) for name in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    shown = err.getvalue().splitlines()
    assert len([line for line in shown if line.startswith("[raycse] log: ")]) == 1
    for name in ("a", "b"):
        assert [line for line in shown if f" {name} line " in line] == \
            [con.ANSI.sub("", f"{WORKER}[raycse] {name} line {i}") for i in range(2000)]
    assert len(shown) == 4001 and len((tmp_path / "train.log").read_text().splitlines()) == 8000


def _ended_by(tmp_path, monkeypatch, exc):
    """What stderr showed and whether the log stays, when the command ends in ``exc`` after Ray's lines."""
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    path = tmp_path / "logs" / "train.log"
    try:
        with con.console("train", log_path=path):
            sys.stderr.write(RAY_NOISE[0] + "\n")  # Ray started, no worker has spoken yet
            raise exc
    except BaseException as caught:  # noqa: BLE001 - what the block raised, handed on
        assert caught is exc
    return err.getvalue(), path.exists()


def test_a_refusal_or_an_interrupt_before_the_workers_speak_stays_one_line_and_leaves_no_log(tmp_path, monkeypatch):
    from raycse.errors import ConfigError
    from raycse.platform.interrupts import Interrupted

    for exc in (ConfigError("--corpus x: no rows"), Interrupted(15)):
        assert _ended_by(tmp_path, monkeypatch, exc) == ("", False)  # (the CLI prints the one line after)


def test_a_crash_names_the_log_that_holds_what_led_to_it(tmp_path, monkeypatch):
    shown, kept = _ended_by(tmp_path, monkeypatch, RuntimeError("a bug"))
    logged = (tmp_path / "logs" / "train.log").read_text()
    assert kept and shown.startswith("[raycse] log: ") and con.ANSI.sub("", RAY_NOISE[0]) in logged
