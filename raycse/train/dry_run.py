"""``raycse train --dry-run``: every pre-flight check of a run, then its plan printed (workers, how the model is
placed on them, each worker's memory, batches and steps), without starting Ray or writing anything."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from raycse.config import RunConfig
from raycse.train.memory import GB, estimate, worker_memory
from raycse.train.plan import plan_steps
from raycse.train.preflight import check_inputs


def count_examples(run: RunConfig, sources: Optional[list]) -> Optional[int]:
    """Usable examples of a local corpus, read once (before deduplication); None for a remote or in-memory one."""
    if not sources or any("://" in s for s in sources):
        return None
    from raycse.data.corpus import CorpusStats, file_examples
    from raycse.data.dataset import columns_of

    stats, found = CorpusStats(), 0
    for src in sources:
        for _ in file_examples(src, run.data.format, columns_of(run.data), run.data.max_chars,
                               run.data.on_decode_error, stats):
            found += 1
    return found


def attention_said(run: RunConfig) -> str:
    """The attention kernels the run's model will load with (``--attention``, auto resolved)."""
    from raycse.train.module import attention_of

    chosen = attention_of(run).get("attn_implementation")
    return chosen or ("the model's default (SDPA where it has it; raycse's unpadded layers for BERT-family models on "
                      "CPUs)")


def dry_run(run: RunConfig, overwrite: bool = False, storage_path: Optional[str] = None) -> str:
    """The plan of ``run`` after all of ``raycse train``'s checks, as text (refused in one line as a run would be)."""
    from raycse.platform.staging import check_replaceable
    from raycse.errors import ConfigError

    run, model_path, _dev, remote, sources = check_inputs(run, overwrite, storage_path)
    if not remote:
        dest = Path(os.path.expanduser(run.output_dir)).resolve()
        if dest.is_dir() and any(dest.iterdir()) and not overwrite:
            raise ConfigError(f"output directory {dest} already exists and is not empty; choose another --output or "
                              f"pass --overwrite")
        check_replaceable(dest)
    t = run.train
    device = (f"{t.gpu_share or 1:g} GPU each" if t.use_gpu
              else f"{t.cpus_per_worker:g} CPU(s) each" if t.cpus_per_worker else "CPUs shared")
    lines = [f"[raycse] dry run: nothing started, nothing written",
             f"workers: {t.num_workers} ({device}); " + (
                 f"sharding: FSDP2 over {t.num_workers} worker(s) (each holds 1/{t.num_workers} of the weights, "
                 f"gradients and AdamW's moments{', offloaded to host memory' if t.fsdp_offload == 'cpu' else ''})"
                 if t.sharding == "fsdp" else "sharding: none, data-parallel (DDP: each worker holds the whole "
                 "model, its gradients and AdamW's moments)"),
             f"model: {run.model.name_or_path}" + (", gradient checkpointing" if t.gradient_checkpointing else "")
             + (", LoRA" if run.model.lora else "") + f", attention {attention_said(run)}"]
    found = estimate(run, model_path)
    if found is not None:
        room = worker_memory(run)
        fits = f"; available {room[0] / GB:.1f} GB ({room[1]})" if room else ""
        lines.append(f"memory a worker: about {found.total / GB:.2f} GB ({found.breakdown()} GB; "
                     f"{found.params:,} parameters, {found.trainable:,} trained){fits}")
    else:
        lines.append("memory a worker: not estimated (the model cannot be built without its weights here)")
    if run.data.is_mixture:
        lines += mixture_lines(run)
        lines.append(f"output: {run.output_dir}")
        return "\n".join(lines)
    examples = count_examples(run, sources)
    if examples is not None:
        spe, total = plan_steps(run, examples)
        lines.append(f"data: {examples:,} usable examples (before deduplication); global batch {t.batch_size} x "
                     f"{t.num_workers} = {t.batch_size * t.num_workers}; {spe:,} steps an epoch, {total:,} steps "
                     f"({t.epochs} epoch(s){', max_steps ' + str(t.max_steps) if t.max_steps else ''})")
    else:
        lines.append(f"data: {run.data.corpus} (counted when the run reads it); global batch {t.batch_size} x "
                     f"{t.num_workers}")
    lines.append(f"output: {run.output_dir}")
    return "\n".join(lines)


def mixture_lines(run: RunConfig) -> list[str]:
    """A mixture's plan: each source's examples, objective and steps an epoch (raycse.train.mixture.epoch_steps)."""
    from raycse.data.dataset import resolve_sources
    from raycse.train.mixture import epoch_steps

    subs, t = run.source_runs(), run.train
    counts = {n: count_examples(sub, None if sub.data.format == "hf" else resolve_sources(sub.data.corpus))
              for n, sub in subs.items()}
    if any(c is None for c in counts.values()):
        return [f"data: {len(subs)} sources (counted when the run reads them); global batch {t.batch_size} x "
                f"{t.num_workers}, one source a step ({run.data.mixing})"]
    spe, total = plan_steps(run, list(counts.values()))
    steps = epoch_steps(run, list(counts.values()))
    return [f"data: {len(subs)} sources, one a step ({run.data.mixing}); global batch {t.batch_size} x {t.num_workers}; "
            f"{spe:,} steps an epoch, {total:,} steps ({t.epochs} epoch(s)"
            f"{', max_steps ' + str(t.max_steps) if t.max_steps else ''})"] + [
        f"  source {n}: {counts[n]:,} usable examples, objective {subs[n].objective.name}, {int(k):,} steps an epoch "
        f"({k / max(spe, 1):.0%})" for n, k in zip(subs, steps)]
