"""What a worker trains: the encoder and objective as one module, on the device Ray gave it, and
its optimizer and learning-rate schedule."""

from __future__ import annotations

import os
from typing import Callable, Optional

import torch
from torch import nn

from raycse.config import RunConfig
from raycse.errors import ConfigError, ModelError
from raycse.model.adapters import add_lora, trainable_line
from raycse.model.encoder import PROMPT_LEFT_OUT, Encoder, check_checkpointing
from raycse.model.loading import attention_kwargs, default_prompt_of, embedding_width_of, empty_backbone_of
from raycse.model.unpad import use_fast_dropout
from raycse.objectives.base import LossOutput, Objective
from raycse.objectives.matryoshka import check_fits
from raycse.platform import compat
from raycse.train.sharding import check_available

GPU_STAND_IN = "RAYCSE_GPU_STAND_IN"  # =cpu: workers holding declared GPUs train on the CPU (tests)


class TrainModule(nn.Module):
    """Encoder + objective as one module, so DDP sees every trainable parameter (heads, tau)."""

    def __init__(self, encoder: Encoder, objective: Objective):
        super().__init__()
        self.encoder = encoder
        self.objective = objective

    def forward(self, batch: dict) -> LossOutput:
        return self.objective(self.encoder, batch)


def attention_of(run: RunConfig) -> dict:
    """The attention kernels the run's model loads with (``--attention``; auto picks flash attention only where the
    run computes in 16 bits on GPUs, the one place its kernels run)."""
    return attention_kwargs(run.model.attention, run.train.use_gpu and run.train.precision != "fp32")


def build_module(run: RunConfig, weights: bool = True) -> TrainModule:
    """The encoder and objective a worker trains. ``weights`` False: the encoder's transformer on the meta device,
    its weights not read (a sharded worker that receives its shards from rank 0; with LoRA, read all the same: peft
    wraps real modules)."""
    encoder = Encoder.from_pretrained(run.model.name_or_path, pooling=run.model.pooling,
                                      mlp_head=run.model.resolved_mlp_head,
                                      trust_remote_code=run.model.trust_remote_code, dtype=run.model.dtype,
                                      weights=weights or bool(run.model.lora), attention=attention_of(run))
    encoder.length_buckets = length_buckets(run)
    # compiled: the padded forward, PyTorch's dropout and inductor's own CPU kernels; raycse's unpadding
    # (data-dependent row counts), drawn masks (dtype views) and the oneDNN probe (file reads, a Python
    # mode) would break its graph in every layer
    # sharded (FSDP2): a block's weights are gathered by its own forward, which the unpadded path and the
    # oneDNN probe go around (they call the block's parts, or read weights, directly)
    eager = run.train.compile_mode is None
    whole = eager and run.train.sharding == "ddp"
    encoder.unpad = run.train.unpad and whole
    # checkpointed layers recompute their forward in the backward pass, outside the oneDNN context the forward ran
    # in: PyTorch's linear there saves other tensors (W transposed) than oneDNN's did, and the backward stops
    encoder.onednn = encoder.onednn and whole and not run.train.gradient_checkpointing
    if run.train.fast_dropout and eager:
        use_fast_dropout(encoder.backbone)
    encoder.add_prompts(run.data.prompts)
    for name, sub in run.source_runs().items():  # (a mixture: each source's prompts, named after it)
        encoder.add_source_prompts(name, sub.data.prompts)
    objective = build_objective(run)
    objective.setup(encoder)  # (before the adapters: SG-OPT's frozen copy is the plain backbone)
    if run.train.gradient_checkpointing:  # (after the frozen copy, which has no gradients to save memory for)
        encoder.enable_gradient_checkpointing()
    if run.model.lora:
        encoder.backbone = add_lora(encoder.backbone, run.model.lora)
    spec = run.objective.matryoshka()
    encoder.matryoshka_dims = list(spec.dims) if spec else None
    multiple = pad_multiple(run)
    for sub, each in objectives_of(run, objective):
        prompts = column_prompts(sub, encoder.prompt(), each, encoder.include_prompt)
        for part in each.modules():  # (HiCL's base objective collates too)
            if isinstance(part, Objective):
                part.pad_multiple, part.prompts = multiple, prompts
    module = TrainModule(encoder, objective)
    stored = next(encoder.backbone.parameters()).dtype
    if stored != torch.float32:  # (--model-dtype bf16, or auto on a 16-bit checkpoint): the heads as the backbone
        module.to(stored)
    return module


