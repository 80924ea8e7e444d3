"""PNG plots of a tune experiment (matplotlib, no display needed)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np

from raycse.analysis.pareto import values as goal_values


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(trials, knobs: list[str], out: Path, target: str, top: int, front: tuple = ([], [])) -> list[Path]:
    """The experiment's PNGs; ``front``: (the Pareto front's trials, the goals) of a search for several."""
    scored = [t for t in trials if "target" in t.last]
    members, goals = front
    return [p for p in (history(scored, out, target), importances(scored, knobs, out), score_vs_knobs(scored, knobs, out),
                        seed_spread(scored, out, top), pareto_front(scored, members, goals, out) if goals else None)
            if p is not None]


def history(trials, out: Path, target: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    y = [t.last["target"] for t in trials]
    done = [t.complete for t in trials]
    x = np.arange(1, len(y) + 1)
    ax.scatter(x[np.array(done, dtype=bool)], np.array(y)[np.array(done, dtype=bool)], label="complete", zorder=3)
    if not all(done):
        mask = ~np.array(done, dtype=bool)
        ax.scatter(x[mask], np.array(y)[mask], marker="x", label="stopped early (last rung)", zorder=3)
    best = np.maximum.accumulate([v if d else -np.inf for v, d in zip(y, done)]) if any(done) else None
    if best is not None:
        ax.step(x, best, where="post", color="k", label="best so far (complete)")
    ax.set_xlabel("trial (start order)")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"target: {target} of STS-B dev Spearman")
    ax.set_title("Optimisation history")
    ax.legend(fontsize=8)
    return _save(fig, out / "optimization_history.png")


def importances(trials, knobs: list[str], out: Path) -> Path:
    """fANOVA importances (Optuna) over the complete trials; a note instead when there are too few."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    values, message = _importances(trials, knobs)
    if values:
        names = list(values)[::-1]
        ax.barh(names, [values[n] for n in names])
        ax.set_xlabel("importance (fANOVA, share of variance)")
    else:
        ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
        ax.set_axis_off()
    ax.set_title("Parameter importances")
    return _save(fig, out / "param_importances.png")


def _importances(trials, knobs):
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    done = [t for t in trials if t.complete]
    shared = [k for k in knobs if all(k in t.params for t in done)]
    varying = [k for k in shared if len({repr(t.params[k]) for t in done}) > 1]
    if len(done) < 3 or not varying:
        return {}, f"needs >= 3 complete trials with varying knobs ({len(done)} complete)"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for t in done:
        dists, params = {}, {}
        for k in varying:
            v = t.params[k]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                lo = min(float(d.params[k]) for d in done)
                hi = max(float(d.params[k]) for d in done)
                dists[k], params[k] = FloatDistribution(lo, hi), float(v)
            else:
                choices = tuple(sorted({repr(d.params[k]) for d in done}))
                dists[k], params[k] = CategoricalDistribution(choices), repr(v)
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=t.last["target"]))
    try:
        return optuna.importance.get_param_importances(study), ""
    except Exception as exc:  # noqa: BLE001 - a plot must not fail the analysis
        return {}, f"importances not computable: {exc}"


def score_vs_knobs(trials, knobs: list[str], out: Path) -> Path:
    plt = _plt()
    n = max(1, len(knobs))
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.2), squeeze=False)
    for ax, k in zip(axes[0], knobs):
        pts = [(t.params[k], t.last["mean"], t.last["std"], t.complete) for t in trials if k in t.params]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
        pos = xs if numeric else [sorted({repr(x) for x in xs}).index(repr(x)) for x in xs]
        for (x, m, s, c), px in zip(pts, pos):
            ax.errorbar(px, m, yerr=s, fmt="o" if c else "x", color="C0" if c else "C1", capsize=3)
        if numeric and min(xs) > 0 and max(xs) / min(xs) > 20:
            ax.set_xscale("log")
        if not numeric:
            labels = sorted({repr(x) for x in xs})
            ax.set_xticks(range(len(labels)), [lab.strip("'") for lab in labels], rotation=30)
        ax.set_xlabel(k)
        ax.xaxis.set_major_locator(_ticks())
        ax.set_ylabel("STS-B dev (mean +- std over seeds)")
    fig.suptitle("Score vs each knob (o complete, x stopped early)")
    return _save(fig, out / "score_vs_knobs.png")


def seed_spread(trials, out: Path, top: int) -> Path:
    plt = _plt()
    ranked = sorted([t for t in trials if t.complete] or trials, key=lambda t: -t.last["target"])[:top]
    fig, ax = plt.subplots(figsize=(1.4 * max(3, len(ranked)) + 1, 4))
    for i, t in enumerate(ranked):
        vals = t.last["seed_scores"]
        ax.scatter([i] * len(vals), vals, color="C0", zorder=3)
        ax.hlines(np.mean(vals), i - 0.25, i + 0.25, color="k")
    labels = [f"#{i + 1}\n" + "\n".join(f"{k}={_short(v)}" for k, v in sorted(t.params.items()))
              for i, t in enumerate(ranked)]
    ax.set_xticks(range(len(ranked)), labels, fontsize=7)
    ax.set_ylabel("STS-B dev Spearman per seed")
    ax.set_title(f"Per-seed scores, top {len(ranked)} configurations (line: mean)", fontsize=10)
    return _save(fig, out / "seed_spread.png")


def _short(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(4)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def pareto_front(trials, members, goals, out: Path) -> Optional[Path]:
    """``pareto.png``: every complete trial's goals, the front highlighted (2 goals: one scatter with the
    front joined; more: one scatter per pair of goals)."""
    scored = [(t, v) for t in trials if (v := goal_values(t, goals)) is not None]
    if not scored:
        return None
    plt = _plt()
    pairs = [(i, j) for i in range(len(goals)) for j in range(i + 1, len(goals))]
    cols = min(3, len(pairs))
    rows = math.ceil(len(pairs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    on_front = [any(t is m for m in members) for t, _ in scored]
    for ax, (i, j) in zip(axes.flat, pairs):
        xs, ys = [v[i] for _, v in scored], [v[j] for _, v in scored]
        ax.scatter([x for x, f in zip(xs, on_front) if not f], [y for y, f in zip(ys, on_front) if not f],
                   color="0.6", label="dominated", zorder=2)
        ax.scatter([x for x, f in zip(xs, on_front) if f], [y for y, f in zip(ys, on_front) if f],
                   color="C3", label="Pareto front", zorder=3)
        if len(goals) == 2:
            line = sorted((x, y) for x, y, f in zip(xs, ys, on_front) if f)
            ax.plot([p[0] for p in line], [p[1] for p in line], color="C3", zorder=1)
        for (t, _), x, y, f in zip(scored, xs, ys, on_front):
            if f:
                ax.annotate(t.trial_id, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(f"{goals[i].name} ({goals[i].mode})")
        ax.set_ylabel(f"{goals[j].name} ({goals[j].mode})")
        ax.margins(0.12)  # (room for the front's labels, which sit at the top and right edges)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(pairs):]:
        ax.set_axis_off()
    fig.suptitle(f"{len(members)} of {len(scored)} complete trials on the Pareto front")
    return _save(fig, out / "pareto.png")
