"""A mixture's epochs: which source each step's batches come from, and the sources' batches laid out as one.

Every step's batches (one a worker) come from one source, so the in-batch negatives gathered across workers are
of one kind. An epoch has as many steps as its sources' batches make (``sum_i S_i``, ``S_i`` a source's steps
alone); the rule shares them out (:func:`planned_steps`):

- ``proportional``: ``p_i = n_i / sum_j n_j`` (``n_i``: the source's examples), so each source's batches are
  used once;
- ``round_robin``: ``p_i = 1 / k``, the sources in turn;
- ``temperature``: ``p_i ~ n_i^(1/T)`` (as multilingual models sample languages);

and explicit shares override them (those given taken as they are, the remainder shared by the rule among the
others). A source planned more steps than its batches make repeats its order, regrouped with the next seed.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

ORDER_SEED = 7_919  # (the step order's stream, apart from the sources' own groupings)


def shares(examples: list[int], rule: str, given: Optional[list] = None, temperature: float = 2.0) -> np.ndarray:
    """Each source's share of an epoch's steps (summing to 1): the rule's on ``examples`` (each source's count),
    overridden where ``given`` holds a share (None elsewhere)."""
    n = np.asarray(examples, dtype=np.float64)
    if rule == "proportional":
        base = n
    elif rule == "round_robin":
        base = np.ones_like(n)
    elif rule == "temperature":
        base = n ** (1.0 / temperature)
    else:
        raise ValueError(f"unknown mixing rule {rule!r}")
    base = base / base.sum()
    given = given or [None] * len(n)
    fixed = np.array([g is not None for g in given])
    if fixed.all():
        out = np.array([float(g) for g in given])
        return out / out.sum()
    out = np.where(fixed, [float(g) if g is not None else 0.0 for g in given], 0.0)
    rest = 1.0 - out.sum()
    free = np.where(fixed, 0.0, base)
    return out + rest * free / free.sum()


def planned_steps(own_steps: list[int], share: np.ndarray) -> np.ndarray:
    """Each source's steps in an epoch of ``sum(own_steps)`` steps at ``share``: the largest remainders rounded up,
    so each is within one step of ``share * total`` and they sum to the total."""
    total = int(sum(own_steps))
    exact = np.asarray(share, dtype=np.float64) * total
    out = np.floor(exact).astype(np.int64)
    short = total - int(out.sum())
    for i in np.argsort(-(exact - out), kind="stable")[:short]:
        out[i] += 1
    return out


def step_sources(counts: np.ndarray, rule: str, seed: int, epoch: int) -> np.ndarray:
    """Which source each step of the epoch takes (``counts[i]`` steps of source i): in turn for ``round_robin``
    (a source whose steps are used drops out of the turn), else a seeded shuffle."""
    if rule == "round_robin":
        left, order = np.array(counts, dtype=np.int64), []
        while left.sum():
            for i in range(len(left)):
                if left[i]:
                    order.append(i)
                    left[i] -= 1
        return np.asarray(order, dtype=np.int64)
    order = np.repeat(np.arange(len(counts)), counts)
    np.random.default_rng([seed, ORDER_SEED, epoch]).shuffle(order)
    return order


def mix(batches: list[np.ndarray], order: np.ndarray, world_size: int) -> np.ndarray:
    """One epoch's batches (``num_steps * world_size`` rows of row ids) from each source's own (``batches[i]``, in
    its order, with enough rows for its steps): step ``s`` takes the next ``world_size`` of source ``order[s]``'s."""
    taken = [0] * len(batches)
    rows = []
    for source in order:
        start = taken[source]
        rows.append(batches[source][start:start + world_size])
        taken[source] += world_size
    width = max((b.shape[1] for b in batches if len(b)), default=0)
    return np.concatenate(rows) if rows else np.zeros((0, width), dtype=np.int64)


def source_of(ids: np.ndarray, offsets: np.ndarray) -> int:
    """The source a batch's row ids belong to (``offsets``: each source's first row id, ascending)."""
    return int(np.searchsorted(offsets, int(np.asarray(ids)[0]), side="right") - 1)
