"""Profiling a window of training steps with torch.profiler (``train.profile_steps``).

Why: a step's time splits into the host's work (Python, tokenizing, kernel launches, waits on the
device) and the device's; which one bounds a run is what a profile of a few steady steps tells
(BENCHMARKS.md, "On a GPU": the step in the Ray worker at 30-45% of the same step without Ray).
The loop marks its phases (``span``): ``raycse.collate`` (the batch tokenized, or its wait on the
helper thread), ``raycse.step`` (forward, backward, optimizer) and ``raycse.wait_ahead``.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Optional

import torch
from torch.autograd import DeviceType

PHASES = ("raycse.collate", "raycse.step", "raycse.wait_ahead")


class StepProfiler:
    """torch.profiler over steps ``start + 1 .. end`` of rank 0 (``window`` None, or another rank: a
    no-op). Call :meth:`before` with the steps done before a step, :meth:`after` with those done after
    it. The window is clipped to the fit's steps by the caller, so it always ends in :meth:`after`."""

    def __init__(self, window: Optional[tuple], rank: int, device: torch.device):
        self.window = window if rank == 0 else None
        self.device = device
        self.prof, self.t0, self.steps = None, 0.0, 0
        self.summary: Optional[dict] = None
        self.table = ""

    def before(self, done: int) -> None:
        if self.window is None or done != self.window[0] or self.prof is not None:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.start()
        self.t0, self.steps = time.perf_counter(), 0

    def after(self, done: int) -> bool:
        """Count the step; True when it ended the window (the summary and table are ready)."""
        if self.prof is None:
            return False
        self.steps += 1
        if done < self.window[1]:
            return False
        self._stop()
        return True

    def _stop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the window's kernels inside its wall time
        wall = time.perf_counter() - self.t0
        self.prof.stop()
        events = self.prof.key_averages()
        self.prof = None
        self.summary = summarize(events, wall, self.steps, self.window)
        sort = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        self.table = events.table(sort_by=sort, row_limit=20)


def summarize(events, wall_s: float, steps: int, window: tuple) -> dict:
    """The window's wall seconds, the device's busy seconds (its kernels' time; 0 on a CPU),
    each phase's host seconds and the top operators by self host and by self device time."""
    rows = [e for e in events if e.key not in PHASES]

    def top(attr: str) -> list:
        ranked = sorted(rows, key=lambda e: getattr(e, attr), reverse=True)[:12]
        return [{"name": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                 "self_device_ms": e.self_device_time_total / 1e3} for e in ranked if getattr(e, attr) > 0]

    return {"steps": f"{window[0] + 1}..{window[0] + steps}", "wall_s": wall_s,
            # the device's own events only: an operator's self device time repeats its kernels' (as
            # torch's own table totals it)
            "device_busy_s": sum(e.self_device_time_total for e in rows if e.device_type != DeviceType.CPU) / 1e6,
            "phases_s": {e.key: e.cpu_time_total / 1e6 for e in events if e.key in PHASES},
            "top_host": top("self_cpu_time_total"), "top_device": top("self_device_time_total")}


def describe(summary: dict) -> str:
    """One line of a :func:`summarize` result: steps, wall, device busy and host time per phase."""
    busy = summary["device_busy_s"] / max(summary["wall_s"], 1e-9)
    phases = ", ".join(f"{k.split('.')[1]} {v:.3f} s" for k, v in summary["phases_s"].items())
    return (f"steps {summary['steps']}: {summary['wall_s']:.3f} s wall, device busy {summary['device_busy_s']:.3f} s "
            f"({100 * busy:.0f}%); host time in {phases}")


def span(profiler: StepProfiler, name: str):
    """A named span in the profile while ``profiler`` records, else nothing at all."""
    return torch.profiler.record_function(name) if profiler.prof is not None else nullcontext()


def fit_window(run, stop_at: int, rank: int) -> Optional[tuple]:
    """train.profile_steps within a fit ending at ``stop_at`` (said in the log when it does not reach it)."""
    import logging

    window = run.train.profile_window()
    if window is None or rank != 0:
        return None
    if window[0] >= stop_at:
        logging.getLogger("raycse.train").warning(f"[raycse] train.profile_steps {run.train.profile_steps}: this fit "
                                                  f"ends at step {stop_at}; nothing profiled")
        return None
    return window[0], min(window[1], stop_at)
