"""The per-worker training loop that Ray Train runs on every worker.

Kept free of argument parsing: it receives a validated :class:`~raycse.config.RunConfig` as a
dict plus object-store references to the data, builds encoder + objective, and reports metrics
with a checkpoint every ``eval.eval_steps`` steps (rank 0 scores STS-B dev), at the steps the
driver names in ``eval_at``, and at the end of the fit.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from concurrent import futures
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from raycse import storage as objstore
from raycse.outputs import private_tempdir
from raycse.config import RunConfig
from raycse.encoder import Encoder
from raycse.evaluation import initial_scores
from raycse.objectives import registry
from raycse.objectives.base import LossOutput, Objective
from raycse.train import checkpoint as ckpt
from raycse.train import ahead, gradcache, regroup
from raycse.train import tracking
from raycse.train.profile import StepProfiler, describe, span
from raycse.train.runtime import autocast, release_freed_memory, resolve_precision, seed_everything, setup_ray_data
from raycse.unpad import use_fast_dropout

SCORE_METRIC = "stsb_dev_spearman"  # the default model-selection key (eval.metric: stsb_dev)
CHECKPOINT_RANK = "checkpoint_rank"
GPU_STAND_IN = "RAYCSE_GPU_STAND_IN"  # =cpu: workers holding declared GPUs train on the CPU (tests)


def checkpoint_rank(score: Optional[float], step: int) -> float:
    """How Ray ranks a checkpoint for keeping: by score, a tie going to the earlier step (Ray keeps
    the newer of equals, so a resumed run's repeated last step evicted an equally good earlier
    best, and the published weights changed); unscored ones below every score, the latest first."""
    return score - 1e-12 * step if score is not None else -1e9 + step
# Workers log instead of print: Ray Train V2 patches print() into its logger and would echo each line twice.
log = logging.getLogger("raycse.train")


class TrainModule(nn.Module):
    """Encoder + objective as one module, so DDP sees every trainable parameter (heads, tau)."""

    def __init__(self, encoder: Encoder, objective: Objective):
        super().__init__()
        self.encoder = encoder
        self.objective = objective

    def forward(self, batch: dict) -> LossOutput:
        return self.objective(self.encoder, batch)


def build_module(run: RunConfig) -> TrainModule:
    encoder = Encoder.from_pretrained(run.model.name_or_path, pooling=run.model.pooling,
                                      mlp_head=run.model.resolved_mlp_head)
    encoder.length_buckets = run.train.length_buckets
    encoder.unpad = run.train.unpad
    if run.train.fast_dropout:
        use_fast_dropout(encoder.backbone)
    objective = registry.build(run.objective.name, run.objective.params)
    objective.setup(encoder)
    multiple = pad_multiple(run)
    for part in objective.modules():  # (HiCL's base objective collates too)
        if isinstance(part, Objective):
            part.pad_multiple = multiple
    return TrainModule(encoder, objective)


def worker_device(t) -> torch.device:
    """The device Ray gave this worker. A worker that holds GPUs its torch cannot use fails in one
    line, unless RAYCSE_GPU_STAND_IN=cpu says to train on the CPU instead: how a CPU machine tests
    GPU scheduling (GPUs declared to Ray, e.g. ``ray.init(num_gpus=1)``)."""
    import ray.train.torch

    device = ray.train.torch.get_device()
    if device.type == "cuda" and not torch.cuda.is_available():
        if os.environ.get(GPU_STAND_IN) == "cpu":
            return torch.device("cpu")
        raise RuntimeError(f"this worker holds GPU {ray.get_gpu_ids()} (train.gpus_per_worker {t.gpu_share:g}) but "
                           f"its torch {torch.__version__} has no CUDA; install torch's CUDA build on the GPU nodes")
    return device


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


def move(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def check_gradients_reach_all(module: nn.Module) -> None:
    """Every trainable parameter must get a gradient, or DDP silently stops syncing its bucket."""
    missing = [n for n, p in module.named_parameters() if p.requires_grad and p.grad is None]
    if missing:
        raise RuntimeError(f"trainable parameters received no gradient: {', '.join(missing[:5])}"
                           f"{' ...' if len(missing) > 5 else ''}; freeze them (requires_grad_(False))")


def peak_memory(device: torch.device) -> dict:
    """Peak resident memory of this worker (and of its GPU, when there is one), in MB."""
    import resource

    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def unwrap(module: nn.Module) -> TrainModule:
    return module.module if hasattr(module, "module") else module


def row_examples(row: dict) -> list:
    """One dataset row (a whole batch) -> the examples the objective collates: texts or pairs."""
    texts = list(row["text"])
    if "pair" not in row:
        return texts
    scores = [None if s is None or s != s else float(s) for s in row["score"]]
    if "negatives" in row:  # triplets: (q, a, score, (negative, ...))
        return [(t, p, s, tuple(n)) for t, p, s, n in zip(texts, list(row["pair"]), scores, list(row["negatives"]))]
    return list(zip(texts, list(row["pair"]), scores))


def record_batch(directory: Path, rank: int, step: int, epoch: int, examples: list) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"rank{rank}.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": step, "epoch": epoch, "time": time.time(), "pid": os.getpid(),
                             # a digest of the dropout stream: a resumed run must continue it exactly
                             "rng": int(torch.get_rng_state().to(torch.int64).sum()),
                             "examples": examples}) + "\n")


def worker_places(world_size: int) -> list[tuple]:
    """(Ray node id, GPU ids Ray assigned) of every rank, rank-ordered (every rank calls it: one
    all_gather_object)."""
    import ray
    import torch.distributed as dist

    place = (ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()])
    if world_size == 1 or not dist.is_initialized():
        return [place]
    places = [None] * world_size
    dist.all_gather_object(places, place)
    return places


def latest_in_storage(run_dir: Optional[str], rank: int, world_size: int) -> tuple[Optional[str], list]:
    """The furthest whole checkpoint in the run's storage as rank 0 sees it, shared with every rank,
    and the damaged ones rank 0 skipped ("name: problem").

    Why: after a worker (or its node) is lost, Ray Train restarts the group with the latest checkpoint
    its controller has registered, which can lag the uploads by a report or more (a node removed
    right after two checkpoints reached S3 restarted the run from step 0); a restarted driver has no
    registered checkpoint at all. One rank looks, so every rank loads the same one."""
    import torch.distributed as dist

    path, skipped = None, []
    if run_dir and rank == 0:
        found = ckpt.latest_valid(run_dir, skipped)
        path = found[1] if found else None
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        box = [path]
        dist.broadcast_object_list(box, src=0)
        path = box[0]
    return path, skipped


def choose_checkpoint(config: dict, rank: int, world_size: int) -> tuple[Optional[object], list]:
    """The furthest whole checkpoint to resume from (a ``ray.train.Checkpoint``, or None) and the
    damaged ones passed over ("name: problem").

    Candidates: Ray's latest (after a worker failure) and the furthest in the run's storage (a
    restarted driver; Ray's can lag); one failing its manifest check is skipped."""
    import ray.train

    candidates = [c for c in (ray.train.get_checkpoint(),) if c is not None]
    found, skipped = latest_in_storage(config.get("checkpoint_dir"), rank, world_size)
    if found:
        candidates.append(ray.train.Checkpoint(found))
    chosen = None
    for cand in candidates:
        with cand.as_directory() as d:
            problem = ckpt.verify(Path(d))
            if problem is not None:
                log.warning(f"[raycse] skipping checkpoint {cand.path}: {problem}")
                skipped.append(f"{Path(cand.path).name}: {problem}")
                continue
            if chosen is None or ckpt.step_of(Path(d)) > chosen[0]:
                chosen = (ckpt.step_of(Path(d)), cand)
    return (chosen[1] if chosen else None), skipped


def wait_for_upload(local: Path, step: int, limit_s: float, dest: str) -> None:
    """Wait until the checkpoint of ``step`` reached storage, which Ray says by removing its local
    directory ``local``: one upload at a time, so a slow store slows the run instead of filling
    this node's disk; after ``limit_s`` the run fails naming the store."""
    deadline = time.monotonic() + limit_s
    while local.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the checkpoint of step {step} has not reached {dest} in {limit_s:g} s; check that "
                               "the storage is reachable, or raise train.checkpoint_upload_timeout_s")
        time.sleep(0.05)


