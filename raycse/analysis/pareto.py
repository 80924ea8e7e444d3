"""The Pareto front of a search for several goals (``raycse tune --objectives``): the complete trials that
no other complete trial beats on every goal, as Optuna keeps them (``study.best_trials``), its table and
``pareto.png``.

A trial dominates another when it is at least as good on every goal (higher for ``max``, lower for
``min``) and better on one; trials with equal values do not dominate each other, so both stay.

    >>> from raycse.evaluation.targets import parse_targets
    >>> goals = parse_targets("sts:max,speed:max")
    >>> dominates({"t_sts": 80, "t_speed": 900}, {"t_sts": 79, "t_speed": 900}, goals)
    True
    >>> dominates({"t_sts": 80, "t_speed": 800}, {"t_sts": 79, "t_speed": 900}, goals)
    False
"""

from __future__ import annotations

import math
from typing import Optional


def values(trial, goals) -> Optional[list]:
    """A complete trial's final value of each goal (None where the trial is not complete or lacks one)."""
    if not trial.complete:
        return None
    got = [trial.last.get(g.key) for g in goals]
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in got)
    return [float(v) for v in got] if ok else None


def dominates(a: dict, b: dict, goals) -> bool:
    """Whether the goal values ``a`` dominate ``b`` (dicts by goal key)."""
    better = [(a[g.key] - b[g.key]) * (1 if g.mode == "max" else -1) for g in goals]
    return all(d >= 0 for d in better) and any(d > 0 for d in better)


def front(trials, goals) -> list:
    """The non-dominated complete trials, in the order given."""
    scored = [(t, dict(zip([g.key for g in goals], v))) for t in trials if (v := values(t, goals)) is not None]
    return [t for t, v in scored if not any(dominates(w, v, goals) for u, w in scored if u is not t)]


def differing_knobs(trials, knobs: list[str]) -> list[str]:
    """The knobs whose values are not the same in every one of ``trials``."""
    return [k for k in knobs if len({repr(t.params.get(k)) for t in trials}) > 1]


def format_front(members, goals, knobs: list[str]) -> str:
    """The front as a table: each trial's goals and the knobs that differ between its trials."""
    shown = differing_knobs(members, knobs)
    head = ["trial"] + [f"{g.name} ({g.mode})" for g in goals] + shown
    rows = [[t.trial_id] + [f"{t.last[g.key]:.4g}" for g in goals] + [_fmt(t.params.get(k, "-")) for k in shown]
            for t in members]
    widths = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([f"Pareto front: {len(members)} trial(s) no other beats on every goal",
                      line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