def prepare_data_parallel(module: nn.Module, run: RunConfig, device: torch.device, session) -> nn.Module:
    """``module`` on ``device`` under DDP (the session's prepare_model: Ray Train's). A mixture's step trains one
    source's objective, so the other sources' own parameters (a learned tau) get no gradient in it: DDP is told to
    expect that."""
    unused = run.data.is_mixture and any(p.requires_grad for p in unwrap(module).objective.parameters())
    return session.prepare_model(module, device, {"find_unused_parameters": True} if unused else None)


def build_objective(run: RunConfig) -> Objective:
    """The run's objective; a mixture's (data.sources): each source's, by its source (raycse.objectives.by_source)."""
    if not run.data.is_mixture:
        return run.build_objective()
    from raycse.objectives.by_source import BySource

    return BySource({name: sub.build_objective() for name, sub in run.source_runs().items()})


def objectives_of(run: RunConfig, objective: Objective) -> list[tuple[RunConfig, Objective]]:
    """(the run it trains alone, the objective) of each objective in ``objective``: the run's own, or each source's."""
    if not run.data.is_mixture:
        return [(run, objective)]
    return [(sub, objective.parts[name]) for name, sub in run.source_runs().items()]


def export_encoder(run: RunConfig) -> Callable[[dict], Encoder]:
    """For a sharded run's rank 0: a whole encoder on the CPU, built as :func:`build_module` builds the trained one
    (prompts, adapters, Matryoshka sizes), that takes the whole module's state dict (keys ``encoder.*``) and
    saves as the trained model (built at the first call, then reused: one more copy of the weights)."""
    made: list[Encoder] = []

    def export(state: dict) -> Encoder:
        if not made:
            m = run.model
            encoder = Encoder.from_pretrained(m.name_or_path, pooling=m.pooling, mlp_head=m.resolved_mlp_head,
                                              trust_remote_code=m.trust_remote_code, dtype=m.dtype)
            encoder.add_prompts(run.data.prompts)
            if m.lora:
                encoder.backbone = add_lora(encoder.backbone, m.lora)
            spec = run.objective.matryoshka()
            encoder.matryoshka_dims = list(spec.dims) if spec else None
            made.append(encoder)
        prefix = "encoder."
        made[0].load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        return made[0]

    return export


def compile_module(module: nn.Module, mode: Optional[str]) -> nn.Module:
    """``module``'s forward through ``torch.compile(mode=mode)`` (inductor), in place, so its state dict's
    keys, and so checkpoints and the saved model, stay as they are; ``mode`` None: unchanged. Shapes
    seen a second time are compiled as dynamic ones (torch's default), so a new batch width does not
    build a graph of its own each step."""
    if mode is not None:  # (build_module has set the encoder's eager-only paths off for it)
        module.compile(mode=mode)
    return module


def compiled_note(run: RunConfig) -> str:
    """``, N graph(s) compiled (torch.compile mode M)`` where train.compile is on, else '' (for the log)."""
    mode = run.train.compile_mode
    if mode is None:
        return ""
    graphs = compat.compiled_graph_count()
    return f", {'?' if graphs is None else graphs} graph(s) compiled (torch.compile mode {mode})"


def column_prompts(run: RunConfig, default: str, objective: Objective, include_prompt: bool = True
                   ) -> dict[str, str]:
    """What goes before each column's sentences in training: the column's ``data.prompts`` entry, else
    the model's ``default`` prompt (what ``encode`` puts before every sentence), so training sees the
    text inference will. Refused: a prompt for an objective that cuts or repeats tokens, or for a
    model whose Pooling leaves prompt tokens out (``include_prompt``)."""
    prompts = {role: run.data.prompts.get(role) or default for role in ("text", "pair")}
    if any(prompts.values()) and objective.derives_widths:
        raise ConfigError(prompt_refusal(run.objective.name, next(p for p in prompts.values() if p)))
    if any(prompts.values()) and not include_prompt:
        raise ModelError(PROMPT_LEFT_OUT)
    return prompts


def check_model_fits_objective(run: RunConfig, model_path: str) -> None:
    """On the driver, before anything starts, from the model's files (no weights loaded): the prompts
    it and the run put before sentences fit the objective, the Matryoshka sizes fit its width, and the
    objective can train LoRA adapters and a sharded model where asked."""
    default, keeps_prompt = default_prompt_of(model_path)
    objective = build_objective(run)
    for sub, each in objectives_of(run, objective):
        column_prompts(sub, default, each, keeps_prompt)
    if run.model.lora:
        refusals = [(part.name, why) for part in objective.modules()
                    if isinstance(part, Objective) and (why := part.lora_refusal())]
        if refusals:
            raise ConfigError(f"model.lora with objective '{refusals[0][0]}': {refusals[0][1]}")
        empty = empty_backbone_of(model_path)
        if empty is not None:  # peft's own matching of target_modules, on the weightless architecture
            add_lora(empty, run.model.lora)
    if run.train.sharding == "fsdp":
        check_available()
        refusals = [(part.name, why) for part in objective.modules()
                    if isinstance(part, Objective) and (why := part.sharding_refusal())]
        if refusals:
            raise ConfigError(f"--sharding fsdp with objective '{refusals[0][0]}': {refusals[0][1]}; use --sharding ddp")
    spec, width = run.objective.matryoshka(), embedding_width_of(model_path)
    if spec and width:
        check_fits(spec, width)
    if run.train.gradient_checkpointing:
        empty = empty_backbone_of(model_path)
        if empty is not None:
            check_checkpointing(empty)


