"""How much of the cluster a search takes: that one trial fits what the cluster can grow to, how many trials run at
once, whether a trial's seeds train side by side, and the CPUs each Train worker reserves."""

from __future__ import annotations

import math
from typing import Optional

from raycse.errors import ConfigError
from raycse.tune.settings import TuneSettings

TRIAL_CPU = 0.01  # the trial function only coordinates; the Train workers hold the real CPUs


def preflight(run, settings: TuneSettings, need: Optional[int] = None) -> tuple[int, float, bool]:
    """That one trial of ``run`` (the space's base run, checked) fits what the cluster can grow to, before any data
    is read; returns (concurrent trials, CPUs per Train worker, seeds side by side), said in one line with why.
    Fails with the numbers instead of letting trials wait in PENDING forever. ``need``: the bytes one CPU worker of
    ``run`` needs (estimated), which bounds how many runs this machine's private Ray holds at once."""
    from raycse.platform.capacity import cluster_ceiling

    ceiling = cluster_ceiling()
    cpus, gpus = _most(ceiling, "CPU"), _most(ceiling, "GPU")
    t, k = run.train, len(settings.seeds)
    workers, per_worker, share = t.num_workers, t.cpus_per_worker, t.gpu_share  # (share: 0 without use_gpu)
    if settings.preflight:
        _check_one_trial_fits(t, ceiling, cpus, gpus)
    held = _runs_memory_holds(need, workers) if not t.use_gpu and settings.preflight else None
    parallel = settings.parallel_seeds
    if parallel is None:  # side by side unless k runs at once cannot fit
        parallel = (gpus + 1e-9 >= k * workers * share if t.use_gpu
                    else (per_worker is None or k * workers * per_worker + TRIAL_CPU <= cpus)
                    and (held is None or held[0] >= k)) or not settings.preflight
        if not parallel:
            print(f"[raycse] the {k} seeds run one after another: {k} x {workers} worker(s) do not fit the cluster "
                  f"at once", flush=True)
    runs = k if parallel else 1
    concurrent, why = settings.concurrent, "--concurrent"
    if concurrent is None:
        if t.use_gpu:  # as many trials as the GPUs hold: 1 GPU at 0.25 a worker runs 4 one-worker trials
            concurrent = _at_most(gpus / (workers * runs * share), settings.num_samples)
            why = f"{gpus:g} GPU(s) / ({runs} run(s) x {workers} worker(s) x {share:g} GPU) a trial"
        else:
            concurrent = _at_most(cpus / (runs * workers * (per_worker or 1.0) + TRIAL_CPU), settings.num_samples)
            why = f"{cpus:g} CPU(s) / ({runs} run(s) x {workers} worker(s) x {per_worker or 1.0:g} CPU) a trial"
            if held is not None and held[0] // runs < concurrent:  # (the memory holds fewer than the CPUs)
                concurrent = max(1, held[0] // runs)
                why = f"{held[1]} / ({runs} run(s) x {workers} worker(s) x {need / 2**30:.1f} GB) a trial"
    if per_worker is None:
        per_worker = _cpus_per_worker(ceiling, cpus, concurrent, runs * workers, share, settings.preflight)
    print(f"[raycse] {concurrent} trial(s) at once: {why}; the cluster: {ceiling.describe()}", flush=True)
    return concurrent, per_worker, parallel


def _runs_memory_holds(need: Optional[int], workers: int) -> Optional[tuple[int, str]]:
    """(how many runs of ``workers`` CPU workers of ``need`` bytes each this machine's memory holds at once, what
    that memory is); None where it is not known (a cluster's nodes, or no estimate)."""
    from raycse.train.memory import host_memory

    total = host_memory()
    if need is None or not need or total is None:
        return None
    return int(total // (need * workers)), f"this machine's {total / 2**30:.0f} GB"


def _most(ceiling, resource: str) -> float:
    """What the cluster can hold of ``resource``: its ceiling, or what is up now where more is up."""
    import ray

    return max(ceiling.total(resource), float(ray.cluster_resources().get(resource, 0)))


def _at_most(fit: float, num_samples: int) -> int:
    return max(1, min(num_samples, int(fit + 1e-9) if math.isfinite(fit) else num_samples))


def _check_one_trial_fits(t, ceiling, cpus: float, gpus: float) -> None:
    """One trial's Train workers fit what the cluster can grow to, and each worker fits one node."""
    workers, share, per_worker = t.num_workers, t.gpu_share, t.cpus_per_worker
    fix = "add nodes or node types the autoscaler may launch"
    if t.use_gpu and gpus < t.gpus_needed():
        raise ConfigError(f"a trial needs {t.gpus_needed()} GPU(s) ({workers} worker(s) x {share:g} GPU) but the "
                          f"cluster can hold {gpus:g} ({ceiling.describe()}); lower --num-workers or "
                          f"--gpus-per-worker, or {fix}")
    if t.use_gpu and share > ceiling.largest("GPU"):
        raise ConfigError(f"a Train worker asks for {share:g} GPU(s) and the largest node holds "
                          f"{ceiling.largest('GPU'):g} ({ceiling.describe()}); lower --gpus-per-worker, or {fix}")
    if per_worker is not None and workers * per_worker + TRIAL_CPU > cpus:
        raise ConfigError(f"a trial needs {workers} worker(s) x {per_worker:g} CPU + {TRIAL_CPU} = "
                          f"{workers * per_worker + TRIAL_CPU:g} CPUs but the cluster can hold {cpus:g} "
                          f"({ceiling.describe()}); lower --num-workers / --cpus-per-worker, or {fix}")
    if per_worker is not None and per_worker > ceiling.largest("CPU"):
        raise ConfigError(f"a Train worker asks for {per_worker:g} CPUs and the largest node holds "
                          f"{ceiling.largest('CPU'):g} ({ceiling.describe()}); lower --cpus-per-worker, or {fix}")


def _cpus_per_worker(ceiling, cpus: float, concurrent: int, workers_a_trial: int, share: float, check: bool) -> float:
    """CPUs each Train worker reserves where the run does not say: the cluster's CPUs (less the trials' own)
    shared between every worker going at once, no more than a node holds, and for a GPU share no more than
    the GPU nodes have per share (0.5 GPU on a node of 2 CPUs and 1 GPU: 1 CPU, so two such workers pack it)."""
    from raycse.platform.capacity import worker_cpu_cap

    workers_at_once = concurrent * workers_a_trial
    fair = (cpus - concurrent * TRIAL_CPU) / workers_at_once
    cap = worker_cpu_cap(ceiling, share)
    # (a GPU share's less a trial's coordinating CPU, which may land on the same node)
    bounds = [fair] + ([cap - (TRIAL_CPU if share else 0)] if cap else [])
    per_worker = math.floor(100 * min(bounds)) / 100
    if per_worker <= 0 and check:
        raise ConfigError(f"{workers_at_once} Train worker(s) at once do not fit {cpus:g} CPUs; lower --concurrent "
                          f"or --num-workers")
    return per_worker
