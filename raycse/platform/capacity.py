"""The cluster's capacity as a run sees it: bounded waits for CPUs, what holds them, and what the cluster
can grow to (an autoscaler's node types).

Below raycse.data and raycse.train: the corpus read, the training driver and the release of runs
all wait for, or name, the cluster's CPUs. The caller that owns a wait's setting gives its bound."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

from raycse.errors import ResourceError


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


@dataclass(frozen=True)
class CpuWait:
    """How long a corpus read waits for a free CPU, and the setting that raises the bound (named in the
    error). The caller that owns the setting builds it (a training run: its workers' own wait), so the
    data layer only waits."""

    seconds: float
    knob: Optional[str] = None

    def wait(self, purpose: str) -> None:
        wait_for_a_cpu(self.seconds, purpose, self.knob)


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


# ----------------------------------------------------------------------------- what the cluster can grow to
@dataclass(frozen=True)
class NodeType:
    """A kind of node the cluster has or can add: its CPUs and GPUs, and how many of it can be up at once."""

    name: str
    cpus: float
    gpus: float
    max_count: float  # math.inf: no limit


@dataclass(frozen=True)
class Ceiling:
    """The most the cluster can hold: node types up to their counts (an autoscaler's), or the nodes up now."""

    types: tuple
    source: str  # said in the messages that use it
    max_workers: float = math.inf  # an autoscaler's cap on all worker nodes together (the head apart)
    grows: bool = False  # an autoscaler can add nodes

    def total(self, resource: str) -> float:
        """CPU or GPU of the most the cluster can hold: each type at its count, within ``max_workers``."""
        per_node = [(getattr(t, _FIELD[resource]), t.max_count) for t in self.types]
        if self.grows:  # the head (count 1, listed first) always; the workers within the cap, richest first
            head, workers = per_node[0], sorted(per_node[1:], reverse=True)
            left, total = self.max_workers, head[0]
            for amount, count in workers:
                take = min(count, left)
                total, left = total + amount * take, left - take
            return total
        return sum(amount * count for amount, count in per_node)

    def largest(self, resource: str) -> float:
        return max((getattr(t, _FIELD[resource]) for t in self.types if t.max_count > 0), default=0.0)

    def cpus_per_gpu(self) -> Optional[float]:
        """The fewest CPUs per GPU of any node type with GPUs (what a GPU share may ask for and still pack)."""
        ratios = [t.cpus / t.gpus for t in self.types if t.gpus > 0 and t.max_count > 0]
        return min(ratios) if ratios else None

    def describe(self) -> str:
        kinds = ", ".join(f"{t.name} {_count(t.max_count)}x ({t.cpus:g} CPU" + (f", {t.gpus:g} GPU)" if t.gpus else ")")
                          for t in self.types)
        cap = f", at most {self.max_workers:g} worker node(s)" if self.grows and math.isfinite(self.max_workers) else ""
        return f"{kinds}{cap}; {self.source}"


_FIELD = {"CPU": "cpus", "GPU": "gpus"}


def _count(n: float) -> str:
    return "any" if math.isinf(n) else f"{n:g}"


def worker_cpu_cap(ceiling: Ceiling, gpu_share: float) -> Optional[float]:
    """The most CPUs a Train worker may reserve and still fit a node: for a GPU worker, what the GPU node
    types have per GPU share (0.5 GPU of a 2-CPU, 1-GPU node: 1 CPU, so two such workers pack it); else
    the largest node's CPUs. None where the ceiling knows no node."""
    per_gpu = ceiling.cpus_per_gpu()
    if gpu_share and per_gpu:
        return per_gpu * gpu_share
    return ceiling.largest("CPU") or None


def default_cpus_per_worker(num_workers: int, gpu_share: float, ceiling: Ceiling, cpus_now: float) -> float:
    """CPUs each Train worker reserves where train.cpus_per_worker is not set: the cluster's CPUs now shared
    between the workers (whole CPUs, at least 1), within :func:`worker_cpu_cap`. Why the cap: on a CPU head
    with two 2-CPU GPU nodes up, 6 CPUs / 2 workers asked each GPU worker for 3 CPUs, a node no type can be,
    and the run waited out its worker start timeout."""
    fair = max(1, int(cpus_now) // num_workers)
    cap = worker_cpu_cap(ceiling, gpu_share)
    return fair if cap is None or cap >= fair else max(0.01, math.floor(100 * cap) / 100)


def cluster_ceiling() -> Ceiling:
    """What the connected cluster can grow to: Ray's own record of the autoscaler's node groups (the cluster
    config Ray Train reads), else the config of the autoscaler running beside this driver (``ray job submit``
    runs the driver on the head, where ``ray up``'s or ``ray start --autoscaling-config``'s monitor runs),
    else the nodes up now."""
    return _from_ray_cluster_config() or _from_autoscaler_config() or _nodes_up_now()


def _from_ray_cluster_config() -> Optional[Ceiling]:
    from raycse.platform import compat

    groups = compat.autoscaler_node_groups()
    if groups is None:
        return None
    types = tuple(NodeType(g.name, float(g.resources.get("CPU", 0)), float(g.resources.get("GPU", 0)),
                           math.inf if g.max_count == -1 else float(g.max_count)) for g in groups)
    return Ceiling(types, "Ray's cluster config (the autoscaler's node groups)")


def _from_autoscaler_config() -> Optional[Ceiling]:
    path = autoscaler_config_path()
    if path is None:
        return None
    import yaml

    from raycse.platform import safe_yaml

    try:
        with open(path, encoding="utf-8") as f:
            raw = safe_yaml.load(f)
    except (OSError, yaml.YAMLError):
        return None
    try:
        return ceiling_of_config(raw, f"the autoscaler's config {path}")
    except (TypeError, ValueError, AttributeError):  # not numbers where the autoscaler reads numbers
        return None


def ceiling_of_config(raw, source: str) -> Optional[Ceiling]:
    """The ceiling a cluster launcher YAML (``available_node_types``) describes; None where it names no node
    type or no head among them, or a type without its CPUs (a cloud provider fills those in only when it
    launches the node)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("available_node_types"), dict):
        return None
    head_name, types = raw.get("head_node_type"), []
    if head_name not in raw["available_node_types"]:
        return None
    for name, spec in raw["available_node_types"].items():
        resources = (spec or {}).get("resources") or {}
        if "CPU" not in resources:
            return None
        count = 1.0 if name == head_name else float((spec or {}).get("max_workers", raw.get("max_workers", 0)))
        types.append(NodeType(str(name), float(resources["CPU"]), float(resources.get("GPU", 0)), count))
    types.sort(key=lambda t: t.name != head_name)  # the head first
    cap = float(raw.get("max_workers", math.inf))
    return Ceiling(tuple(types), source, max_workers=cap, grows=any(t.max_count > 0 for t in types[1:]) and cap > 0)


def autoscaler_config_path(gcs_address: Optional[str] = None) -> Optional[str]:
    """The ``--autoscaling-config`` file of the autoscaler (Ray's monitor process) of the cluster at
    ``gcs_address`` (default: the connected one), where that process runs on this machine; None elsewhere,
    or without an autoscaler. The monitor is known by its command line, which names the GCS address."""
    import psutil
    import ray

    try:  # (the port alone: the monitor may name the head by another of this machine's addresses)
        port = (gcs_address or ray.get_runtime_context().gcs_address).rsplit(":", 1)[1]
    except Exception:  # noqa: BLE001 - not connected: no cluster to look for
        return None
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        args = proc.info.get("cmdline") or []
        if not any(a.endswith("monitor.py") for a in args) or not any(
                a.startswith("--gcs-address=") and a.rsplit(":", 1)[-1] == port for a in args):
            continue
        for arg in args:
            if arg.startswith("--autoscaling-config="):  # (as `ray start` was given it: relative to its directory)
                return os.path.join(proc.info.get("cwd") or "", os.path.expanduser(arg.split("=", 1)[1]))
    return None


def _nodes_up_now() -> Ceiling:
    import ray

    types = tuple(NodeType(n["NodeManagerAddress"] + (" (head)" if "node:__internal_head__" in n["Resources"] else ""),
                           float(n["Resources"].get("CPU", 0)), float(n["Resources"].get("GPU", 0)), 1.0)
                  for n in ray.nodes() if n.get("Alive"))
    return Ceiling(types, "the nodes up now (no autoscaler's config found)")
