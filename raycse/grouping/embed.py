"""Per-example features for grouping, computed on the cluster with Ray Data.

- :func:`embed_corpus`: the model's sentence vectors, ``map_batches`` on an actor pool (each
  actor loads the model once; one GPU per actor when the run uses GPUs). Pairs are embedded by
  their first text (grouping is by the query) or, with ``grouping.by: second``, their second.
- :func:`shingle_keys`: one random content-word hash per example, in plain tasks.
Both come back to the driver indexed by row id (N x d: float32, 1.5 GB per million at d=384; or
normalised float16, as grouping takes them, 0.77 GB).
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class Embedder:
    """Actor-pool worker: loads the encoder once, embeds batches of texts in eval mode."""

    def __init__(self, model_path: str, max_length: int, batch_size: int, use_gpu: bool, precision: str,
                 prompt_name: Optional[str] = None, prompts: Optional[dict] = None, trust_remote_code: bool = False):
        import torch

        from raycse.model.encoder import Encoder
        from raycse.model.precision import resolve_precision

        self.encoder = Encoder.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.encoder.add_prompts(prompts or {})  # a training run's data.prompts, as its workers hold them
        if use_gpu and torch.cuda.is_available():
            self.encoder.to("cuda")
        self.max_length, self.batch_size, self.prompt_name = max_length, batch_size, prompt_name
        self.dtype = resolve_precision(precision, self.encoder.device)

    def __call__(self, batch: dict) -> dict:
        z = self.encoder.encode(list(batch["text"]), batch_size=self.batch_size, max_length=self.max_length,
                                autocast_dtype=self.dtype, prompt_name=self.prompt_name)
        return {"_id": batch["_id"], "emb": z}


def texts_corpus(texts: list[str]):
    """Texts this process holds as a corpus for :func:`embed_corpus` (``dataset`` of _id, text;
    ``num_examples``): mining's candidates, a BEIR corpus."""
    import types

    import pyarrow as pa

    from raycse.data.dataset import local_dataset

    table = pa.table({"_id": np.arange(len(texts), dtype=np.int64), "text": texts})
    return types.SimpleNamespace(dataset=local_dataset(table), num_examples=len(texts))


def column(by: str) -> str:
    """The dataset column a grouping keys on: a pair's first text (``text``) or second (``pair``)."""
    return "pair" if by == "second" else "text"


def grouping_prompt_name(prompts: Optional[dict], by: str) -> Optional[str]:
    """The prompt a grouping embeds its key column with, so that it groups the text training sees:
    the column's own ``data.prompts`` entry (named as :meth:`Encoder.add_prompts` keeps it) where the
    run gives one, else the model's default prompt (None)."""
    from raycse.model.encoder import PROMPT_NAMES

    role = column(by)
    return PROMPT_NAMES[role] if role in (prompts or {}) else None


def _num_blocks(ds) -> int:
    try:
        return ds.num_blocks()  # known for a materialized corpus (load_corpus, mine's pairs)
    except Exception:  # a lazy dataset does not say: assume it streams enough blocks
        return 1 << 30