class WorkerRun:
    """One rank's part of a fit: its model, optimizer and progress, and the loop's steps over them.

    ``train_loop_per_worker`` runs them in order: build, :meth:`resume`, find the ranks' nodes,
    :meth:`score_before_training`, :meth:`log_start`, then :meth:`fit` (or :meth:`report_again` when
    the run had already reached its end)."""

    def __init__(self, config: dict):
        import ray
        import ray.train
        import ray.train.torch

        run = self.run = RunConfig.from_dict(config["run"])
        self.config = config
        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        torch.set_num_threads(max(1, int(config.get("threads", 1))))
        # Same init everywhere (DDP also broadcasts rank 0's weights); different dropout masks per rank.
        seed_everything(run.train.seed)
        module = build_module(run)
        seed_everything(run.train.seed + 1000 * self.rank)
        self.device = worker_device(run.train)
        self.module = ray.train.torch.prepare_model(module, move_to_device=self.device)
        self.core = unwrap(self.module)
        self.dev = ray.get(config["dev"]) if config.get("dev") is not None else None  # evaluation.selection.Selection
        self.score_key = run.eval.score_key()
        self.total, self.stop_at = int(config["total_steps"]), int(config["stop_at"])  # stop_at < total: a Tune rung
        self.opt, self.sched = build_optimizer(self.module, run, self.total)
        self.dtype = resolve_precision(run.train.precision, self.device)
        self.scaler = torch.amp.GradScaler("cuda") if self.dtype == torch.float16 else None
        self.eval_dtype = (self.dtype if run.eval.precision == "train"
                           else resolve_precision(run.eval.precision, self.device))
        # Rank 0 also posts each STS-B dev score to this sink the moment it has it (Tune's trials read
        # their seeds' rung scores from it while the fits go on).
        self.sink = config.get("score_sink") if self.rank == 0 else None
        self.tlog = tracking.Logger(config.get("tracking"), self.rank)  # rank 0 logs; a no-op elsewhere
        self.places: list = []  # every rank's Ray node and GPU ids (worker_places), recorded in the metrics
        # progress (restored by resume): steps done, loss per checkpoint, the score before training
        self.step, self.history, self.initial, self.resumed = 0, [], None, None
        self.grouping = {"layout": None, "log": []}  # in-fit regrouping: this epoch's batches and every epoch's record
        self.window, self.train_time, self.seen = [], 0.0, 0  # losses since the last checkpoint; this fit's speed
        # this fit's losses not yet read back: on the device until a logging or checkpoint step, so the
        # host queues the next step while the device works (a read per step made the host wait for each)
        self.unread: list = []
        self.to_step_10: Optional[float] = None  # seconds this fit took to its 10th step
        # checkpoints copied to storage in the background (train.checkpoint_upload); the training
        # thread's time in checkpoints (this fit's, before the current one); the one being copied
        mode = run.train.checkpoint_upload
        self.upload_async = mode == "async" or (mode == "auto" and objstore.is_uri(config["checkpoint_dir"]))
        self.ckpt_time, self.uploading = 0.0, None
        self.profiler = StepProfiler(self.profile_window(), self.rank, self.device)  # train.profile_steps

    def profile_window(self) -> Optional[tuple]:
        """train.profile_steps within this fit's steps (said in the log when the fit does not reach it)."""
        window = self.run.train.profile_window()
        if window is None or self.rank != 0:
            return None
        if window[0] >= self.stop_at:
            log.warning(f"[raycse] train.profile_steps {self.run.train.profile_steps}: this fit ends at step "
                        f"{self.stop_at}; nothing profiled")
            return None
        return window[0], min(window[1], self.stop_at)

    def resume(self) -> None:
        """Continue from the furthest whole checkpoint, if there is one (every rank loads the same)."""
        chosen, skipped = choose_checkpoint(self.config, self.rank, self.world_size)
        if chosen is None:
            return
        with chosen.as_directory() as d:
            state = ckpt.load(Path(d), self.core, self.opt, self.sched, self.rank)
            self.grouping["layout"] = regroup.Layout.load(Path(d) / ckpt.STATE_DIR)
        self.step, self.history, self.initial = int(state["step"]), list(state["loss_history"]), state.get("initial")
        # (the driver reports it after the fit: workers' lines reach its log late)
        self.resumed = {"step": self.step, "path": chosen.path, "skipped": skipped}
        self.grouping["log"] = list(state.get("grouping") or [])
        if self.sink is not None and state.get(self.score_key) is not None:
            self.sink.post(self.step, float(state[self.score_key]))  # scored before the restart; may not have been read

    def evaluate(self) -> Optional[float]:
        """Rank 0's model-selection score of the current weights (None elsewhere or without dev data)."""
        if self.dev is None or self.rank != 0:
            return None
        # encode() switches the encoder to eval mode and back by itself
        score = self.dev.score(lambda xs: self.core.encoder.encode(xs, batch_size=self.run.eval.batch_size,
                                                                   autocast_dtype=self.eval_dtype))
        release_freed_memory()
        return score

    def report(self, metrics: dict) -> None:
        """Post the score, then write and report this step's checkpoint (rank 0: the model; every rank: its RNG)."""
        import ray.train
        from ray.train import CheckpointUploadMode

        # The score goes out before the checkpoint is written (~1.3 s for MiniLM's weights + optimizer):
        # a Tune trial decides its rung on it meanwhile. A run restarted before the checkpoint exists
        # repeats the steps from the previous one and posts a score again (the trial keeps the first).
        if self.sink is not None and metrics.get(self.score_key) is not None:
            self.sink.post(int(metrics["step"]), float(metrics[self.score_key]))
        t0 = time.perf_counter()
        if self.uploading is not None:  # (only under async)
            wait_for_upload(*self.uploading, self.run.train.checkpoint_upload_timeout_s, self.config["checkpoint_dir"])
        # a worker killed meanwhile (a stopped trial, a lost node) leaves its directory to the next
        # checkpoint on this machine to remove: it holds the weights and optimizer state
        tmp = private_tempdir("raycse-ckpt-")
        try:
            if self.rank == 0:
                if self.grouping["layout"] is not None:  # a restart mid-epoch trains on the same batches
                    self.grouping["layout"].save(tmp / ckpt.STATE_DIR)
                ckpt.write(tmp, self.core, self.opt, self.sched, {**metrics, "initial": self.initial})
            ckpt.write_rng(tmp, self.rank)
            # async: Ray copies it to storage in a thread of this worker while training goes on, then
            # removes it (as sync does after its copy); the fit's end waits for the last copy
            ray.train.report({**metrics, "checkpoint_seconds": self.ckpt_time,
                              "checkpoint_upload": "async" if self.upload_async else "sync"},
                             checkpoint=ray.train.Checkpoint.from_directory(str(tmp)),
                             checkpoint_upload_mode=(CheckpointUploadMode.ASYNC if self.upload_async
                                                     else CheckpointUploadMode.SYNC),
                             delete_local_checkpoint_after_upload=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if self.upload_async:
            self.uploading = (tmp, int(metrics["step"]))
        else:  # Ray removed it after the copy, unless it skipped the report (a worker lost)
            shutil.rmtree(tmp, ignore_errors=True)
        self.ckpt_time += time.perf_counter() - t0

    def score_before_training(self) -> bool:
        """The starting model's score, when asked for; True when it was remembered from an earlier run.

        It is the same in every run: computed once per machine, on request (eval.before_training)."""
        before = self.run.eval.before_training
        if self.step != 0 or before == "false" or self.dev is None or self.rank != 0:
            return False
        cache = self.config.get("initial_cache") or {"key": None, "file": ""}
        self.initial = initial_scores.lookup(cache["key"], cache["file"])
        remembered = self.initial is not None
        if self.initial is None and before == "true":
            self.initial = self.evaluate()
            initial_scores.store(cache["key"], self.initial, cache["file"])
        if self.initial is not None:
            self.tlog.log({self.score_key: self.initial}, 0)
        return remembered

    def log_start(self, remembered: bool) -> None:
        """Rank 0's first lines: the machine and kernels, then the run's shape and starting score."""
        log.setLevel(logging.INFO)
        if self.rank != 0:
            return
        from raycse import machine, onednn

        run, dev, initial, step = self.run, self.dev, self.initial, self.step
        kernels = onednn.choice()
        log.info(f"[raycse] rank 0 on {machine.describe()}, torch {torch.__version__}; fp32 CPU linears on "
                 f"{'oneDNN' if kernels['onednn'] else 'PyTorch default kernels'} ({kernels['why']})")
        log.info(f"[raycse] {self.world_size} worker(s), steps {step}..{self.stop_at} of {self.total}, "
                 f"global batch {run.train.batch_size * self.world_size}, precision {self.dtype or 'fp32'}, "
                 f"threads {torch.get_num_threads()}" + (", resumed" if step else "")
                 + (f", {dev.label} before: {initial:.2f}" if initial is not None and step == 0 else "")
                 + (" (remembered from an earlier run: raycse.evaluation.initial_scores)" if remembered else "")
                 + (f", {dev.label} before: not measured (--score-before true measures it)"
                    if initial is None and step == 0 and dev is not None and run.eval.before_training == "auto" else ""))
        log.info(f"[raycse] {shape_bound(run, self.core.objective)}")

    def report_again(self) -> None:
        """A restart after this run had reached stop_at: report its state again."""
        score = self.evaluate()
        self.report({"step": self.step, "loss_history": self.history, "total_steps": self.total,
                     "resumed": self.resumed, CHECKPOINT_RANK: checkpoint_rank(score, self.step),
                     **({self.score_key: score, self.score_key + "_initial": self.initial} if score is not None else {})})

    def rows(self):
        """This rank's batch rows, one per step: regrouped epoch by epoch inside the fit, or laid out by the driver."""
        import ray.train

        if self.config.get("regroup_in_fit"):
            return regroup.regrouped_rows(self.core.encoder, self.run, self.rank, self.world_size, self.device,
                                          self.dtype, int(self.config["steps_per_epoch"]), self.total, self.stop_at,
                                          self.step, self.grouping)
        return ray.train.get_dataset_shard(f"rank{self.rank}").iter_rows()

    def train_step(self, batch: dict) -> LossOutput:
        """One optimizer step on ``batch`` (forward, backward, clip, step, schedule); its loss output."""
        run, scaler, opt = self.run, self.scaler, self.opt
        if run.train.cache_chunk_size:  # GradCache: both passes and the gradient average in one call
            out = gradcache.cached_step(self.core, batch, run.train.cache_chunk_size,
                                        lambda: autocast(self.device, self.dtype),
                                        scaler.scale if scaler is not None else None)
            if scaler is not None:
                scaler.unscale_(opt)
        else:
            with autocast(self.device, self.dtype):
                out = self.module(batch)
            if scaler is not None:
                scaler.scale(out.loss).backward()
                scaler.unscale_(opt)
            else:
                out.loss.backward()
        if run.train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), run.train.max_grad_norm)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        self.sched.step()
        if self.step == 0:
            check_gradients_reach_all(self.core)
        opt.zero_grad(set_to_none=True)
        return out

    def note_warmup(self, started: float) -> None:
        """The time this fit took to its 10th step (first shapes, kernel choice, allocator warm-up)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # (once: the figure must include the device's work)
        self.to_step_10 = time.perf_counter() - started
        if self.rank == 0:
            log.info(f"[raycse] 10 steps in {self.to_step_10:.2f} s from the fit's first step")

    def read_losses(self) -> None:
        """Read the losses of the steps since the last read back to the host (one wait for the device)
        into the logging window; a non-finite one stops the run naming its step."""
        if not self.unread:
            return
        values = torch.stack(self.unread).float().tolist()
        first, self.unread = self.step - len(values) + 1, []
        for i, value in enumerate(values):
            if not math.isfinite(value):
                raise FloatingPointError(f"loss became {value} at step {first + i} (read back at step {self.step}, "
                                         f"steps {first}..{self.step}); lower train.lr or use precision fp32")
        self.window.extend(values)

    def log_profile(self) -> None:
        """The profiled window's table and summary in the log (when it has just ended)."""
        log.info(f"[raycse] profile of {describe(self.profiler.summary)}\n{self.profiler.table}")

    def log_progress(self, epoch: int) -> None:
        """Rank 0, every train.log_steps: the recent mean loss, learning rate and examples/s."""
        if self.rank != 0 or not (self.step % self.run.train.log_steps == 0 or self.step == self.total):
            return
        recent = self.window[-self.run.train.log_steps:]
        loss, lr, speed = sum(recent) / len(recent), self.sched.get_last_lr()[0], self.seen / max(self.train_time, 1e-9)
        log.info(f"[raycse] step {self.step}/{self.total} ({100 * self.step / self.total:.0f}%) epoch {epoch} "
                 f"loss {loss:.4f} lr {lr:.2e} {speed:.1f} examples/s")
        self.tlog.log({"loss": loss, "lr": lr, "examples_per_s": speed, "epoch": epoch}, self.step)

    def checkpoint(self, epoch: int, out: LossOutput, scored: bool) -> None:
        """Close the loss window, score (when ``scored``) and report a checkpoint at this step."""
        if self.window:
            self.history.append(sum(self.window) / len(self.window))
            self.window = []
        extra = {"step": self.step, "epoch": epoch, "loss": self.history[-1], "loss_history": list(self.history),
                 "worker_nodes": [node for node, _ in self.places],
                 "worker_gpus": [gpus for _, gpus in self.places], "resumed": self.resumed,
                 **({"grouping": list(self.grouping["log"])} if self.grouping["log"] else {}),
                 "train_examples_per_s": self.seen / max(self.train_time, 1e-9), "train_seconds": self.train_time,
                 "total_steps": self.total, **peak_memory(self.device),
                 **({"profile": self.profiler.summary} if self.profiler.summary else {}),
                 **({"seconds_to_step_10": self.to_step_10} if self.to_step_10 is not None else {}),
                 **{f"last_{k}": float(v) for k, v in out.metrics.items()}}
        score = self.evaluate() if scored else None
        if score is not None:
            extra[self.score_key] = score
            extra[self.score_key + "_initial"] = self.initial
            log.info(f"[raycse] step {self.step}: {self.dev.label} {score:.2f}")
            self.tlog.log({self.score_key: score}, self.step)
        # Ray keeps the top train.keep_checkpoints by this rank (+ the latest): scored checkpoints
        # first, then the most recent resume points, so a damaged latest one has a fallback.
        extra[CHECKPOINT_RANK] = checkpoint_rank(score, self.step)
        self.report(extra)

    def step_rows(self):
        """The rows of steps ``step`` .. ``stop_at - 1``, in order (earlier ones were done before the
        checkpoint this run resumed from)."""
        expected = self.step
        if expected >= self.stop_at:
            return
        for row in self.rows():
            if int(row["step"]) < expected:
                continue
            if int(row["step"]) != expected:
                raise RuntimeError(f"rank {self.rank} expected the batch of step {expected}, got step {row['step']}")
            yield row
            expected += 1
            if expected >= self.stop_at:
                return

    def collate_row(self, row: dict, tokenizer) -> tuple[list, dict]:
        examples = row_examples(row)
        return examples, self.core.objective.collate(examples, tokenizer, self.run.model.max_length)

    def looks_ahead(self, helper: ahead.CollateAhead) -> bool:
        """Whether the next step's row is fetched and collated during this step: not across an
        in-fit regroup, which must embed with the weights of the epoch's last step."""
        crosses_regroup = (self.config.get("regroup_in_fit")
                           and (self.step + 1) % int(self.config["steps_per_epoch"]) == 0)
        return helper.enabled and not crosses_regroup

    def fit(self) -> None:
        """Train from ``step`` to ``stop_at``, checkpointing (and scoring) on the way; each step's
        batch is collated during the step before it where that changes nothing (raycse.train.ahead)."""
        run = self.run
        self.module.train()
        eval_every = run.eval.eval_steps
        eval_at = {int(s) for s in self.config.get("eval_at") or ()}  # extra scored steps (Tune's rung ends)
        ckpt_every = run.train.checkpoint_steps or eval_every
        rows = self.step_rows()
        started, first_step = time.perf_counter(), self.step
        with ahead.CollateAhead(self.collate_row, self.core.encoder.tokenizer,
                                ahead.wanted(run.train.collate_ahead, self.core.objective, self.device.type)) as helper:
            row, pending = next(rows, None), None
            while row is not None:
                self.profiler.before(self.step)
                t0 = time.perf_counter()
                with span(self.profiler, "raycse.collate"):
                    examples, batch = pending.result() if pending is not None else helper.now(row)
                epoch = int(row["epoch"])
                if run.train.record_batches:
                    record_batch(Path(run.train.record_batches), self.rank, self.step, epoch, examples)
                looked = self.looks_ahead(helper)
                following = next(rows, None) if looked else None
                pending = helper.submit(following) if following is not None else None
                with span(self.profiler, "raycse.step"):
                    out = self.train_step(move(batch, self.device))
                    self.unread.append(out.loss.detach())
                if pending is not None:
                    with span(self.profiler, "raycse.wait_ahead"):
                        futures.wait([pending])  # (its error, if any, is raised at the next step)
                self.step += 1
                step = self.step
                scored = step % eval_every == 0 or step == self.stop_at or step in eval_at  # each fit's end is scored
                saved = scored or step % ckpt_every == 0
                if saved or step % run.train.log_steps == 0:
                    self.read_losses()  # (inside the timed part: the wait for the device is training time)
                self.train_time += time.perf_counter() - t0
                if step == first_step + 10:
                    self.note_warmup(started)
                self.seen += len(examples) * self.world_size
                self.log_progress(epoch)
                if self.profiler.after(self.step):
                    self.log_profile()
                if saved:
                    self.checkpoint(epoch, out, scored)
                row = following if looked else next(rows, None)
        self.tlog.close()


