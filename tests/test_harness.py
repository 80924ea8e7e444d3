"""The suite's own machinery: in conftest.py, the groups its processes take the tests in, and their order;
in preloaded_cli.py, the forking interpreter that runs the bad-input table's commands."""

from __future__ import annotations

from pathlib import Path

from conftest import costliest_groups_first, names_a_test, plain_nodeid, recorded_durations


class Item:
    """What costliest_groups_first reads of a pytest item: its node id, whether it is in the full tier, and
    its xdist group."""

    def __init__(self, nodeid: str, full: bool = False, group: str | None = None):
        self.nodeid, self.full, self.group = nodeid, full, group

    def get_closest_marker(self, name: str):
        if name == "xdist_group" and self.group:
            return Mark(self.group)
        return name if name == "full_tier" and self.full else None


class Mark:
    def __init__(self, *args):
        self.args = args


def test_files_go_costliest_first_by_their_recorded_seconds_else_by_their_tiers():
    items = [Item("tests/test_a.py::one"), Item("tests/test_a.py::two"),  # 2 fast, unknown: 0.6 s guessed
             Item("tests/test_b.py::only", full=True),                    # recorded: 100 s
             Item("tests/test_c.py::x", full=True), Item("tests/test_c.py::y"),  # 1 s + 15 s guessed = 16 s
             Item("tests/test_d.py::z")]                                  # recorded: 16 s, ties c
    recorded = {"tests/test_b.py::only": 100.0, "tests/test_c.py::y": 1.0, "tests/test_d.py::z": 16.0}
    order = [i.nodeid for i in costliest_groups_first(items, recorded)]
    assert order == ["tests/test_b.py::only", "tests/test_c.py::x", "tests/test_c.py::y", "tests/test_d.py::z",
                     "tests/test_a.py::one", "tests/test_a.py::two"]
    # a file's own tests keep their order whatever their cost
    assert [i.nodeid for i in costliest_groups_first(items[:2], {"tests/test_a.py::two": 9.0})] == [
        "tests/test_a.py::one", "tests/test_a.py::two"]


def test_a_group_goes_as_one_whatever_files_its_tests_are_in():
    items = [Item("tests/test_a.py::light", full=True),                    # 15 s guessed
             Item("tests/test_a.py::heavy", full=True, group="heavy"),     # recorded: 10 s
             Item("tests/test_b.py::heavy", full=True, group="heavy"),     # recorded: 10 s: the group 20 s
             Item("tests/test_c.py::z")]
    recorded = {"tests/test_a.py::heavy": 10.0, "tests/test_b.py::heavy": 10.0}
    order = [i.nodeid for i in costliest_groups_first(items, recorded)]
    assert order == ["tests/test_a.py::heavy", "tests/test_b.py::heavy", "tests/test_a.py::light", "tests/test_c.py::z"]


def test_the_group_suffix_xdist_adds_is_taken_off_the_recorded_node_id():
    assert plain_nodeid("tests/test_a.py::t@heavy") == "tests/test_a.py::t"
    assert plain_nodeid("tests/test_a.py::t[x@y]") == "tests/test_a.py::t[x@y]"  # (a parameter's own @)
    assert plain_nodeid("tests/test_a.py::t[x@y]@tests/test_a.py") == "tests/test_a.py::t[x@y]"


def test_the_recorded_durations_name_collected_tests_with_seconds():
    durations = recorded_durations()
    assert durations, "no tests/durations.json: RAYCSE_TEST_DURATIONS=tests/durations.json bash scripts/test.sh"
    root = Path(__file__).resolve().parents[1]
    assert [k for k in durations if not names_a_test(root, k)] == []  # (a renamed test's old figure dropped)
    assert all(isinstance(v, float | int) and v >= 0 for v in durations.values())