def embed_corpus(corpus, model_path: str, max_length: int, actors: int = 1, batch_size: int = 256,
                 use_gpu: bool = False, precision: str = "auto", by: str = "first",
                 gpus_per_actor: float = 1.0, prompt_name: Optional[str] = None,
                 prompts: Optional[dict] = None, dtype="float32", trust_remote_code: bool = False) -> np.ndarray:
    """Embeddings by row id, after the prompt ``Encoder.prompt(prompt_name)`` picks (of the model's
    prompts and a training run's ``prompts``, :meth:`Encoder.add_prompts`); with ``use_gpu``
    each actor holds ``gpus_per_actor`` (a training run's train.gpus_per_worker, so the trials sharing a
    GPU can embed side by side). ``dtype=np.float16``: L2-normalised rows in half the memory
    (grouping compares cosines only; 10M x 384 is 7.7 GB instead of 15.4); ``"auto"``: float16 where
    float32 would take over ``HALF_ABOVE`` of the memory free now (:func:`vector_dtype`); below
    that, float32 keeps the cosines exact."""
    from raycse.data.dataset import ray_data_errors
    from raycse.grouping.vectors import normalize

    import ray.data

    ds = corpus.dataset.select_columns(["_id", column(by)]).rename_columns({column(by): "text"})
    if actors > 1 and _num_blocks(corpus.dataset) < 2 * actors:
        # A block goes to one actor whole: one file read as one block kept a pool of N at 1 busy actor.
        # Split before the pool starts: its actors may hold every CPU the split's tasks would need.
        ds = ds.repartition(4 * actors).materialize()
    ds = ds.map_batches(
        Embedder, fn_constructor_kwargs={"model_path": model_path, "max_length": max_length,
                                         "batch_size": batch_size, "use_gpu": use_gpu, "precision": precision,
                                         "prompt_name": prompt_name, "prompts": prompts,
                                         "trust_remote_code": trust_remote_code},
        # from 1 actor up to `actors`: a pool that waited for all of them could wait for ever on a busy cluster
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors), batch_size=batch_size * 4, batch_format="numpy",
        num_gpus=gpus_per_actor if use_gpu else 0, num_cpus=0 if use_gpu else 1)
    out = None
    with ray_data_errors():  # (a pool that never got its CPUs or GPUs: one line)
        for b in ds.iter_batches(batch_format="numpy", batch_size=None):
            emb = np.asarray(b["emb"], dtype=np.float32)
            if out is None:
                kept = vector_dtype(corpus.num_examples, emb.shape[1]) if str(dtype) == "auto" else dtype
                out = np.zeros((corpus.num_examples, emb.shape[1]), dtype=kept)
            out[b["_id"]] = normalize(emb) if out.dtype == np.float16 else emb  # unit rows never overflow float16
    return out


HALF_ABOVE = 0.25  # of the free memory: float32 vectors larger than this are kept in float16


def vector_dtype(n: int, dim: int, available: Optional[int] = None, quiet: bool = False):
    """float16 where ``n`` x ``dim`` float32 vectors would take over ``HALF_ABOVE`` of the memory
    free (``available``, default: this node's now), else float32; a float16 choice is printed
    (unless ``quiet``)."""
    import psutil

    free = psutil.virtual_memory().available if available is None else available
    if n * dim * 4 <= HALF_ABOVE * free:
        return np.float32
    if quiet:
        return np.float16
    print(f"[raycse] grouping: {n:,} embeddings kept normalised in float16 ({n * dim * 4 / 2**30:.1f} GiB in "
          f"float32, {free / 2**30:.1f} GiB free)", flush=True)
    return np.float16


def check_room_to_group(n: int, dim: Optional[int], grouping, available: Optional[int] = None) -> None:
    """Before kNN grouping embeds ``n`` rows (hours at 10M on CPUs): one line (exit 2) where their
    ``dim``-wide vectors, kept as :func:`vector_dtype` would keep them, and the search's own arrays
    would not fit in the memory free on this node now. Other strategies, or an unknown width: nothing."""
    if grouping.strategy != "knn" or not dim:
        return
    import psutil

    from raycse.grouping import knn

    free = psutil.virtual_memory().available if available is None else available
    itemsize = np.dtype(vector_dtype(n, dim, free, quiet=True)).itemsize
    method, _ = knn.choose(n, grouping.search, grouping.exact_threshold)
    # normalized=False: the vectors, not made yet, are counted where the search's normalised copy would be
    knn.check_memory(n, dim, grouping.neighbours, method, available=free, normalized=False, itemsize=itemsize)


def shingle_keys(corpus, seed: int, epoch: int, size: int = 1, by: str = "first") -> np.ndarray:
    from raycse.data.dataset import ray_data_errors
    from raycse.grouping.strategies import shingle_key

    col = column(by)

    def keys(batch: dict) -> dict:
        return {"_id": batch["_id"], "key": np.array([shingle_key(t, seed, epoch, int(i), size)
                                                     for t, i in zip(batch[col], batch["_id"])], dtype=np.int64)}

    out = np.zeros(corpus.num_examples, dtype=np.int64)
    with ray_data_errors():
        for b in corpus.dataset.select_columns(["_id", col]).map_batches(keys, batch_format="numpy").iter_batches(
                batch_format="numpy", batch_size=None):
            out[b["_id"]] = b["key"]
    return out
