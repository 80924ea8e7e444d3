"""The evaluation part of a run: model selection during training (STS-B dev, BEIR, MTEB)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from raycse.config.fields import PRECISIONS, Section, at_least, detail, knob, one_of
from raycse.errors import ConfigError


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
    batch_size: int = detail(128, 'sentences per embedding call when scoring')
    # Score the starting model before training (the "before" number of the log and the model card).
    # auto: only when this machine remembers it (raycse.evaluation.initial_scores, free), so a first
    # run does not pay a full dev scoring for a number nobody asked for;
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
                       'model selection: stsb_dev (Spearman on --stsb-dev; sts for short), beir:DIR:METRIC (ndcg@10 | '
                       'mrr@10 | recall@100 on a BEIR-layout DIR, split eval.beir_split), or an MTEB main score: '
                       'mteb:TASK (a registered task whose data is cached), mteb:senteval:DIR:TASK, mteb:stsb:FILE or '
                       'mteb:beir:DIR; stsb_dev and beir scores may end in @int8, @uint8, @binary or @ubinary: scored '
                       'on the embeddings quantized so (as raycse eval --embedding-precision), e.g. sts@binary')
    beir_split: str = detail("test", 'the qrels split a beir: eval.metric scores (qrels/SPLIT.tsv)')

    def validate(self) -> None:
        at_least("eval.eval_steps", self.eval_steps, 1)
        at_least("eval.batch_size", self.batch_size, 1)
        one_of("eval.precision", self.precision, PRECISIONS + ("train",))
        if self.before_training != str(self.before_training).lower():  # YAML's true / false arrive as bools
            self.before_training = str(self.before_training).lower()
        one_of("eval.before_training", self.before_training, ("auto", "true", "false"))
        self.selection()

    def embedding_precision(self) -> str:
        """The precision the selection score quantizes the embeddings to: eval.metric's @PRECISION, else float32."""
        return self._metric_and_precision()[1]

    def _metric_and_precision(self) -> tuple[str, str]:
        base, at, tail = self.metric.rpartition("@")
        return (base, tail) if at and tail in EMBEDDING_PRECISIONS[1:] else (self.metric, "float32")

    def selection(self) -> tuple[str, Optional[str], Optional[str]]:
        """("stsb_dev", None, None), ("beir", DIR, metric as printed, e.g. nDCG@10) or ("mteb", None, None)
        (the task: :meth:`mteb_task`); the precision apart (:meth:`embedding_precision`)."""
        metric, precision = self._metric_and_precision()
        if metric in ("stsb_dev", "sts"):
            return "stsb_dev", None, None
        if metric.startswith("mteb:"):
            if precision != "float32":
                raise ConfigError(f"eval.metric {self.metric!r}: MTEB scores its own embeddings; @{precision} "
                                  f"applies to stsb_dev and beir:DIR:METRIC")
            self.mteb_task()
            return "mteb", None, None
        names = {"ndcg@10": "nDCG@10", "mrr@10": "MRR@10", "recall@100": "Recall@100"}
        kind, _, rest = metric.partition(":")
        directory, _, name = rest.rpartition(":")
        if kind != "beir" or not directory or name.lower() not in names:
            raise ConfigError(f"eval.metric must be stsb_dev, beir:DIR:METRIC with METRIC one of "
                              f"{', '.join(names)}, or mteb:TASK; got {self.metric!r}")
        return "beir", directory, names[name.lower()]

    def mteb_task(self):
        """The MTEB task of eval.metric mteb:... (raycse.config.eval_tasks.TaskSpec)."""
        from raycse.config.eval_tasks import parse_selection

        return parse_selection(self.metric)

    def score_key(self) -> str:
        """The metrics key of the model-selection score: stsb_dev_spearman, beir_ndcg@10 (...), mteb_STS12 (...),
        with ``_PRECISION`` after a quantized one's (stsb_dev_spearman_binary)."""
        kind, _, name = self.selection()
        if kind == "mteb":
            return self.mteb_task().key
        precision = self.embedding_precision()
        key = "stsb_dev_spearman" if kind == "stsb_dev" else f"beir_{name.lower()}"
        return key if precision == "float32" else f"{key}_{precision}"

    def score_label(self) -> str:
        """The selection score as logs print it: "STS-B dev Spearman", "BEIR nDCG@10 x100 (binary)", "MTEB STS12"."""
        kind, _, name = self.selection()
        if kind == "mteb":
            return self.mteb_task().label
        precision = self.embedding_precision()
        label = "STS-B dev Spearman" if kind == "stsb_dev" else f"BEIR {name.lower()} x100"
        return label if precision == "float32" else f"{label} ({precision})"

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


# the embeddings' precisions a score may quantize them to (sentence-transformers' quantize_embeddings)
EMBEDDING_PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
DATA_ENV = "RAYCSE_DATA"  # a folder of data (wiki_sample.txt, stsbenchmark/sts-dev.csv) that "auto" settings use


STSB_DEV_IN_DATA = "stsbenchmark/sts-dev.csv"
