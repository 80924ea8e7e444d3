"""The only places raycse reaches into what Ray, its W&B integration or torch mark as internal.

raycse runs on a range of Ray releases (pyproject.toml), so nothing else in it imports a private name
(``tests/test_compat.py`` reads the source to keep it so). Each lookup here is by feature: the name is
looked for, never the version compared, and each has a working path when it is gone:

- Ray Train V2's controller and worker-group callbacks (:func:`train_callback_bases`): the run registry
  learns of a run's controller and placement group as they start. Without them it learns of the
  controller from the public ``ray.train.UserCallback`` at the run's first report, and of the group from
  rank 0's ``ray.util.get_current_placement_group()`` (raycse.platform.release).
- Ray Train's names for "the workers could not start" (:func:`is_worker_start_failure`): compared by
  class name, imported from nowhere; without them Ray's own error is shown.
- Ray Train's per-report log line (:func:`quiet_train_report_logger`): its logger found by name.
- Ray's per-checkpoint log line (:func:`quiet_checkpoint_logger`): its storage modules' loggers by name.
- Ray's record of the autoscaler's node groups (:func:`autoscaler_node_groups`): without it the
  cluster ceiling comes from the autoscaler's config or the nodes up now (raycse.platform.capacity).
- Ray's W&B logging actor (:func:`wandb_logging_actor`): without it, Ray's plain callback.
- oneDNN's linear (:func:`onednn_linear`): without it, PyTorch's own kernels.
- the module Ray's log thread imports (:func:`import_before_log_thread`): without it, nothing to do.
- torch.compile's count of the graphs it built (:func:`compiled_graph_count`): without it, None (the
  log says "?").
- torch's functional all-gather with autograd (:func:`all_gather_autograd`), the successor torch names for
  ``torch.distributed.nn.functional.all_gather`` (deprecated in torch 2.13: a FutureWarning on every worker
  of every run): without it, the older public one.
- FSDP2 (:func:`fsdp2`): public as ``torch.distributed.fsdp`` from torch 2.6, under
  ``torch.distributed._composable.fsdp`` in 2.4-2.5; without either, ``--sharding fsdp`` is refused in one line.
- torch's fake tensors (:func:`fake_tensor_mode`): the memory estimate's forward where a model's own code refuses
  the meta device; without them, no estimate for that model.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Callable, Optional


def _lookup(module: str, *names: str) -> Optional[tuple]:
    """``module``'s attributes ``names``, or None where the module or any of them is missing."""
    try:
        found = importlib.import_module(module)
        return tuple(getattr(found, n) for n in names)
    except (ImportError, AttributeError):
        return None


# what ray._private.worker's log thread imports at the driver's first log line (filter_autoscaler_events)
LOG_THREAD_IMPORT = "ray.autoscaler.v2.utils"


def import_before_log_thread() -> None:
    """Import ``ray.autoscaler`` whole, and the module Ray's log thread imports, before ``ray.init`` starts
    that thread. ``ray.autoscaler`` imports itself in a circle (its ``_private.util`` imports the package,
    whose ``sdk`` imports ``_private.util`` again); when the log thread and this thread (Ray Data's executor
    imports ``ray.autoscaler._private``) import it at once, one of them gets the half-made module:
    ``ImportError: cannot import name 'DictCount'``, which failed a job on Ray 2.55. Imported once here,
    before any other thread runs Ray, neither import is a race."""
    import ray.autoscaler.sdk  # noqa: F401 - the package whole (public)

    _lookup(LOG_THREAD_IMPORT, "is_autoscaler_v2")


def train_callback_bases() -> Optional[tuple[type, type]]:
    """Ray Train V2's ``(ControllerCallback, WorkerGroupCallback)``: hooks on the controller as it starts
    and as each worker group starts. None where this Ray has no such classes."""
    return _lookup("ray.train.v2._internal.execution.callback", "ControllerCallback", "WorkerGroupCallback")


def worker_group_placement_group(worker_group):
    """The placement group of a worker group that Ray Train's ``after_worker_group_start`` hook is given
    (where its state keeps it: a handle in newer Rays, the group itself in older), or None."""
    state = worker_group.get_worker_group_state()
    handle = getattr(state, "placement_group_handle", None)
    return getattr(handle, "placement_group", None) or getattr(state, "placement_group", None)


def train_user_callback() -> type:
    """``ray.train.UserCallback``, public in Ray Train V2; a one-line error where this Ray runs Train V1 (Ray
    before 2.51, or ``RAY_TRAIN_V2_ENABLED=0``), on which raycse's runs cannot start."""
    import ray
    import ray.train

    from raycse.errors import RaycseError

    found = getattr(ray.train, "UserCallback", None)
    if found is None:
        raise RaycseError(f"raycse runs on Ray Train V2, and this Ray ({ray.__version__}) gives Train V1: unset "
                          f"RAY_TRAIN_V2_ENABLED, or pip install 'ray[default,train,data,tune]>=2.55,<2.61'")
    return found


# The environment of a private Ray's `ray start`. From Ray 2.60 a node drains on SIGTERM, for up to
# 30 s, until its leases are returned; after a Ray Data execution they never were, so every stop
# waited out the keeper's grace and ended in SIGKILL. A private Ray has no one to drain for: 0 is
# Ray's own "stop at once" (older Rays do not read it).
PRIVATE_RAY_NODE_ENV = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


# Ray Train's errors for a worker group that could not get its resources or start in time.
WORKER_START_FAILURES = ("WorkerGroupStartupTimeoutError", "InsufficientClusterResourcesError")


