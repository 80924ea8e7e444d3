"""MTEB evaluation through the ``mteb`` package (extra ``raycse[mteb]``): registered tasks from the
Hugging Face cache, and local tasks built on mteb's own task classes from the SentEval and BEIR
layouts raycse reads.

- Registered tasks (``mteb.get_tasks``) load their data with ``datasets``. raycse never downloads at
  evaluation time on a machine that cannot reach the hub: there the data is read from the cache only,
  and a task whose data is not cached is refused in one line that names the offline fixes.
- Local tasks: ``senteval:DIR`` gives one ``AbsTaskSTS`` per STS task (STS12-16 in the "all"
  setting: one Spearman over every subset of the year, as ``evaluation/sts.py``), ``stsb:FILE`` one
  over an STS Benchmark-format file (e.g. the STS-B dev set), ``beir:DIR`` one
  ``AbsTaskRetrieval`` (documents as title + text, queries with relevant documents only, a query's
  own id left out of its results: BEIR's ``ignore_identical_ids``).
- Scoring is mteb's own (``mteb.evaluate``); raycse only hands it the embeddings, through
  :func:`model_for`, the same ``Encoder.encode`` that ``raycse eval`` scores with. mteb's prompt
  types map to the model's prompts "query" and "document", as sentence-transformers names them.
- Scores are the task's main score x100 (raycse's scale). No result cache is written (mteb's
  default would write under ~/.cache/mteb, which no raycse command owns).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from raycse.config.eval_tasks import LOCAL_KINDS, TaskSpec, parse_local, parse_registered, parse_selection  # noqa: F401 - re-exported
from raycse.errors import ConfigError, DataError, RaycseError

EmbedFn = Callable[..., np.ndarray]  # embed(texts, prompt_name=None) -> (n, d) float32
OFFLINE_FIX = ("copy a Hugging Face cache that holds it (HF_HOME) from a machine that ran the task online, "
               "or score local files with mteb's task classes: raycse eval --mteb-local senteval:DIR | stsb:FILE | "
               "beir:DIR, or in training --eval-metric mteb:stsb:FILE | mteb:senteval:DIR:TASK | mteb:beir:DIR")


# ------------------------------------------------------------------------------------------ model
def _model_class():
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    class RaycseModel(AbsEncoder):
        """mteb's encoder protocol over a raycse embed function (cosine similarity, as raycse scores)."""

        def __init__(self, embed: EmbedFn, name: str):
            self.embed = embed
            self.mteb_model_meta = ModelMeta.create_empty({"name": name, "similarity_fn_name": ScoringFunction.COSINE})

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            from raycse.evaluation.beir import DOCUMENT, QUERY

            texts = [t for batch in inputs for t in batch["text"]]
            kind = getattr(prompt_type, "value", prompt_type)
            prompt_name = {"query": QUERY, "document": DOCUMENT}.get(kind)
            return self.embed(texts, prompt_name=prompt_name)

    return RaycseModel


def model_for(embed: EmbedFn, model_name: str):
    """An mteb model over ``embed``; its name is the model's (org/name form, as mteb asks)."""
    name = model_name.rstrip("/").replace("\\", "/")
    name = name if name.count("/") == 1 and not name.startswith(("/", ".")) else f"raycse/{Path(name).name or 'model'}"
    return _model_class()(embed, name)


# ------------------------------------------------------------------------------------------ tasks
def _sts_task(spec: TaskSpec):
    import datasets

    from raycse.evaluation.mteb_tasks import LocalSTS, metadata
    from raycse.evaluation.sts import load_task, read_stsb

    data = read_stsb(spec.directory) if spec.kind == "stsb" else load_task(spec.directory, spec.name)
    pairs = datasets.Dataset.from_dict({"sentence1": data.sent1, "sentence2": data.sent2,
                                        "score": [float(g) for g in data.gold]})
    where = "the STS Benchmark-format file" if spec.kind == "stsb" else "the SentEval directory"
    meta = metadata(f"{spec.name}-local", "STS", "cosine_spearman", f"{spec.name} from {where} {spec.directory}",
                    spec.directory)
    return LocalSTS(meta, {"default": {"test": pairs}}, min_score=1 if spec.name == "SICKRelatedness" else 0)


def _beir_task(spec: TaskSpec, split: str):
    import datasets

    from raycse.evaluation.beir import read_beir
    from raycse.evaluation.mteb_tasks import LocalRetrieval, metadata

    data = read_beir(spec.directory, split)
    meta = metadata("BEIR-local", "Retrieval", "ndcg_at_10",
                    f"BEIR-layout directory {spec.directory}, qrels/{split}.tsv", spec.directory)
    return LocalRetrieval(meta, {"default": {"test": {
        "corpus": datasets.Dataset.from_dict({"id": data.doc_ids, "text": data.docs}),
        "queries": datasets.Dataset.from_dict({"id": data.query_ids, "text": data.queries}),
        "relevant_docs": {q: dict(d) for q, d in data.qrels.items()},
        "top_ranked": None}}})


def _registered_task(spec: TaskSpec):
    import mteb

    try:
        (task,) = mteb.get_tasks(tasks=[spec.name])
    except (KeyError, ValueError) as exc:
        said = str(exc.args[0] if exc.args else exc).strip("\"' ")  # mteb's own line, "did you mean" included
        raise RaycseError(f"unknown MTEB task '{spec.name}' ({said}); list them with "
                          f"python -c \"import mteb; print(mteb.get_tasks())\"") from None
    return task


