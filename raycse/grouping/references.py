"""Reference vectors: a teacher's or a guide's embeddings of every corpus row, computed once per corpus.

``--teacher`` and ``--guide`` (raycse.objectives.references) read, for each batch, a reference model's
embeddings of the batch's sentences. They are computed before the fit by Ray Data actors
(:func:`raycse.grouping.embed.embed_corpus`: one model load per actor, on the GPU with ``--use-gpu``) for
each column the step needs (``text``; ``pair`` for pairs; ``negatives`` for hard negatives, k a row) and
come back by row id.

Each column's vectors are kept per machine in RAYCSE_CACHE/references, keyed by the model's files, the
embedding settings and a digest of the column's texts that does not depend on their order: every epoch,
every seed's shuffle, every Tune trial and every rerun of the same corpus reads them back, by each
text's 64-bit hash. What is embedded: the corpus's sentences as written, cut at model.max_length; the
teacher with its own default prompt, the starting model (``--guide initial``) with the run's prompts,
as the student sees them.
"""

from __future__ import annotations

import hashlib
import json
import os
import types
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np

INITIAL = "initial"  # --guide initial: the frozen starting model
REFERENCES = "references"  # their folder in raycse's cache


def text_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def column_corpus(corpus, column: str, per_row: int = 0):
    """``corpus`` as :func:`embed_corpus` reads it, holding ``column``'s texts under ``text`` with their own ids:
    the rows' ids for ``text`` and ``pair``; for ``negatives`` (``per_row`` a row), row id * per_row + m."""
    from raycse.grouping.embed import column as key_column

    if column != "negatives":
        by = "second" if column == "pair" else "first"
        ds = corpus.dataset.select_columns(["_id", key_column(by)]).rename_columns({key_column(by): "text"})
        return types.SimpleNamespace(dataset=ds, num_examples=corpus.num_examples)

    def flat(batch: dict) -> dict:
        ids = np.asarray(batch["_id"], dtype=np.int64)
        out_ids = (ids[:, None] * per_row + np.arange(per_row)[None, :]).reshape(-1)
        texts = [str(t) for negs in batch["negatives"] for t in list(negs)[:per_row]]
        return {"_id": out_ids, "text": np.array(texts, dtype=object)}

    ds = corpus.dataset.select_columns(["_id", "negatives"]).map_batches(flat, batch_format="numpy")
    return types.SimpleNamespace(dataset=ds, num_examples=corpus.num_examples * per_row)


def hashes_of(texts_corpus) -> np.ndarray:
    """Each text's :func:`text_hash`, by id (Ray Data tasks)."""
    from raycse.data.dataset import ray_data_errors

    def hashed(batch: dict) -> dict:
        return {"_id": batch["_id"], "h": np.array([text_hash(str(t)) for t in batch["text"]], dtype=np.uint64)}

    out = np.zeros(texts_corpus.num_examples, dtype=np.uint64)
    with ray_data_errors():
        for b in texts_corpus.dataset.map_batches(hashed, batch_format="numpy").iter_batches(
                batch_format="numpy", batch_size=None):
            out[b["_id"]] = b["h"]
    return out


def cache_path(model_path: str, settings: dict, hashes: np.ndarray) -> Path:
    """Where one column's vectors are kept: a digest of the model's files, the settings and the texts (as a set)."""
    from raycse.platform.caches import cache_dir, model_stamp

    content = hashlib.sha256(np.sort(hashes).tobytes()).hexdigest()
    key = json.dumps({"model": model_stamp(model_path), "settings": settings, "texts": content}, sort_keys=True,
                     default=str)
    return cache_dir() / REFERENCES / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"


def _digest(hashes: np.ndarray, vectors: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(hashes).tobytes() + np.ascontiguousarray(vectors).tobytes()).hexdigest()


