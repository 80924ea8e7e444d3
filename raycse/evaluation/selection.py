"""The model-selection score of a training run (best checkpoint, Tune's rungs): ``eval.metric``.

- ``stsb_dev``: Spearman x100 on the STS-B dev file (``eval.stsb_dev``);
- ``beir:DIR:METRIC``: nDCG@10, MRR@10 or Recall@100 x100 on a BEIR-layout directory
  (``qrels/{eval.beir_split}.tsv``), retrieval as ``raycse eval --beir-dir`` does it;
- either with ``@int8``, ``@uint8``, ``@binary`` or ``@ubinary``: scored on the embeddings quantized so
  (:mod:`raycse.evaluation.quantized`, as ``raycse eval --embedding-precision``);
- ``mteb:TASK`` (a registered task, its data cached), ``mteb:senteval:DIR:TASK`` or ``mteb:beir:DIR``: the
  task's MTEB main score x100, scored by mteb as ``raycse eval --mteb`` does it.

The data is read once on the driver (bad input fails before Ray starts) and shipped to rank 0.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

EmbedFn = Callable[[Sequence[str]], np.ndarray]


@dataclass
class Selection:
    key: str  # the metrics key: stsb_dev_spearman, beir_ndcg@10, ...
    label: str  # as printed: "STS-B dev Spearman", "BEIR nDCG@10"
    sts: Optional[object] = None  # raycse.evaluation.sts.STSData
    beir: Optional[object] = None  # raycse.evaluation.beir.BeirData
    beir_metric: Optional[str] = None
    mteb: Optional[object] = None  # raycse.evaluation.mteb_eval.Suite of one task, its data in memory
    precision: str = "float32"  # the embeddings quantized to this first (raycse.evaluation.quantized)

    def score(self, embed: EmbedFn) -> float:
        if self.mteb is not None:
            (row,) = self.mteb.run(embed, "raycse/model").values()  # (the name mteb's result carries)
            return row["score"]
        if self.sts is not None:
            from raycse.evaluation.sts import evaluate_datasets

            return evaluate_datasets(embed, [self.sts], self.precision)[self.sts.name]
        from raycse.evaluation.beir import DOCUMENT, QUERY, TOP_K, retrieval_metrics
        from raycse.evaluation.quantized import search_at

        run = search_at(embed(self.beir.docs, prompt_name=DOCUMENT), embed(self.beir.queries, prompt_name=QUERY),
                        self.beir, self.precision, TOP_K)
        return 100.0 * retrieval_metrics(self.beir.qrels, run)[self.beir_metric]


def load_selection(eval_cfg) -> Optional[Selection]:
    """The run's selection data, or None (no STS-B dev set: train without scoring)."""
    kind, directory, metric = eval_cfg.selection()
    if kind == "mteb":
        from raycse.evaluation.mteb_eval import load_suite

        spec = eval_cfg.mteb_task()
        return Selection(spec.key, spec.label, mteb=load_suite([spec], eval_cfg.beir_split).travel_ready())
    if kind == "beir":
        from raycse.evaluation.beir import read_beir

        return Selection(eval_cfg.score_key(), eval_cfg.score_label(), beir=read_beir(directory, eval_cfg.beir_split),
                         beir_metric=metric, precision=eval_cfg.embedding_precision())
    dev = stsb_dev(eval_cfg)
    return None if dev is None else Selection(eval_cfg.score_key(), eval_cfg.score_label(), sts=dev,
                                              precision=eval_cfg.embedding_precision())


def stsb_dev(eval_cfg, name: str = "stsb_dev"):
    """The STS-B dev pairs eval.stsb_dev names: a file; or for auto, $RAYCSE_DATA's file, else the hub's
    public dataset (from the Hugging Face cache where the hub cannot be reached); None when there is none."""
    from raycse.evaluation.sts import HUB_STSB, read_hub_stsb, read_stsb

    path = eval_cfg.resolved_stsb_dev()
    if path is not None:
        return read_stsb(path, name=name)
    if str(eval_cfg.stsb_dev).lower() != "auto":
        return None
    dev = read_hub_stsb(name)
    if dev is not None:
        print(f"[raycse] STS-B dev: the Hugging Face dataset {HUB_STSB} ({len(dev)} pairs; no "
              f"$RAYCSE_DATA/stsbenchmark/sts-dev.csv here)", file=sys.stderr)
    return dev