@dataclass
class Suite:
    """Tasks built and their data loaded, before any model loads (bad input fails first)."""

    specs: list[TaskSpec]
    tasks: list = field(default_factory=list)

    def travel_ready(self) -> "Suite":
        """The tasks' data copied into memory, for a suite that goes to a Ray worker (model selection): a
        cached task's data maps files of this machine's cache, which a worker on another node lacks."""
        for task in self.tasks:
            task.dataset = _in_memory(task.dataset)
        return self

    def digest(self) -> str:
        """A digest of what the scores depend on besides the model: mteb's version, each task's name and main
        score, and its data's content (for raycse.evaluation.initial_scores' key)."""
        import hashlib
        import json

        import mteb

        h = hashlib.sha256(str(mteb.__version__).encode())
        for task in self.tasks:
            h.update(json.dumps([task.metadata.name, task.metadata.main_score]).encode())
            _digest_data(task.dataset, h)
        return h.hexdigest()

    def run(self, embed: EmbedFn, model_name: str, batch_size: int = 128, progress: bool = False) -> dict:
        """{spec.key: {"task", "main_score", "score" (x100), "scores": {split: {subset: every metric mteb gives,
        as mteb names them}}}}."""
        import mteb

        result = mteb.evaluate(model_for(embed, model_name), self.tasks, cache=None, co2_tracker=False,
                               encode_kwargs={"batch_size": batch_size, "show_progress_bar": progress},
                               show_progress_bar=progress, overwrite_strategy="always")
        by_name = {r.task_name: r for r in result.task_results}
        out = {}
        for spec, task in zip(self.specs, self.tasks):
            res = by_name[task.metadata.name]
            main = task.metadata.main_score
            out[spec.key] = {"task": task.metadata.name, "main_score": main,
                             "score": 100.0 * float(res.get_score()),  # mteb's mean over splits and subsets
                             "scores": {split: {row["hf_subset"]: _finite(row) for row in rows}
                                        for split, rows in res.scores.items()}}
        return out


DIGEST_ROWS = 1 << 14  # rows a dataset is hashed by, as Arrow (never the whole of it in Python objects)


class _HashSink:
    """A write-only file whose bytes go into a hash: what Arrow's IPC writer serialises, hashed as it goes."""

    def __init__(self, h):
        self.h, self.closed = h, False

    def write(self, data) -> int:
        self.h.update(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _digest_data(data, h) -> None:
    import json

    import datasets
    import pyarrow as pa

    if isinstance(data, datasets.Dataset):
        # the rows the dataset shows (its indices mapping applied) as an Arrow IPC stream, a batch at a time:
        # the same bytes for the same rows and types, whether the table is in memory or maps cache files
        view = data.with_format("arrow")
        with pa.ipc.new_stream(pa.PythonFile(_HashSink(h), mode="w"), view.data.schema) as stream:
            for batch in view.iter(batch_size=DIGEST_ROWS):
                # copied from offset 0, in one chunk: a slice's IPC bytes differ from its copy's, and chunking is
                # no content
                for record_batch in batch.take(np.arange(batch.num_rows)).combine_chunks().to_batches():
                    stream.write_batch(record_batch)
    elif isinstance(data, dict):
        for k in sorted(data, key=str):
            h.update(str(k).encode())
            _digest_data(data[k], h)
    else:
        h.update(json.dumps(data, sort_keys=True, default=str).encode())


def _finite(row: dict) -> dict:
    """mteb's numbers as plain floats; the undefined ones (NaN: e.g. nAUC on a set too small) left out, so
    the JSON stays JSON."""
    import math

    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float, np.floating)) and not isinstance(v, bool) and math.isfinite(v)}


def load_suite(specs: Sequence[TaskSpec], split: str = "test") -> Suite:
    """Every task built and its data read; a registered task whose data cannot be had is one line."""
    from raycse.errors import require

    require("mteb", "mteb", "MTEB evaluation")
    keys = [spec.key for spec in specs]
    twice = [spec for spec in specs if keys.count(spec.key) > 1]
    if twice:
        raise RaycseError(f"{twice[0].label} is asked for twice; give each task once (one --mteb-local per kind)")
    suite = Suite(list(specs))
    for spec in suite.specs:
        if spec.kind in ("senteval", "stsb"):
            task = _sts_task(spec)
        elif spec.kind == "beir":
            task = _beir_task(spec, split)
        else:
            task = _registered_task(spec)
            _load_cached(task)
        suite.tasks.append(task)
    return suite


def _load_cached(task) -> None:
    """Load a registered task's data, from the cache only when the hub cannot be reached."""
    from raycse.platform import hub

    reason = None
    try:
        with hub.cache_only_if_unreachable() as reason:
            task.load_data()
    except Exception as exc:  # datasets raises several kinds (ConnectionError, FileNotFoundError, ...)
        why = reason or f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        raise DataError(f"MTEB task '{task.metadata.name}' has no data in this machine's Hugging Face cache and "
                        f"cannot fetch it ({why}); {OFFLINE_FIX}") from None


def _in_memory(data):
    """A task's data with every Dataset copied into memory: a cached one maps files of this machine's cache,
    and would not travel to a Ray worker on another node."""
    import datasets

    if isinstance(data, datasets.Dataset):
        return datasets.Dataset.from_dict(data.to_dict(), features=data.features)
    if isinstance(data, dict):  # DatasetDict included
        return type(data)({k: _in_memory(v) for k, v in data.items()})
    return data
