"""The training part of a run (the ``train:`` section), split by concern as Ray Train's own configs are.

Each concern is a dataclass of its fields with its own checks; :class:`TrainConfig` is all of them in one
YAML section (``train.lr``, ``train.num_workers``: the keys users write), validated concern by concern.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

from raycse.config.fields import PRECISIONS, Section, at_least, detail, knob, one_of
from raycse.errors import ConfigError
from raycse.platform import plugins


@dataclass
class ScalingSettings:
    """How many Ray Train workers a run takes, and what each reserves (Ray Train's ScalingConfig)."""

    num_workers: int = knob(1, '--num-workers',
                            'Ray Train workers (data-parallel)')
    # ddp: every worker holds the whole model, its gradients and AdamW's moments (~16 bytes a parameter);
    # fsdp: PyTorch's FSDP2 shards them across the workers, each holding ~1/N (raycse.train.sharding).
    sharding: str = knob("ddp", '--sharding',
                         'ddp (each worker holds the whole model) | fsdp (FSDP2: parameters, gradients and AdamW '
                         'state sharded across the workers, for models that outgrow one worker)')
    fsdp_offload: str = detail("none",
                               "with --sharding fsdp: none | cpu (each worker's shards and its optimizer step in host "
                               "memory: CPUOffloadPolicy)")
    use_gpu: bool = detail(False, 'train on GPUs: one per worker with NCCL, or --gpus-per-worker each')
    cpus_per_worker: Optional[float] = knob(None, '--cpus-per-worker',
                                            'CPUs each worker reserves and uses as torch threads (default: all CPUs /'
                                            ' workers)')
    gpus_per_worker: Optional[float] = knob(None, '--gpus-per-worker',
                                            'GPUs each worker reserves with --use-gpu (default: 1): a whole number, '
                                            'or a fraction such as 0.25 so that small encoders share a device (Tune '
                                            'trials, or workers of one run, whose collectives then use gloo); the '
                                            "GPU's memory is not divided")

    @property
    def gpu_share(self) -> float:
        """GPUs each worker reserves: 0 without use_gpu, else gpus_per_worker (default 1)."""
        return 0.0 if not self.use_gpu else (1.0 if self.gpus_per_worker is None else float(self.gpus_per_worker))

    @property
    def shares_gpus(self) -> bool:
        """Workers hold fractions of a GPU, so two ranks may be on one device."""
        return 0 < self.gpu_share < 1

    def gpus_needed(self) -> int:
        """Whole GPUs the run's workers need at once (fractions packed: floor(1/share) per GPU)."""
        share = self.gpu_share
        if share == 0:
            return 0
        if share >= 1:
            return int(share) * self.num_workers
        return math.ceil(self.num_workers / math.floor(1 / share + 1e-9))

    def validate(self) -> None:
        if self.gpus_per_worker is not None:
            g = self.gpus_per_worker
            if not self.use_gpu:
                raise ConfigError(f"train.gpus_per_worker is {g:g} but GPUs are off; add --use-gpu (train.use_gpu: true)")
            if not g > 0 or (g > 1 and g != int(g)):
                raise ConfigError(f"train.gpus_per_worker must be a fraction in (0, 1] or a whole number, got {g:g} "
                                  f"(Ray splits only single GPUs); e.g. 0.5 or 0.25")
        at_least("train.num_workers", self.num_workers, 1)
        one_of("train.sharding", self.sharding, ("ddp", "fsdp"))
        one_of("train.fsdp_offload", self.fsdp_offload, ("none", "cpu"))
        if self.sharding != "fsdp" and self.fsdp_offload != "none":
            raise ConfigError("train.fsdp_offload applies to sharded runs only; add --sharding fsdp")
        if self.fsdp_offload == "cpu" and not self.use_gpu:
            raise ConfigError("train.fsdp_offload=cpu moves GPU workers' shards to host memory, where CPU workers hold "
                              "them already; add --use-gpu, or drop train.fsdp_offload")
        if self.sharding == "fsdp" and self.num_workers == 1 and self.fsdp_offload == "none":
            raise ConfigError("--sharding fsdp with 1 worker shards nothing: use --num-workers 2 or more, or (GPUs) "
                              "offload the one worker's weights and optimizer to host memory with --set "
                              "train.fsdp_offload=cpu")
        if self.cpus_per_worker is not None and self.cpus_per_worker <= 0:
            raise ConfigError(f"train.cpus_per_worker must be > 0, got {self.cpus_per_worker}")


@dataclass
class OptimizerSettings:
    """What a step does to the weights, and how many steps: batch, schedule, AdamW, clipping, seed, GradCache."""

    batch_size: int = knob(64, '--batch-size',
                           'sentences per worker per step')  # per worker; the global batch is batch_size * num_workers
    epochs: int = knob(1, '--epochs',
                       'passes over the corpus')
    max_steps: Optional[int] = knob(None, '--max-steps',
                                    'stop after N optimizer steps (default: the epochs decide)')
    lr: float = knob(3e-5, '--lr',
                     'AdamW learning rate')
    adam_beta1: float = detail(0.9, 'AdamW beta1')
    adam_beta2: float = detail(0.999, "AdamW beta2 (SG-OPT's paper uses 0.9)")
    weight_decay: float = knob(0.0, '--weight-decay',
                               'AdamW weight decay')
    warmup_ratio: float = knob(0.0, '--warmup-ratio',
                               'fraction of steps of linear warm-up')
    max_grad_norm: float = knob(1.0, '--max-grad-norm',
                                'gradient clipping norm, 0 = off')
    seed: int = knob(42, '--seed',
                     'random seed; the same seed reproduces the run')
    cache_chunk_size: Optional[int] = detail(None,
                                             'GradCache: encode each batch in chunks of N rows, the loss over the '
                                             'whole batch (default: off)')

    def validate(self) -> None:
        if self.cache_chunk_size is not None and not 1 <= self.cache_chunk_size <= self.batch_size:
            raise ConfigError(f"train.cache_chunk_size must be between 1 and the batch size ({self.batch_size} per "
                              f"worker), got {self.cache_chunk_size}; e.g. a quarter of the batch")
        if self.batch_size < 2:
            raise ConfigError(
                f"train.batch_size must be >= 2 (in-batch negatives need a second sentence), got {self.batch_size}"
            )
        at_least("train.epochs", self.epochs, 1)
        if self.max_steps is not None:
            at_least("train.max_steps", self.max_steps, 1)
        if not self.lr > 0:
            raise ConfigError(f"train.lr must be > 0, got {self.lr} (SimCSE uses 3e-5)")
        for key in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise ConfigError(f"train.{key} must be in [0, 1), got {getattr(self, key)}")
        if self.weight_decay < 0:
            raise ConfigError(f"train.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"train.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.max_grad_norm < 0:
            raise ConfigError(f"train.max_grad_norm must be >= 0 (0 disables clipping), got {self.max_grad_norm}")
        if not 0 <= self.seed < 2**32:  # numpy's and faiss's seeds are unsigned 32-bit
            raise ConfigError(f"train.seed must be in [0, 2**32), got {self.seed}")


COMPILE_OFF = ("false", "off", "no", "0")
COMPILE_ON = ("true", "on", "yes", "1", "default")
COMPILE_MODES = ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's other modes


@dataclass
class PrecisionSettings:
    """How a step is computed, not what it computes: number formats, padding, dropout masks, collation ahead."""

    precision: str = knob("auto", '--precision',
                          'auto | fp32 | bf16 | fp16 (auto: bf16 autocast on GPUs and on CPUs with native bf16, '
                          'AVX512-BF16/AMX; fp32 elsewhere)')
    # Encode each training batch as this many length-sorted sub-batches, each padded only to its own
    # longest row: the same loss over fewer padded tokens (benchmarks/results/speed-cpu.md). 1 = one padded call.
    # None: 2 on CPUs, 1 on GPUs, where a small encoder's step waits on the host's kernel launches,
    # which sub-batches multiply (BENCHMARKS.md, "On a GPU").
    length_buckets: Optional[int] = knob(None, '--length-buckets',
                                         'encode each batch as N length-sorted sub-batches to skip padding (same '
                                         'loss; default 2 on CPUs, 1 on GPUs; BERT-family models on CPUs unpad '
                                         'instead unless --unpad false)')
    # BERT-family encoders (BERT, RoBERTa, XLM-R): run every position-wise layer on the real tokens
    # only, padding just inside attention (raycse.model.unpad; same loss, BENCHMARKS.md). Replaces
    # length_buckets for those models; other architectures keep the buckets. Also applies to the
    # workers' STS-B dev scoring (`raycse eval` and grouping embeddings always unpad these models).
    unpad: bool = knob(True, '--unpad',
                       'BERT-family encoders run their layers on real tokens only (padding only inside attention; '
                       'same loss, faster)')
    # On CPU, draw dropout masks four to a 64-bit random word instead of with bernoulli_ (cheaper:
    # benchmarks/results/speed-cpu.md; p rounded to 1/32768; raycse.model.unpad.dropout). GPUs use PyTorch's.
    fast_dropout: bool = detail(True,
                                'on CPUs, dropout masks drawn four to a 64-bit random word (~4x cheaper, p rounded to'
                                " 1/32768); GPUs use PyTorch's")
    # Activation checkpointing: each layer's activations recomputed in the backward pass (the model's own
    # gradient_checkpointing_enable, or per layer on the unpadded path): same gradients, less memory.
    gradient_checkpointing: bool = knob(False, '--gradient-checkpointing',
                                        "recompute each transformer layer's activations in the backward pass "
                                        'instead of keeping them: less memory for about one more forward per step, '
                                        'the same gradients')
    # Tokenize the next step's batch on a helper thread while this step trains (raycse.train.ahead;
    # the same batches, losses and weights). auto: on GPUs, where the CPU would otherwise wait for
    # the GPU; off on CPUs, whose cores the step already keeps busy (no gain measured on 2 cores).
    collate_ahead: str = detail("auto",
                                'tokenize the next batch on a helper thread while a step trains: auto (on GPUs) | '
                                'true | false')
    # Pad each batch's token width up to a multiple of this: a run then sees few distinct batch shapes
    # (each new shape costs a GPU warm-up: kernel choice, allocator blocks). None: 8 on GPUs, 1 on
    # CPUs (which run BERT-family layers on the real tokens only, so padding costs them nothing).
    pad_to_multiple_of: Optional[int] = detail(None,
                                               "pad each batch's token width to a multiple of N, so that few batch "
                                               'shapes appear (default: 8 on GPUs, 1 on CPUs)')

    # torch.compile (inductor) of the module's forward: faster steps on GPUs after tens of seconds of
    # compiling (figures: benchmarks/results/gpu.md); off by default until `raycse train` itself is
    # measured with it on a GPU.
    compile: str = knob("false", '--compile',
                        "compile the step's forward with torch.compile: false | true (inductor's default mode) | "
                        'reduce-overhead (CUDA graphs; GPUs) | max-autotune | max-autotune-no-cudagraphs; '
                        'the first steps then take the compile time (tens of seconds); a compiled step '
                        'runs the padded forward with PyTorch\'s dropout (no --unpad, no fast_dropout) and 1 '
                        'length bucket unless set')

    @property
    def compile_mode(self) -> Optional[str]:
        """torch.compile's mode for ``compile`` (``true`` -> ``default``), or None when off."""
        value = self._compile_word()
        if value in COMPILE_OFF:
            return None
        return "default" if value in COMPILE_ON else value

    def _compile_word(self) -> str:
        """``compile`` as a lower-case word (YAML's ``true`` arrives as a bool)."""
        return str(self.compile).strip().lower()

    def validate(self) -> None:
        one_of("train.precision", self.precision, PRECISIONS)
        if self._compile_word() not in COMPILE_OFF + COMPILE_ON + COMPILE_MODES:
            raise ConfigError(f"train.compile must be one of false, true, {', '.join(COMPILE_MODES)}; got "
                              f"{self.compile!r}")
        if self.length_buckets is not None:
            at_least("train.length_buckets", self.length_buckets, 1)
        if self.pad_to_multiple_of is not None:
            at_least("train.pad_to_multiple_of", self.pad_to_multiple_of, 1)
        one_of("train.collate_ahead", self.collate_ahead, ("auto", "true", "false"))


@dataclass
class CheckpointSettings:
    """When checkpoints are written, how they reach storage and how many are kept (Ray Train's CheckpointConfig)."""

    checkpoint_steps: Optional[int] = detail(None,
                                             'save a resumable checkpoint every N steps (default: at every '
                                             'evaluation)')
    # How a checkpoint reaches its storage (Ray's CheckpointUploadMode). async: copied in the
    # background while training goes on, one copy at a time (a checkpoint first waits for the
    # previous copy, at most checkpoint_upload_timeout_s); sync: training waits for each copy;
    # auto: async when checkpoints go to object storage (--storage-path s3://...), else sync
    # (BENCHMARKS.md, "Checkpoints copied in the background"). The fit ends once its last is stored.
    checkpoint_upload: str = detail("auto",
                                    'how a checkpoint reaches its storage: async (copied in the background) | sync | '
                                    'auto (async to object storage)')
    checkpoint_upload_timeout_s: float = detail(1800.0,
                                                "seconds a checkpoint waits for the previous one's background copy")
    keep_checkpoints: int = detail(2, 'checkpoints kept: the best-scored first, then the most recent')

    def validate(self) -> None:
        if self.checkpoint_steps is not None:
            at_least("train.checkpoint_steps", self.checkpoint_steps, 1)
        at_least("train.keep_checkpoints", self.keep_checkpoints, 1)
        one_of("train.checkpoint_upload", self.checkpoint_upload, ("auto", "async", "sync"))
        if not self.checkpoint_upload_timeout_s > 0:
            raise ConfigError(f"train.checkpoint_upload_timeout_s must be > 0, got {self.checkpoint_upload_timeout_s}")


@dataclass
class FailureSettings:
    """Bounded waits for workers, and restarts after a worker dies (Ray Train's FailureConfig)."""

    max_failures: int = detail(0,
                               'times a run restarts from its latest checkpoint after a worker dies (-1: without '
                               'limit)')
    # Waiting for workers is bounded: each attempt to start the worker group waits this long for
    # its placement group and workers, and the run fails with the cluster's holders named after
    # this many attempts (worker failures after the start are max_failures' business).
    worker_start_timeout_s: float = detail(60.0,
                                           'seconds each attempt to start the workers waits for its placement group '
                                           'and workers')
    worker_start_attempts: int = detail(3,
                                        'attempts to start the workers before the run fails, naming what holds the '
                                        'cluster')
    # Before Ray starts, each worker's memory is estimated (raycse.train.memory) and a run that will not fit this
    # machine's memory or GPU is refused; false trusts the run as it is.
    memory_check: bool = detail(True,
                                "refuse, before Ray starts, a run whose workers' estimated memory (weights, gradients, "
                                "AdamW, activations) exceeds this machine's memory or GPU")

    def validate(self) -> None:
        if not self.worker_start_timeout_s > 0:
            raise ConfigError(f"train.worker_start_timeout_s must be > 0, got {self.worker_start_timeout_s}")
        at_least("train.worker_start_attempts", self.worker_start_attempts, 1)
        if self.max_failures < -1:
            raise ConfigError(f"train.max_failures must be >= 0 (or -1: retry forever), got {self.max_failures}")


@dataclass
class TrackingSettings:
    """What a run tells about itself: progress lines, experiment trackers, recorded batches, the profiler."""

    log_steps: int = knob(10, '--log-steps',
                          'print progress every N steps')
    tracking: Optional[str] = knob(None, '--tracking',
                                   'log config and metrics (loss, lr, throughput, dev scores; rank 0 only) to '
                                   'mlflow:URI (a tracking server, e.g. mlflow:http://127.0.0.1:5000), '
                                   'tensorboard:DIR or wandb:[ENTITY/]PROJECT (WANDB_API_KEY, or WANDB_MODE=offline; '
                                   'files in WANDB_DIR), or several joined by commas, e.g. '
                                   'mlflow:http://127.0.0.1:5000,tensorboard:tb (default: off)')
    record_batches: Optional[str] = detail(None, 'write every batch each worker trains on to DIR/rank{r}.jsonl')
    # "A:B": profile steps A+1..B on rank 0 with torch.profiler (host, and CUDA on GPUs); the
    # operator table goes to the worker's log, a summary to the metrics (metrics.json: last.profile;
    # raycse.train.profile). Pick steady steps, without a checkpoint among them. None: off.
    profile_steps: Optional[str] = detail(None,
                                          'A:B: profile steps A+1..B on rank 0 with torch.profiler (its table in the '
                                          "worker's log, a summary in metrics.json)")

    def profile_window(self) -> Optional[tuple]:
        """``profile_steps`` as (A, B), or None."""
        if self.profile_steps in (None, ""):
            return None
        start, sep, end = str(self.profile_steps).partition(":")
        try:
            window = (int(start), int(end))
        except ValueError:
            window = None
        if not sep or window is None or not 0 <= window[0] < window[1]:
            raise ConfigError(f"train.profile_steps must be A:B with 0 <= A < B (steps A+1..B are profiled), got "
                              f"{self.profile_steps!r}; e.g. 50:60")
        return window

    def validate(self) -> None:
        parse_tracking(self.tracking)
        at_least("train.log_steps", self.log_steps, 1)
        self.profile_window()


# (dataclass fields come base by base from the last base up: scaling's first in --help and config.yaml)
@dataclass
class TrainConfig(TrackingSettings, FailureSettings, CheckpointSettings, PrecisionSettings, OptimizerSettings,
                  ScalingSettings, Section):
    """The Ray Train loop, one concern a base class: scaling, optimiser, precision, checkpoints, failures and
    start, tracking."""

    CONCERNS = (ScalingSettings, OptimizerSettings, PrecisionSettings, CheckpointSettings, FailureSettings,
                TrackingSettings)

    def validate(self) -> None:
        for concern in self.CONCERNS:
            concern.validate(self)
        self.validate_compile()
        self.validate_sharding()

    def validate_sharding(self) -> None:
        """What a sharded run (FSDP2) cannot do with the other concerns' settings."""
        if self.sharding != "fsdp":
            return
        if self.cache_chunk_size:
            raise ConfigError("--sharding fsdp does not apply with GradCache (train.cache_chunk_size): GradCache runs the "
                              "encoder outside the module's forward, where FSDP2 gathers the shards; use "
                              "--gradient-checkpointing for less activation memory instead")
        if self.compile_mode is not None:
            raise ConfigError("--sharding fsdp does not apply with --compile here (raycse compiles the module before "
                              "sharding it); drop --compile")
        if self.precision == "fp16":
            raise ConfigError("--sharding fsdp trains in fp32 or bf16 (fp16's loss scaling is not sharded here); use "
                              "--precision bf16")

    def validate_compile(self) -> None:
        """What train.compile cannot do with the other concerns' settings."""
        mode = self.compile_mode
        if mode is None:
            return
        if self.cache_chunk_size:
            raise ConfigError("train.compile does not apply with GradCache (train.cache_chunk_size), which encodes "
                              "outside the compiled forward; drop one of them")
        if mode == "reduce-overhead" and not self.use_gpu:
            raise ConfigError(f"train.compile {mode} captures CUDA graphs, which need GPUs; add --use-gpu, or use "
                              f"--compile true on CPUs")


TRACKING_FORMS = ("mlflow:URI (e.g. mlflow:http://127.0.0.1:5000), tensorboard:DIR or wandb:[ENTITY/]PROJECT "
                  "(or KIND:TARGET of a tracker an installed package registers), or several of them separated by "
                  "commas")
TRACKERS = ("mlflow", "tensorboard", "wandb")  # raycse's own (raycse.train.trackers)
TRACKER_GROUP = "raycse.trackers"  # the entry-point group of installed packages' trackers


def parse_tracking(spec: Optional[str]) -> list[tuple[str, str]]:
    """``mlflow:URI`` / ``tensorboard:DIR`` / ``wandb:[ENTITY/]PROJECT``, or several joined by commas ->
    [(kind, target), ...]; None or "none" -> []. One tracker of each kind (W&B keeps one run a process)."""
    if spec is None or str(spec).lower() == "none":
        return []
    out: list[tuple[str, str]] = []
    for part in str(spec).split(","):
        kind, _, target = part.strip().partition(":")
        if not target or (kind not in TRACKERS and kind not in plugins.entry_point_names(TRACKER_GROUP)):
            raise ConfigError(f"tracking must be {TRACKING_FORMS}; got {spec!r}")
        if kind == "wandb" and not re.fullmatch(r"([\w.-]+/)?[\w.-]+", target):
            raise ConfigError(f"--tracking wandb:{target} is not a W&B project: use wandb:PROJECT or "
                              f"wandb:ENTITY/PROJECT (letters, digits, '.', '_', '-')")
        if kind in {k for k, _ in out}:
            raise ConfigError(f"--tracking names {kind} twice; give one tracker of each kind")
        out.append((kind, target))
    return out