def read_cached(path: Path, hashes: np.ndarray, width: Optional[int] = None) -> tuple[Optional[np.ndarray], str]:
    """(the vectors of ``hashes`` from ``path``, "") when the file is whole: its digest, its width (``width``,
    the model's, where known) and finite values checked; (None, "") where there is no such file or it lacks
    one of the texts; (None, what is wrong) for a file that is not to be trusted."""
    if not path.is_file():
        return None, ""
    try:
        with np.load(path, allow_pickle=False) as z:
            kept, vectors, meta = z["hashes"], z["vectors"], json.loads(str(z["meta"]))
        digest, kept_width = str(meta["sha256"]), int(meta["width"])
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        return None, "unreadable, or written without its digest"
    if kept.ndim != 1 or vectors.ndim != 2 or len(kept) != len(vectors) or not np.issubdtype(vectors.dtype, np.floating):
        return None, "its arrays disagree"
    if _digest(kept, vectors) != digest:
        return None, "its vectors do not match their digest"
    if vectors.shape[1] != kept_width or (width is not None and kept_width != width):
        return None, f"{vectors.shape[1]}-d vectors for a {width or kept_width}-d model"
    if not np.isfinite(vectors).all():
        return None, "it holds values that are not finite"
    at = np.searchsorted(kept, hashes)
    if len(kept) == 0 or (at >= len(kept)).any() or (kept[np.minimum(at, len(kept) - 1)] != hashes).any():
        return None, ""
    return vectors[at].astype(np.float32), ""


def write_cached(path: Path, hashes: np.ndarray, vectors: np.ndarray, model: str = "") -> None:
    """Whole or not at all, with the model's name, the vectors' width and their digest; a read-only cache is no
    error (the vectors still serve this run)."""
    from raycse.platform.redact import redact

    kept, first = np.unique(hashes, return_index=True)
    vectors = np.ascontiguousarray(vectors[first])
    meta = json.dumps({"model": redact(model), "width": int(vectors.shape[1]), "sha256": _digest(kept, vectors)})
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, hashes=kept, vectors=vectors, meta=np.array(meta))
        tmp.replace(path)
    except OSError:
        pass
    finally:  # (an interrupt or a full disk mid-write leaves no part-written file behind)
        tmp.unlink(missing_ok=True)


def column_texts(corpus, column: str, per_row: int = 0) -> tuple:
    """(``column``'s texts as :func:`embed_corpus` reads them, each text's hash by id): made once a column,
    for the teacher and the guide both."""
    texts = column_corpus(corpus, column, per_row)
    return texts, hashes_of(texts)


def reference_vectors(texts, hashes: np.ndarray, model_path: str, settings: dict, what: str) -> np.ndarray:
    """The vectors by id (float32) of ``model_path`` for one column's ``texts`` (:func:`column_texts`), read back
    from the cache or embedded now and kept; ``what`` names them in the log ("teacher: text"). ``settings``:
    :func:`embed_corpus`'s keywords (max_length, actors, batch_size, use_gpu, precision, gpus_per_actor,
    prompt_name, prompts, trust_remote_code)."""
    import time

    from raycse.grouping.embed import embed_corpus
    from raycse.model.loading import embedding_width_of
    from raycse.platform.caches import checked_cache_dir

    checked_cache_dir(REFERENCES)
    path = cache_path(model_path, settings, hashes)
    width = embedding_width_of(model_path)
    vectors, problem = read_cached(path, hashes, width)
    if vectors is not None:
        print(f"[raycse] {what}: {len(hashes):,} embeddings read back from {path}", flush=True)
        return vectors
    if problem:
        print(f"[raycse] {what}: the cached vectors {path} are not to be trusted ({problem}); computing them again",
              flush=True)
    started = time.perf_counter()
    kwargs = {k: v for k, v in settings.items() if k != "max_length"}
    vectors = embed_corpus(texts, model_path, settings["max_length"], dtype=np.float32, **kwargs)
    write_cached(path, hashes, vectors, model_path)
    print(f"[raycse] {what}: {len(hashes):,} embeddings ({vectors.shape[1]}-d) computed in "
          f"{time.perf_counter() - started:.1f} s, kept in {path}", flush=True)
    return vectors
