"""The Ray session of a command: the cluster in RAY_ADDRESS joined, or a private local one started on free
ports; the objects a worker waits for, with a bound; this process's Ray Data settings."""

from __future__ import annotations

import logging
import os
from typing import Optional


def ensure_ray(num_cpus: Optional[int] = None) -> bool:
    """Connect to the cluster in RAY_ADDRESS if set (``ray job submit``; ``auto``: the one ``ray start``
    started on this machine), else start a private local one: never another process's cluster found
    by chance (``ray.init()`` alone joins the newest ``ray start`` / test cluster on the machine, where
    this run's CPU settings are refused). True when it started the private one (whose resources are
    this machine's for good: no autoscaler adds any)."""
    import ray

    if ray.is_initialized():
        return False
    # logging_level WARNING: Ray's "Connecting to existing Ray cluster" / "Started a local Ray
    # instance" are not lines a raycse user needs (an error must stay the one line that names it)
    from raycse.platform import interrupts, private_ray, processes

    if os.environ.get("RAY_ADDRESS"):
        from raycse.platform.joining import join_cluster

        join_cluster(os.environ["RAY_ADDRESS"])
        processes.note_ray_joined()
        interrupts.reinstall()  # (ray.init put its own SIGTERM handler in)
        return False
    attempts = ray_start_attempts()
    before = processes.descendants(os.getpid())  # (the caller's own children: not Ray's to end)
    for attempt in range(1, attempts + 1):
        try:
            start_local_ray(num_cpus, log_to_driver=True, logging_level=logging.WARNING,
                            object_store_memory=int(os.environ.get("RAYCSE_OBJECT_STORE_BYTES", 1 << 30)))
            processes.note_ray_joined()
            interrupts.reinstall()
            processes.record_own_ray(before, private_ray.stop)  # (what a later command ends if this one is killed)
            return True
        except private_ray.StartTimedOut as exc:
            if attempt == attempts:
                from raycse.errors import ResourceError

                raise ResourceError(f"{exc}, {attempts} time(s): the machine is too loaded; retry when it is "
                                    f"quieter, or set RAYCSE_RAY_START_ATTEMPTS={attempts + 2} to try more "
                                    f"often") from None
            print(f"[raycse] Ray's local node did not start (attempt {attempt} of {attempts}); trying again",
                  flush=True)
    return True


def ray_start_attempts() -> int:
    """How many times a private local Ray is started before a start-up timeout is the run's error
    (RAYCSE_RAY_START_ATTEMPTS, default 2: Ray's own wait for its node is a fixed 30 s)."""
    from raycse.errors import ConfigError

    value = os.environ.get("RAYCSE_RAY_START_ATTEMPTS", "2")
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"RAYCSE_RAY_START_ATTEMPTS must be a whole number >= 1, got {value!r}")
    return int(value)


# `ray.init` options that are the node's (given to `ray start`); the others are the driver's
NODE_OPTIONS = ("object_store_memory", "num_gpus", "resources")


def start_local_ray(num_cpus: Optional[int] = None, **init_kwargs) -> None:
    """Start a private local Ray with raycse's settings (``ensure_ray``'s, and the test suite's) on
    free ports (raycse.platform.private_ray), and connect this process to it. ``init_kwargs`` are
    ``ray.init``'s: :data:`NODE_OPTIONS` go to the node, the rest to the driver's ``ray.init``."""
    import atexit

    import ray

    from raycse.platform import compat, private_ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray Train starts a PreemptionWatcher actor per fit to follow node drains (spot nodes of an
    # autoscaling cluster). A local cluster has none to drain, and the actor's process costs ~3
    # CPU-seconds per fit (a Tune trial makes one fit per seed). Workers inherit this from here.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    # A private Ray reports no usage: with it on, Ray Data's usage collector polls a Prometheus at
    # localhost:9090 from the driver during every execution (on a shared machine, someone else's port).
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from raycse.platform.interrupts import sigterm_as_interrupt

    node = {k: init_kwargs.pop(k) for k in NODE_OPTIONS if init_kwargs.get(k) is not None}
    compat.import_before_log_thread()
    private = private_ray.start(num_cpus, {"num_workers_soft_limit": worker_soft_limit(num_cpus)}, node)
    # registered before ray.init's own exit hook, so it runs after it: the driver leaves, then its Ray ends
    atexit.register(private_ray.stop)
    try:
        with sigterm_as_interrupt():
            ray.init(address=private.address, **{**private_driver_options(private.dashboard_port), **init_kwargs})
    except BaseException:
        private_ray.stop()
        raise


# Worker processes a Train fit brings up besides its workers' (which hold a CPU each): controller,
# synchronization, dataset manager, placement-group cleaners, Ray Data's stats and autoscaling
# actors; in Tune also the trial, its score queue and each seed's driver task. Counted on a 2-CPU box.
FIT_HELPER_PROCESSES = 10


def worker_soft_limit(num_cpus: Optional[int] = None) -> int:
    """Ray's ``num_workers_soft_limit`` for a private cluster.

    Ray keeps idle workers only while all its workers, actors included, number at most the CPUs: a
    fit's CPU-less helper actors pushed the idle ones over, so every Ray Data task of the next fit
    started a new Python process (~3 CPU-seconds on 2 cores), and every Tune trial's seed task
    imported raycse again. Room for the helpers of as many fits as there are CPUs keeps them; the idle
    workers kept are still at most as many as ran at once."""
    return (num_cpus or os.cpu_count() or 1) * (1 + FIT_HELPER_PROCESSES)


def private_driver_options(dashboard_port: int) -> dict:
    """``ray.init`` options for the driver of a private cluster whose own processes find it.

    Why: Ray Train's PlacementGroupCleaner asks the state API whether its controller is alive, and
    the state API of a process without RAY_ADDRESS picks *a* Ray instance on the machine. With a
    second one running (another user's run, a test cluster) it asked the wrong one, found no such
    controller, and removed the live run's placement group: its workers were killed mid-step. Every
    process of this job is told the dashboard (the state API's server; on 127.0.0.1 only) through
    RAY_API_SERVER_ADDRESS in the job-wide runtime env."""
    return {"runtime_env": {"env_vars": {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard_port}"}}}


# A fit's objects that the driver put before it (the scoring data, the batch layouts): a worker
# waits for each at most this long, then the fit fails in one line instead of hanging.
OBJECT_WAIT_S = 300.0


def fetch(ref, what: str):
    """``ray.get(ref)`` within :data:`OBJECT_WAIT_S`; a TimeoutError naming ``what`` after it."""
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        return ray.get(ref, timeout=OBJECT_WAIT_S)
    except GetTimeoutError:
        raise TimeoutError(f"this worker waited {OBJECT_WAIT_S:g} s for {what} from the driver and got nothing; "
                           f"check that the driver and the object store's node are alive") from None


def cluster_cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", os.cpu_count() or 1))


def setup_ray_data(progress_bars: bool = True) -> None:
    """This process's Ray Data settings (datasets carry them to the tasks they start).

    Ray Data logs every execution plan at INFO: keep warnings. Train workers also drop the progress
    bars (their data is already materialized; the bar only repeats itself in the log). No shuffle
    setting: batches travel as row ids (raycse.grouping.layout), so no groupby or sort runs (the
    layout's groupby used to, where Ray 2.60's SHUFFLE_V2 default started aggregator processes).
    """
    import logging

    from ray.data.context import DataContext

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ctx = DataContext.get_current()
    if not progress_bars:
        ctx.enable_progress_bars = False
