"""train.profile_steps: which steps the profile holds, what its summary says, and bad windows."""

import pytest
import torch

from raycse.config import RunConfig, set_dotted
from raycse.errors import ConfigError
from raycse.train.profile import StepProfiler, span


def run_steps(profiler: StepProfiler, steps: int) -> None:
    """Steps 1..steps as the loop runs them; step i multiplies i times (a count that names the step)."""
    x = torch.randn(8, 8)
    for done in range(steps):
        profiler.before(done)
        with span(profiler, "raycse.collate"):
            torch.ones(3)
        with span(profiler, "raycse.step"):
            for _ in range(done + 1):
                torch.mm(x, x)
        profiler.after(done + 1)


def test_the_window_holds_exactly_its_steps():
    profiler = StepProfiler((2, 4), rank=0, device=torch.device("cpu"))
    run_steps(profiler, 6)
    summary = profiler.summary
    assert summary["steps"] == "3..4" and summary["wall_s"] > 0 and summary["device_busy_s"] == 0
    (mm,) = [row for row in summary["top_host"] if row["name"] == "aten::mm"]
    assert mm["calls"] == 3 + 4  # steps 3 and 4, not 2 or 5
    assert set(summary["phases_s"]) == {"raycse.collate", "raycse.step"}
    assert summary["phases_s"]["raycse.step"] > 0
    assert "aten::mm" in profiler.table and "raycse" not in str(summary["top_host"])  # phases apart from ops


def test_other_ranks_and_no_window_profile_nothing():
    for profiler in (StepProfiler((0, 2), rank=1, device=torch.device("cpu")),
                     StepProfiler(None, rank=0, device=torch.device("cpu"))):
        run_steps(profiler, 3)
        assert profiler.summary is None and profiler.table == ""


@pytest.mark.parametrize("spec", ["5", "5:3", "4:4", "a:b", "-1:3", "1:2:3"])
def test_a_bad_window_is_one_clear_error(spec):
    run = RunConfig()
    set_dotted(run, "train.profile_steps", spec)
    with pytest.raises(ConfigError, match="train.profile_steps must be A:B with 0 <= A < B"):
        run.validate()


def test_a_window_as_yaml_writes_it():
    run = RunConfig.from_dict({"train": {"profile_steps": "50:60"}})
    run.validate()
    assert run.train.profile_window() == (50, 60)