def is_worker_start_failure(error: BaseException) -> bool:
    """Whether ``error`` is Ray Train giving up on starting its workers (by the class names it uses)."""
    return any(c.__name__ in WORKER_START_FAILURES for c in type(error).__mro__)


# The file whose module-level logger (named by its path) prints every report's whole metrics dict.
TRAIN_REPORT_LOGGER = os.path.join("train", "v2", "_internal", "execution", "context.py")


def quiet_train_report_logger() -> int:
    """Raise Ray Train's report logger in this process to WARNING; how many loggers matched (0 where
    this Ray has none by that name: its lines then stay)."""
    matched = [name for name in list(logging.Logger.manager.loggerDict) if name.endswith(TRAIN_REPORT_LOGGER)]
    for name in matched:
        logging.getLogger(name).setLevel(logging.WARNING)
    return len(matched)


# Ray's storage modules log one INFO line per persisted checkpoint ("Checkpoint successfully created at: ..."): a
# Tune trial's process after each rung, and Ray's log deduplication prints the last of them, in colour, after the
# command's own end (Train v1's module, which Tune's function trainables use; Train v2's)
CHECKPOINT_LOGGERS = ("ray.train._internal.storage", "ray.train.v2._internal.execution.storage")


def quiet_checkpoint_logger() -> None:
    """Raise Ray's per-checkpoint loggers in this process to WARNING (by name: a Ray without them is unchanged)."""
    for name in CHECKPOINT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def autoscaler_node_groups() -> Optional[list]:
    """The node groups of Ray's record of the cluster config (what Ray Train reads for its ceiling): each
    with ``name``, ``resources`` and ``max_count``; None where this Ray or this cluster has no record."""
    found = _lookup("ray._private.state", "state")
    if found is None or not hasattr(found[0], "get_cluster_config"):
        return None
    try:
        config = found[0].get_cluster_config()
    except Exception:  # noqa: BLE001 - an older GCS without the record: the other sources decide
        return None
    return list(config.node_group_configs) if config is not None and config.node_group_configs else None


def wandb_logging_actor() -> Optional[type]:
    """Ray's W&B logging actor class, where ``WandbLoggerCallback`` takes another through its
    ``_logger_actor_cls`` hook; None otherwise."""
    found = _lookup("ray.air.integrations.wandb", "WandbLoggerCallback", "_WandbLoggingActor")
    if found is None or not hasattr(found[0], "_logger_actor_cls"):
        return None
    return found[1]


def use_wandb_logging_actor(callback_cls: type, actor_cls: type) -> None:
    """Make ``callback_cls`` (a ``WandbLoggerCallback``) start ``actor_cls`` (a subclass of
    :func:`wandb_logging_actor`'s class) for each trial."""
    callback_cls._logger_actor_cls = actor_cls


def onednn_linear() -> Optional[Callable]:
    """oneDNN's ``a @ b.T (+ bias)`` (what inductor calls), or None where this PyTorch has no such op;
    raycse.model.onednn checks its results against ``F.linear`` before using it."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if op is None:
        return None
    return lambda a, b, bias=None: op(a, b, bias, "none", [], "")


def compiled_graph_count() -> Optional[int]:
    """How many graphs torch.compile has built in this process (dynamo's own counter; no public API
    counts them), or None where this torch does not keep it."""
    found = _lookup("torch._dynamo.utils", "counters")
    try:
        return int(found[0]["stats"]["unique_graphs"]) if found else None
    except (KeyError, TypeError, ValueError):
        return None


def all_gather_autograd(x):
    """``x`` of every worker of the default group concatenated along dimension 0, rank-major, with gradients
    carried back to the worker that produced each row (backward: a reduce-scatter of the sum). Through
    ``torch.distributed._functional_collectives.all_gather_single_autograd`` (or ``all_gather_tensor_autograd``,
    its older name) where torch has it; else ``torch.distributed.nn.functional.all_gather``."""
    import torch
    import torch.distributed as dist

    found = (_lookup("torch.distributed._functional_collectives", "all_gather_single_autograd")
             or _lookup("torch.distributed._functional_collectives", "all_gather_tensor_autograd"))
    if found is not None:
        out = found[0](x, 0, dist.group.WORLD)
        wait = _lookup("torch.distributed._functional_collectives", "wait_tensor")
        return wait[0](out) if wait is not None else out
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x), dim=0)


FSDP2_NAMES = ("fully_shard", "MixedPrecisionPolicy", "CPUOffloadPolicy", "OffloadPolicy", "FSDPModule")


def fsdp2() -> Optional[tuple]:
    """torch's FSDP2: (fully_shard, MixedPrecisionPolicy, CPUOffloadPolicy, OffloadPolicy, FSDPModule), or None where
    this torch has none."""
    return (_lookup("torch.distributed.fsdp", *FSDP2_NAMES)
            or _lookup("torch.distributed._composable.fsdp", *FSDP2_NAMES))


def fake_tensor_mode():
    """A context in which tensors have shapes, dtypes and devices but no memory (torch's FakeTensorMode), or None
    where this torch has none. For the memory estimate's forward where the meta device is refused."""
    found = _lookup("torch._subclasses.fake_tensor", "FakeTensorMode")
    return found[0](allow_non_fake_inputs=True) if found else None


def attention_implementation(model) -> Optional[str]:
    """The attention kernels a loaded Hugging Face ``model`` runs (sdpa, eager, flash_attention_2, ...): the config's
    ``_attn_implementation``, where transformers records what ``attn_implementation`` resolved to; None without one."""
    value = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return value if isinstance(value, str) else None
