"""Every Train run ends with the resources it holds: a registry of runs and a bounded release.

Why: Ray Train removes a run's placement group when its controller shuts down, and its detached
``PlacementGroupCleaner`` is meant to remove it when the controller dies instead. A Tune trial that
ASHA stops ends its seeds' runs only by owner death (trial actor -> seed task -> controller), and
with the CPUs busy at that moment two such groups were seen to stay CREATED for good: the next
trial's runs waited for those CPUs for ever. So raycse ends its runs itself.

- Each run's controller registers itself, and each placement group it starts, in a
  :class:`RunRegistry` actor under a key (``TRIAL_ID/seedS`` in Tune, one key per ``train()``; the
  ``train()`` calls of one driver share its registry).
- Whoever ends a run (the Tune driver when a trial ends, before the next trial is offered its
  CPUs; ``train()`` after every ``fit``) calls :func:`release`: ask each controller to abort
  (it shuts its workers down and removes its group), wait a bounded time, kill what is left,
  remove every registered group still there, and fail naming the groups that would not go.
- A key that was closed (its trial ended) refuses new runs: a controller that starts under it
  aborts itself at once.

On every Ray raycse supports: where Ray Train V2 has its controller and worker-group callbacks
(raycse.platform.compat), a run is registered as its controller starts and its group as it is created; where it
has not, the controller at its first report (the public ``ray.train.UserCallback``). Either way rank 0
registers its own group as the training function starts (``ray.util.get_current_placement_group``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import ray

from raycse.errors import ResourceError
from raycse.platform import compat
from raycse.platform.capacity import held_resources

# How long the release waits for controllers to abort and groups to go beyond the worker start
# timeout (a controller blocked starting its workers handles the abort only after that attempt).
RELEASE_MARGIN_S = 30.0


class ReleaseError(RuntimeError):
    """A run's placement groups were still held after the release's bound."""


class WorkerStartError(ResourceError):
    """A run could not get its workers within its bounded attempts."""


@dataclass
class RunEntry:
    controller_id: str
    controller: object  # ActorHandle of the run's TrainController
    groups: list = field(default_factory=list)  # ray.util.placement_group.PlacementGroup


class RunRegistry:
    """Actor: key -> the Train runs started under it. Small state, no CPUs."""

    def __init__(self):
        self._runs: dict[str, dict[str, RunEntry]] = {}
        self._closed: set[str] = set()
        self._steps: dict[str, int] = {}

    def note_step(self, key: str, step: int) -> None:
        """Rank 0's latest logged step of the run ``key`` (said when the run is interrupted)."""
        self._steps[key] = max(step, self._steps.get(key, 0))

    def last_step(self, key: str) -> Optional[int]:
        return self._steps.get(key)

    def is_closed(self, key: str) -> bool:
        return any(key.startswith(prefix) for prefix in self._closed)

    def add_run(self, key: str, controller_id: str, controller) -> bool:
        """Record a run; False when its key was closed (the run must end at once)."""
        self._runs.setdefault(key, {})[controller_id] = RunEntry(controller_id, controller)
        return not self.is_closed(key)

    def add_group(self, key: str, controller_id: str, group) -> bool:
        """Record a run's placement group (once, whoever tells first); False when its key was closed."""
        runs = self._runs.setdefault(key, {})
        if not any(g.id == group.id for run in runs.values() for g in run.groups):
            runs.setdefault(controller_id, RunEntry(controller_id, None)).groups.append(group)
        return not self.is_closed(key)

    def runs(self, prefix: str, close: bool = False) -> list[RunEntry]:
        """The runs under keys starting with ``prefix``; ``close`` refuses runs started later."""
        if close:
            self._closed.add(prefix)
        return [e for key, entries in self._runs.items() if key.startswith(prefix) for e in entries.values()]

    def forget(self, prefix: str, controller_ids: list[str]) -> None:
        for key in [k for k in self._runs if k.startswith(prefix)]:
            for cid in controller_ids:
                self._runs[key].pop(cid, None)
            if not self._runs[key]:
                del self._runs[key]


def start_registry(name: Optional[str] = None):
    """A RunRegistry actor owned by the caller (it ends with the caller's process); ``name`` lets
    objects that are pickled and restored (Tune's callbacks) find it again with ``ray.get_actor``.
    It lives on the caller's node: anywhere else, losing a worker node could take it down with the
    run it should outlive (a node removed mid-run ended the run with ActorDiedError)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0, max_concurrency=8)(RunRegistry).options(
        name=name, scheduling_strategy=here).remote()


_DRIVER_REGISTRY: dict = {}  # (this node's id, job id) -> this process's RunRegistry


def stop_registry(registry, name: Optional[str] = None, timeout_s: float = 30) -> None:
    """End ``registry`` (a RunRegistry from :func:`start_registry`) and wait, bounded, until its
    ``name`` is free again: a driver that runs several experiments (the Python API, a notebook)
    keeps no process per experiment, and can resume one of them under the same name."""
    ray.kill(registry, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while name is not None:
        try:
            ray.get_actor(name)
        except ValueError:
            return  # gone
        if time.monotonic() > deadline:
            raise ResourceError(f"the run registry {name} did not end in {timeout_s:g} s after it was killed")
        time.sleep(0.1)


def driver_registry():
    """This driver process's RunRegistry, started on first use and kept for its later ``train()``
    calls. Why: each registry is a Ray worker process (~3 CPU-seconds to start on 2 cores, a tenth
    of a short fit); the runs under it have keys of their own, and it ends with this process. A new
    Ray session (ray.shutdown, then init) gets a new one."""
    ctx = ray.get_runtime_context()
    session = (ctx.get_node_id(), ctx.get_job_id())  # a new cluster's nodes have new ids
    if session not in _DRIVER_REGISTRY:
        _DRIVER_REGISTRY.clear()  # a handle of an earlier session points at nothing
        _DRIVER_REGISTRY[session] = start_registry()
    return _DRIVER_REGISTRY[session]


class _RunCallbacks:
    """What records a Train run in a RunRegistry, on the controller: the controller itself, and each
    placement group it starts (:func:`register_run` gives it the base classes Ray calls)."""

    def __init__(self, registry, key: str):
        self.registry, self.key = registry, key
        self.controller_id: Optional[str] = None

    def _register_controller(self) -> None:
        ctx = ray.get_runtime_context()
        self.controller_id = ctx.get_actor_id()
        me = ctx.current_actor
        if not ray.get(self.registry.add_run.remote(self.key, self.controller_id, me), timeout=60):
            # its trial already ended: do not take any CPUs (the abort runs once the loop is free)
            me.abort.remote()

    def after_controller_start(self, train_run_context) -> None:  # ControllerCallback
        self._register_controller()

    def after_worker_group_start(self, worker_group) -> None:  # WorkerGroupCallback
        group = compat.worker_group_placement_group(worker_group)
        if group is not None:  # (else rank 0 registers it)
            ray.get(self.registry.add_group.remote(self.key, self.controller_id, group), timeout=60)

    def after_report(self, run_context, metrics, checkpoint) -> None:  # UserCallback, the public fallback
        if self.controller_id is None:
            self._register_controller()


class PublicRegisterRun(_RunCallbacks, compat.train_user_callback()):
    """On the public ``UserCallback``: the controller is recorded at the run's first report."""


