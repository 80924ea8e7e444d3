"""mteb's own task classes over data raycse has read (SentEval STS pairs, a BEIR directory). This module
imports mteb at the top: only :mod:`raycse.evaluation.mteb_eval` imports it, once the extra is known to
be installed. The classes live at module level so that a loaded task pickles by name to a Ray worker
(model selection on rank 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.sts import AbsTaskSTS
from mteb.abstasks.task_metadata import TaskMetadata


def metadata(name: str, task_type: str, main_score: str, description: str, directory: str) -> TaskMetadata:
    """What mteb asks of a task; a local one has no hub dataset, licence or date to name."""
    return TaskMetadata(
        name=name, description=description, type=task_type, category="t2t", eval_splits=["test"],
        eval_langs=["eng-Latn"], main_score=main_score, reference=None, modalities=["text"],
        dataset={"path": f"local/{Path(directory).name or 'data'}", "revision": "local"},
        date=None, domains=None, task_subtypes=None, license="not specified", annotations_creators=None,
        dialect=[], sample_creation=None, bibtex_citation="")


class LocalSTS(AbsTaskSTS):
    """Sentence pairs with gold scores: {"default": {"test": Dataset(sentence1, sentence2, score)}}."""

    def __init__(self, meta: TaskMetadata, dataset: dict, min_score: int = 0, max_score: int = 5):
        self.metadata, self.min_score, self.max_score = meta, min_score, max_score
        super().__init__()
        self.dataset, self.data_loaded = dataset, True

    def load_data(self, **kwargs: Any) -> None:  # the data came with the task
        pass


class LocalRetrieval(AbsTaskRetrieval):
    """{"default": {"test": {corpus, queries, relevant_docs, top_ranked}}}, mteb's retrieval layout."""

    ignore_identical_ids = True  # BEIR's convention, as raycse's own retrieval

    def __init__(self, meta: TaskMetadata, dataset: dict):
        self.metadata = meta
        super().__init__()
        self.dataset, self.data_loaded = dataset, True

    def load_data(self, **kwargs: Any) -> None:
        pass