def test_a_test_is_named_in_its_file_as_a_function_or_a_class_method(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_a():\n    pass\n\n\nclass TestB:\n    async def test_c(self):\n"
                                        "        pass\n# def test_gone(\n")
    assert names_a_test(tmp_path, "test_x.py::test_a[1-2]") and names_a_test(tmp_path, "test_x.py::TestB::test_c")
    assert not names_a_test(tmp_path, "test_x.py::test_gone") and not names_a_test(tmp_path, "test_x.py::test_c_d")
    assert not names_a_test(tmp_path, "test_y.py::test_a")


def test_the_tests_scripts_name_are_the_suites():
    """scripts/floors.sh runs full-tier tests by name: a renamed one made its Ray group run no test (exit 5)."""
    import re

    root = Path(__file__).resolve().parents[1]
    named = re.findall(r"tests/\w+\.py::\w+", (root / "scripts" / "floors.sh").read_text())
    assert named and [n for n in named if not names_a_test(root, n)] == []


def test_xdist_keeps_a_group_on_one_process(tmp_path):
    """scripts/test.sh's --dist loadgroup puts an xdist_group's tests on one process (the heavy tests one after
    another; a file's tests, and its module fixtures, once). pytest-xdist 3.8 names the group in the node id,
    which pytest 9.2 no longer reads (pytest-xdist issue #1386): there every test went its own way, silently,
    and CI ran heavy tests side by side and module fixtures twice (the GPU stand-in's 160 s setup, twice).
    This runs the suite's own way on a file of its own and fails where the groups are lost."""
    import os
    import subprocess
    import sys

    (tmp_path / "test_groups.py").write_text(
        "import os\nimport pytest\n\n"
        + "".join(f"@pytest.mark.xdist_group('g')\ndef test_g{i}():\n"
                  f"    open('{tmp_path}/g{i}', 'w').write(os.environ['PYTEST_XDIST_WORKER'])\n\n" for i in range(4))
        + "".join(f"def test_free{i}():\n    pass\n\n" for i in range(4)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "--no-loadscope-reorder", str(tmp_path / "test_groups.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")})  # (not a worker)
    assert proc.returncode == 0, proc.stdout[-2000:]
    workers = {(tmp_path / f"g{i}").read_text() for i in range(4)}
    assert len(workers) == 1, f"the group's tests ran on {sorted(workers)}"


# A server that answers each request as a command that ends at once: both its lines in one write, as they
# reach the test when the command's exit beats the test's first read (CI's stop 103 waited 300 s on one).
_AT_ONCE = """
import json, os, sys
for line in sys.stdin:
    request = json.loads(line)
    for key in ("out", "err"):
        open(request[key], "w").write(key)
    sys.stdout.write(json.dumps({"pid": os.getpid()}) + "\\n" + json.dumps({"pid": os.getpid(), "rc": 2}) + "\\n")
    sys.stdout.flush()
"""


def test_the_preloaded_interpreter_reads_two_answers_that_came_in_one_write(tmp_path):
    import sys
    import time

    from preloaded_cli import Preloaded

    server = Preloaded({}, server=[sys.executable, "-c", _AT_ONCE])
    try:
        start = time.monotonic()
        for _ in range(3):
            done = server.run(["train"], tmp_path, timeout=5)
            assert (done.returncode, done.stdout, done.stderr) == (2, "out", "err")
        assert time.monotonic() - start < 5
    finally:
        server.close()


def test_each_of_the_suites_processes_gets_its_share_of_the_cores_unless_the_user_chose(monkeypatch):
    """-n 2 on this project's 2-core machines: one OpenMP thread a process (torch's and faiss's threads otherwise
    spin beside the other process); a user's OMP_NUM_THREADS and a run in one process keep theirs."""
    import os
    from types import SimpleNamespace

    from conftest import share_the_cores

    def config(n):
        return SimpleNamespace(option=SimpleNamespace(numprocesses=n))

    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    for n, want in ((2, str(max(1, cores // 2))), (cores * 4, "1"), (1, None), (None, None)):
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        share_the_cores(config(n))
        assert os.environ.get("OMP_NUM_THREADS") == want, n
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    share_the_cores(config(2))
    assert os.environ["OMP_NUM_THREADS"] == "3"
