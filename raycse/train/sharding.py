"""How a worker holds the model it trains: whole on every worker (``ddp``: Ray Train's ``prepare_model``,
gradients averaged by DistributedDataParallel) or sharded across the workers (``fsdp``: PyTorch's FSDP2).

FSDP2 (``torch.distributed.fsdp.fully_shard``): every transformer block (the classes the Hugging Face model
names in ``_no_split_modules``, in the encoder and in any copy of it an objective keeps) becomes one group whose
parameters, gradients and AdamW moments each worker holds 1/N of; the whole module (embeddings, heads, a
trainable tau) is the last group. A block's full weights exist only while it runs (gathered before its forward
and its backward, freed after), so each worker holds about 1/N of the 16 bytes a parameter that fp32 AdamW
needs, plus one block's full weights. Parameters are ``DTensor`` shards; the optimizer, gradient clipping
and the cross-worker gather of in-batch negatives work on them unchanged.

Mixed precision: with bf16 (``--precision``), the gathered weights are cast to bf16 for compute and the
gradients reduced in fp32 (``MixedPrecisionPolicy``); the sharded master weights stay fp32. With
``train.fsdp_offload: cpu`` the shards and the optimizer step live in host memory (``CPUOffloadPolicy``).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch
from torch import nn

from raycse.platform import compat
from raycse.platform.process_state import return_large_frees

def block_names(module: nn.Module) -> set[str]:
    """The class names of the transformer blocks of every Hugging Face model inside ``module`` (their
    ``_no_split_modules``: the units that must stay whole on one device, so the units to shard by)."""
    names: set[str] = set()
    for part in module.modules():
        names.update(getattr(part, "_no_split_modules", None) or ())
    return names


def blocks(module: nn.Module) -> list[nn.Module]:
    """The modules inside ``module`` that :func:`shard` makes groups of, innermost first (a block never
    holds another: a model naming both an outer and an inner class keeps the inner ones)."""
    names = block_names(module)
    found = [m for m in module.modules() if type(m).__name__ in names]
    inner = [m for m in found if not any(o is not m and o in found for o in m.modules())]
    return inner


def mixed_precision(dtype: torch.dtype):
    """FSDP2's policy for a run computing in ``dtype``: weights cast to it for compute, gradients reduced in
    fp32 (a bf16 sum over many workers loses the small updates); fp32: no casts."""
    MixedPrecisionPolicy = compat.fsdp2()[1]
    if dtype == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard(module: nn.Module, device: torch.device, world_size: int, dtype: torch.dtype,
          offload: str = "none") -> nn.Module:
    """``module`` sharded in place across the ``world_size`` workers of the default process group: each
    block of :func:`blocks`, then the whole (FSDP2). ``module`` arrives on the CPU (FSDP2 moves each shard to
    ``device`` as it shards it) or on the meta device (to be allocated and filled from rank 0 afterwards,
    :func:`shard_from_rank0`)."""
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, _, CPUOffloadPolicy, OffloadPolicy, _ = compat.fsdp2()

    if device.type == "cuda":  # (NCCL's communicator is bound to the current device)
        torch.cuda.set_device(device)
    else:  # (the blocks' gathered weights and gradients, freed each step, go back to the OS)
        return_large_frees()
    mesh = init_device_mesh(device.type, (world_size,))
    options = {"mesh": mesh, "mp_policy": mixed_precision(dtype),
               # (pinned host memory, for fast copies to the GPU, needs CUDA)
               "offload_policy": (CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload == "cpu"
                                  else OffloadPolicy())}
    for block in blocks(module):
        fully_shard(block, **options)
    fully_shard(module, **options)
    return module


def check_available() -> None:
    """Refuse, in one line, ``--sharding fsdp`` on a torch without FSDP2."""
    if compat.fsdp2() is None:
        from raycse.errors import ConfigError

        raise ConfigError(f"--sharding fsdp needs PyTorch's FSDP2 (torch >= 2.4); this torch is {torch.__version__}: "
                          f"upgrade torch, or use --sharding ddp")


def shard_from_rank0(build: Callable[[bool], nn.Module], device: torch.device, rank: int, world_size: int,
                     dtype: torch.dtype, offload: str = "none") -> nn.Module:
    """A sharded module whose weights only rank 0 reads: ``build(True)`` there, ``build(False)`` (the transformer on
    the meta device) elsewhere; every rank shards it (:func:`shard`), the others allocate their shards, and rank 0's
    whole state is sent out shard by shard (``set_model_state_dict(broadcast_from_rank0=True)``), its buffers too
    (those outside the state dict, e.g. rotary frequencies, included). So no rank but 0 ever holds the whole model."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    module = build(rank == 0)
    whole = dict(module.state_dict()) if rank == 0 else {}  # (rank 0's tensors, kept until they are sent)
    shard(module, device, world_size, dtype, offload)
    if rank != 0:  # (offloaded shards live in host memory; buffers stay where the forward runs, as rank 0's do)
        module.to_empty(device=torch.device("cpu") if offload == "cpu" else device)
        for part in module.modules():
            for name, buffer in part.named_buffers(recurse=False):
                setattr(part, name, buffer.to(device))  # (an existing buffer: replaced, its persistence kept)
    set_model_state_dict(module, whole, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del whole
    for buffer in module.buffers():  # (not sharded: each rank holds them whole)
        dist.broadcast(buffer.data, src=0)
    return module


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module`` went through :func:`shard` (FSDP2 makes its class a subclass of ``FSDPModule``)."""
    found = compat.fsdp2()
    return found is not None and isinstance(module, found[4])


def local_bytes(module: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> int:
    """The bytes this worker holds of ``module``'s parameters (its shard of each) and of ``optimizer``'s state."""
    def held(t: torch.Tensor) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    total = sum(held(p) for p in module.parameters())
    if optimizer is not None:
        total += sum(held(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))
    return total


@contextlib.contextmanager
def gathered(module: nn.Module):
    """The root group's whole weights (embeddings, pooler, heads) on every rank while the body runs, for a sharded
    ``module`` used through a part of it (the encoder's ``encode``), not through its own forward, which gathers
    them itself; a no-op for a whole module. Every rank enters it (the gather is a collective)."""
    if not is_sharded(module):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


def broadcast_from_rank0(value):
    """Rank 0's ``value`` (a picklable object) on every rank of the default group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
