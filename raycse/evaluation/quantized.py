"""Scores of quantized embeddings: what an index that keeps int8 or binary vectors would find.

Quantization is sentence-transformers' own (``quantize_embeddings``), on L2-normalised vectors as its
evaluators quantize them:
- ``int8`` / ``uint8``: each coordinate cut into 256 even steps between its minimum and maximum over a
  calibration set: ``floor((x - min) / ((max - min) / 255))``, clipped to [0, 255] (``int8``: minus 128). The
  calibration set is the evaluated corpus's own embeddings: an STS task's sentences (both sides together, as
  sentence-transformers' evaluator does), a BEIR corpus's documents (its queries take the same ranges).
- ``binary`` / ``ubinary``: one bit per coordinate, ``x > 0``, packed 8 to a byte (``binary``: minus 128).

Similarity: the cosine of the integer vectors (int8, uint8, as sentence-transformers scores them); for bits,
the Hamming similarity ``1 - hamming(a, b) / d`` (the share of equal bits), and BEIR's search on bits is
faiss's binary index (exact Hamming distance).

>>> import numpy as np
>>> x = np.array([[0.5, -0.2, 0.1], [-0.3, 0.4, 0.2]], dtype=np.float32)
>>> quantize(x, "ubinary").tolist()  # bits 1 0 1 and 0 1 1, packed from the left
[[160], [96]]
>>> float(pair_similarity(quantize(x[:1], "binary"), quantize(x[1:], "binary"), "binary", 3)[0])
0.3333333333333333
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from raycse.config.evaluation import EMBEDDING_PRECISIONS as PRECISIONS
from raycse.errors import ConfigError
from raycse.grouping.vectors import normalize
from raycse.platform.machine import import_faiss

BITS = ("binary", "ubinary")
CALIBRATION = ("int8/uint8 ranges: calibrated on each STS task's own sentences and on the BEIR corpus's "
               "documents (its queries take the same ranges)")


def parse_precisions(text: str, flag: str = "--embedding-precision") -> list[str]:
    """``float32,int8,binary`` -> the list, each known and once, float32 first where asked for."""
    asked = [p.strip() for p in str(text).split(",") if p.strip()]
    unknown = [p for p in asked if p not in PRECISIONS]
    if not asked or unknown or len(set(asked)) != len(asked):
        raise ConfigError(f"{flag} takes a comma-separated list of {', '.join(PRECISIONS)}, each once; got {text!r}")
    return sorted(asked, key=PRECISIONS.index)


def ranges_of(calibration: np.ndarray) -> np.ndarray:
    """Each coordinate's minimum and maximum over the normalised calibration vectors, shape (2, d)."""
    cal = normalize(calibration)
    return np.vstack((cal.min(axis=0), cal.max(axis=0)))


def quantize(x: np.ndarray, precision: str, ranges: Optional[np.ndarray] = None) -> np.ndarray:
    """``x`` normalised and quantized by sentence-transformers (``ranges``: int8/uint8's, default ``x``'s own)."""
    if precision == "float32":
        return np.asarray(x, dtype=np.float32)
    from sentence_transformers import quantize_embeddings

    if precision in ("int8", "uint8") and ranges is None:
        ranges = ranges_of(x)
    return quantize_embeddings(normalize(x), precision=precision, ranges=ranges)


def unpacked_bits(q: np.ndarray, precision: str) -> np.ndarray:
    """The 0/1 bits of packed binary (int8, offset 128) or ubinary (uint8) vectors, ``d`` of them a row."""
    raw = (q.astype(np.int16) + 128).astype(np.uint8) if precision == "binary" else q.astype(np.uint8)
    return np.unpackbits(raw, axis=1)


def pair_similarity(a: np.ndarray, b: np.ndarray, precision: str, dim: int) -> np.ndarray:
    """Row i of ``a`` against row i of ``b``, quantized at ``precision`` (``dim``: the unpacked width)."""
    if precision in BITS:
        equal = unpacked_bits(a, precision)[:, :dim] == unpacked_bits(b, precision)[:, :dim]
        return equal.mean(axis=1)
    return np.sum(normalize(a.astype(np.float32)) * normalize(b.astype(np.float32)), axis=1)


def sts_similarities(a: np.ndarray, b: np.ndarray, precision: str) -> np.ndarray:
    """Pair similarities of an STS task whose pairs embed as rows of ``a`` and ``b``, at ``precision``,
    int8/uint8 calibrated on both sides together."""
    if precision == "float32":
        return pair_similarity(a, b, precision, a.shape[1])
    ranges = ranges_of(np.concatenate([a, b])) if precision in ("int8", "uint8") else None
    return pair_similarity(quantize(a, precision, ranges), quantize(b, precision, ranges), precision, a.shape[1])


def search_at(doc_vecs: np.ndarray, query_vecs: np.ndarray, data, precision: str, k: int) -> dict:
    """BEIR's top-``k`` run (query id -> document id -> score) with both sides quantized at ``precision``:
    the cosine of int vectors (faiss inner product on them normalised), or for bits faiss's exact Hamming
    search, scored by the bits that agree."""
    from raycse.evaluation.beir import search

    if precision == "float32":
        return search(doc_vecs, query_vecs, data, k)
    if precision not in BITS:
        ranges = ranges_of(doc_vecs)
        return search(quantize(doc_vecs, precision, ranges).astype(np.float32),
                      quantize(query_vecs, precision, ranges).astype(np.float32), data, k)
    faiss = import_faiss()

    dim = doc_vecs.shape[1]
    docs = np.packbits(unpacked_bits(quantize(doc_vecs, precision), precision)[:, :dim], axis=1)
    queries = np.packbits(unpacked_bits(quantize(query_vecs, precision), precision)[:, :dim], axis=1)
    index = faiss.IndexBinaryFlat(docs.shape[1] * 8)
    index.add(np.ascontiguousarray(docs))
    distances, idx = index.search(np.ascontiguousarray(queries), min(k + 1, len(data.doc_ids)))
    run = {}
    for qid, row_d, row_i in zip(data.query_ids, distances, idx):
        hits = [(data.doc_ids[i], float(dim - d)) for d, i in zip(row_d, row_i) if i >= 0 and data.doc_ids[i] != qid]
        run[qid] = dict(hits[:k])
    return run