def quiet_report_lines() -> None:
    """Drop Ray Train's per-report INFO line in this worker: it prints the whole metrics dict of every
    checkpoint (the loss history and grouping record included, growing with the run) after raycse's
    own line for the same step. Its logger is named by its file; Ray's warnings still show."""
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop_per_worker(config: dict) -> None:
    from raycse.redact import redacted_streams

    with redacted_streams():  # the worker's log (and the driver's copy of it) holds no credential of a URI
        _train_worker(config)


def _train_worker(config: dict) -> None:
    setup_ray_data(progress_bars=False)
    quiet_report_lines()
    worker = WorkerRun(config)
    worker.resume()
    worker.places = worker_places(worker.world_size)  # (a collective: every rank, in the same order)
    worker.log_start(worker.score_before_training())
    if worker.step >= worker.stop_at:
        worker.report_again()
        return
    try:
        worker.fit()
    except torch.OutOfMemoryError:
        raise RuntimeError(out_of_memory_line(worker.run.train, worker.step)) from None


def out_of_memory_line(t, step: int) -> str:
    """One line for a run that ran out of GPU memory, naming its share of the GPU."""
    share = (f"each worker holds {t.gpu_share:g} GPU (train.gpus_per_worker) but the GPU's memory is not divided: the "
             f"runs sharing it needed more than it has" if t.shares_gpus else "the step needs more than the GPU has")
    return (f"out of GPU memory at step {step + 1} (batch {t.batch_size} per worker): {share}; lower --batch-size, "
            f"raise --gpus-per-worker, or encode in chunks with --set train.cache_chunk_size=N")