_TRAIN_HOOKS = compat.train_callback_bases()
if _TRAIN_HOOKS is not None:
    class RegisterRun(_RunCallbacks, *_TRAIN_HOOKS):
        """On Ray Train's controller hooks: the controller as it starts, each group as it is created."""
else:  # pragma: no cover - depends on the installed Ray
    RegisterRun = PublicRegisterRun


def register_run(registry, key: str, public_only: bool = False) -> _RunCallbacks:
    """The callback (for ``RunConfig(callbacks=...)``) that records each Train run started under ``key``
    in ``registry``: :class:`RegisterRun`, or (``public_only``) :class:`PublicRegisterRun`."""
    return (PublicRegisterRun if public_only else RegisterRun)(registry, key)


def register_own_group(progress: Optional[tuple]) -> None:
    """Rank 0's record of the placement group its Train run's workers hold, under the run's key
    (``progress`` = (registry, key), or None outside a raycse run); fails where that key was closed."""
    if progress is None:
        return
    group = ray.util.get_current_placement_group()
    if group is None:
        return
    registry, key = progress
    if not ray.get(registry.add_group.remote(key, f"group-{group.id.hex()}", group), timeout=60):
        raise ReleaseError(f"the Train run under {key} started after its trial ended")


def _group_state(group) -> str:
    try:
        return ray.util.placement_group_table(group).get("state", "REMOVED")
    except Exception:  # noqa: BLE001 - an unknown group is gone
        return "REMOVED"


def end_runs(entries: list[RunEntry], timeout_s: float) -> None:
    """Abort each run's controller, wait up to ``timeout_s``, kill the rest and remove every group
    still present; raises :class:`ReleaseError` naming the groups that did not go."""
    deadline = time.monotonic() + timeout_s
    aborts = [e.controller.abort.remote() for e in entries if e.controller is not None]
    if aborts:  # abort returns when a finished run's controller is told, or fails as an aborted one exits
        ray.wait(aborts, num_returns=len(aborts), timeout=max(0.0, deadline - time.monotonic()))
    for e in entries:
        if e.controller is not None:
            ray.kill(e.controller, no_restart=True)
    groups = [g for e in entries for g in e.groups]
    for g in groups:
        if _group_state(g) != "REMOVED":
            try:
                ray.util.remove_placement_group(g)
            except Exception:  # noqa: BLE001 - removed meanwhile; checked below
                pass
    while True:
        left = [(g.id.hex(), state) for g in groups if (state := _group_state(g)) != "REMOVED"]
        if not left:
            return
        if time.monotonic() >= deadline:
            raise ReleaseError(f"placement group(s) {', '.join(f'{i} ({s})' for i, s in left)} still held "
                               f"{timeout_s:g} s after their Train run ended; remove them with "
                               f"ray.util.remove_placement_group or restart the cluster")
        time.sleep(0.2)


def release(registry, prefix: str, timeout_s: float, close: bool = False) -> int:
    """End every run registered under ``prefix`` (see :func:`end_runs`) and forget them; returns
    how many runs there were. ``close``: runs that start under ``prefix`` later end at once."""
    entries = ray.get(registry.runs.remote(prefix, close), timeout=60)
    end_runs(entries, timeout_s)
    ray.get(registry.forget.remote(prefix, [e.controller_id for e in entries]), timeout=60)
    return len(entries)


def worker_start_error(error: BaseException, num_workers: int, resources: dict, timeout_s: float,
                       attempts: int) -> Optional[WorkerStartError]:
    """A clear error when ``error`` (from ``fit``) is Ray Train giving up on starting its workers."""
    cause = getattr(error, "controller_failure", error)
    if not compat.is_worker_start_failure(cause):
        return None
    need = ", ".join(f"{v:g} {k}" for k, v in resources.items())
    return WorkerStartError(
        f"the Train run could not start its {num_workers} worker(s) x {need} in {attempts} attempt(s) of "
        f"{timeout_s:g} s; {held_resources()}. Free the cluster, lower train.num_workers / "
        f"train.cpus_per_worker, or raise train.worker_start_timeout_s")
