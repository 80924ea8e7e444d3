"""The cluster's capacity as a run sees it: bounded waits for CPUs and what holds them.

Below raycse.data and raycse.train: the corpus read, the training driver and the release of runs
all wait for, or name, the cluster's CPUs. Its default wait comes from TrainConfig's defaults."""

from __future__ import annotations

from typing import Optional

from raycse.config import TrainConfig
from raycse.errors import ResourceError

# How long a corpus read waits for a CPU by default: the workers' default wait for their start
# (train.worker_start_timeout_s x train.worker_start_attempts, 180 s); a training run passes its own.
DEFAULT_CPU_WAIT_S = TrainConfig.worker_start_timeout_s * TrainConfig.worker_start_attempts


class ClusterBusyError(ResourceError):
    """No CPU of the cluster came free for the run's data tasks within the bound."""


def _probe() -> None:
    return None


def wait_for_a_cpu(timeout_s: float, purpose: str, knob: Optional[str] = None) -> None:
    """Wait at most ``timeout_s`` until the cluster can run a 1-CPU task, as the corpus read's tasks need.

    Why: Ray Data waits for CPUs without a bound (its no-progress guard skips shuffles, and raycse's
    read tasks are plain tasks): on a cluster whose CPUs another job held, a run hung in its corpus
    read for ever. A probe task rather than a look at the free CPUs: a pending task also asks an
    autoscaling cluster for a node. ``knob``: the setting that raises the bound, named in the error."""
    import ray

    probe = ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="DEFAULT")(_probe).remote()
    if ray.wait([probe], timeout=timeout_s)[0]:
        return
    ray.cancel(probe, force=True)
    raise ClusterBusyError(f"no CPU of the Ray cluster came free in {timeout_s:g} s to {purpose}; {held_resources()}. "
                           "Free the cluster or add a node" + (f", or raise {knob}" if knob else ""))


def held_resources() -> str:
    """What holds the cluster's CPUs now: free/total CPUs and every live placement group."""
    import ray

    total, free = ray.cluster_resources(), ray.available_resources()
    groups = []
    for pid, info in ray.util.placement_group_table().items():
        if info.get("state") in ("CREATED", "PENDING", "RESCHEDULING"):
            cpus = sum(b.get("CPU", 0) for b in info.get("bundles", {}).values())
            groups.append(f"{pid[:12]} {info['state'].lower()} {cpus:g} CPU")
    return (f"{free.get('CPU', 0):g} of {total.get('CPU', 0):g} CPUs free; placement groups: "
            + (", ".join(groups) if groups else "none"))