def prompt_refusal(objective: str, prompt: str) -> str:
    """One line: an objective that cuts or repeats tokens cannot keep a prompt whole."""
    return (f"objective '{objective}' cuts or repeats a sentence's tokens, which would cut or repeat the prompt "
            f"{prompt!r}; train with simcse, bsc or sgopt, or without prompts (drop data.prompts, or set the "
            f"model's default_prompt_name to null)")


def unwrap(module: nn.Module) -> TrainModule:
    return module.module if hasattr(module, "module") else module


def worker_device(t, session) -> torch.device:
    """The device the session (Ray) gave this worker. A worker that holds GPUs its torch cannot use fails in one
    line, unless RAYCSE_GPU_STAND_IN=cpu says to train on the CPU instead: how a CPU machine tests
    GPU scheduling (GPUs declared to Ray, e.g. ``ray.init(num_gpus=1)``)."""
    import ray

    device = session.device()
    if device.type == "cuda" and not torch.cuda.is_available():
        if os.environ.get(GPU_STAND_IN) == "cpu":
            return torch.device("cpu")
        raise RuntimeError(f"this worker holds GPU {ray.get_gpu_ids()} (train.gpus_per_worker {t.gpu_share:g}) but "
                           f"its torch {torch.__version__} has no CUDA; install torch's CUDA build on the GPU nodes")
    return device


def length_buckets(run: RunConfig) -> int:
    """train.length_buckets, resolved: 2 on CPUs, 1 on GPUs (where sub-batches multiply the launches) and
    in a compiled step (one graph for the batch)."""
    t = run.train
    return t.length_buckets if t.length_buckets is not None else (1 if t.use_gpu or t.compile_mode else 2)


def pad_multiple(run: RunConfig) -> int:
    """train.pad_to_multiple_of, resolved: 8 on GPUs, 1 on CPUs."""
    t = run.train
    return t.pad_to_multiple_of if t.pad_to_multiple_of is not None else (8 if t.use_gpu else 1)


def shape_bound(run: RunConfig, objective: Objective) -> str:
    """How many distinct batch shapes a run can meet: full batches only (the partial last one of an
    epoch is dropped), so the token widths decide. Objectives that cut or repeat sentences after
    tokenizing (CompCSE's halves, LA(SER)^3's repeats, HiCL's pieces) make widths of their own."""
    m, longest = pad_multiple(run), run.model.max_length
    widths = -(-longest // m) if m > 1 else longest - 1  # (a width holds at least [CLS] and [SEP])
    return (f"batch shapes: {run.train.batch_size} sentences per worker in every step, token widths up to "
            f"{longest}" + (f" padded to a multiple of {m}" if m > 1 else "")
            + f": at most {widths} distinct widths" + (" for the tokenized batch (this objective derives other "
                                                       "widths from it)" if objective.derives_widths else ""))


def what_trains(module: TrainModule) -> str:
    """The count of trainable parameters (with LoRA: in the adapters and in the training heads)."""
    return trainable_line(module, module.encoder.backbone)


def build_optimizer(module: nn.Module, run: RunConfig, total_steps: int):
    """AdamW (no decay on biases and norms; objective knobs like a trainable tau at their own
    learning rate) + linear warm-up then linear decay to 0."""
    custom = {f"objective.{k}": v for k, v in unwrap(module).objective.custom_lr().items()}
    decay, no_decay, groups = [], [], []
    for name, p in unwrap(module).named_parameters():
        if not p.requires_grad:
            continue
        if name in custom:
            groups.append({"params": [p], "weight_decay": 0.0, "lr": custom[name]})
        else:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups += [{"params": decay, "weight_decay": run.train.weight_decay},
               {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    betas = (run.train.adam_beta1, run.train.adam_beta2)
    try:  # one fused kernel per step (CPU and GPU) instead of ~10 elementwise passes per tensor
        opt = torch.optim.AdamW(groups, lr=run.train.lr, betas=betas, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        opt = torch.optim.AdamW(groups, lr=run.train.lr, betas=betas)
    warmup = int(round(run.train.warmup_ratio * total_steps))

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
