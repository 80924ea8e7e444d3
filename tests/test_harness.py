"""The suite's own machinery in conftest.py: the order its processes take the test files in."""

from __future__ import annotations

from pathlib import Path

from conftest import costliest_files_first, recorded_durations


class Item:
    """What costliest_files_first reads of a pytest item: its node id and whether it is in the full tier."""

    def __init__(self, nodeid: str, full: bool = False):
        self.nodeid, self.full = nodeid, full

    def get_closest_marker(self, name: str):
        return name if name == "full_tier" and self.full else None


def test_files_go_costliest_first_by_their_recorded_seconds_else_by_their_tiers():
    items = [Item("tests/test_a.py::one"), Item("tests/test_a.py::two"),  # 2 fast, unknown: 0.6 s guessed
             Item("tests/test_b.py::only", full=True),                    # recorded: 100 s
             Item("tests/test_c.py::x", full=True), Item("tests/test_c.py::y"),  # 1 s + 15 s guessed = 16 s
             Item("tests/test_d.py::z")]                                  # recorded: 16 s, ties c
    recorded = {"tests/test_b.py::only": 100.0, "tests/test_c.py::y": 1.0, "tests/test_d.py::z": 16.0}
    order = [i.nodeid for i in costliest_files_first(items, recorded)]
    assert order == ["tests/test_b.py::only", "tests/test_c.py::x", "tests/test_c.py::y", "tests/test_d.py::z",
                     "tests/test_a.py::one", "tests/test_a.py::two"]
    # a file's own tests keep their order whatever their cost
    assert [i.nodeid for i in costliest_files_first(items[:2], {"tests/test_a.py::two": 9.0})] == [
        "tests/test_a.py::one", "tests/test_a.py::two"]


def test_the_recorded_durations_name_collected_tests_with_seconds():
    durations = recorded_durations()
    assert durations, "no tests/durations.json: RAYCSE_TEST_DURATIONS=tests/durations.json bash scripts/test.sh"
    root = Path(__file__).resolve().parents[1]
    assert all((root / k.split("::")[0]).is_file() for k in durations)
    assert all(isinstance(v, float | int) and v >= 0 for v in durations.values())
