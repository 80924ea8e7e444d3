"""Embedding arrays as grouping keeps them: normalised rows, float16 read a chunk at a time, ids
in the narrowest type. The lowest floor of :mod:`raycse.grouping`: the searches (knn, cells)
both use it, and it imports neither."""

from __future__ import annotations

import numpy as np

CHUNK = 1 << 16  # rows converted to float32 at a time where the vectors are kept in float16 (100 MB at 384-d)


UNIT_TOLERANCE = 4e-3  # float16 rows whose squared norms are within this of 1 are unit already


def normalize(x: np.ndarray) -> np.ndarray:
    """L2-normalised rows. float16 stays float16 (normalised chunk by chunk in float32: half the
    memory of a large corpus's vectors, cosines within ~1e-3), and rows that are unit already (as
    grouping's embeddings come) are returned as they are, not copied: at 10M x 384 a copy is 7.7 GB.
    Anything else becomes a new float32 array."""
    if x.dtype == np.float16:
        if all(np.abs(np.einsum("ij,ij->i", rows, rows) - 1).max(initial=0) < UNIT_TOLERANCE
               for _, rows in float32_chunks(x)):
            return x
        out = np.empty(x.shape, dtype=np.float16)
        for s, rows in float32_chunks(x):
            out[s:s + len(rows)] = normalize(rows)
        return out
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def as_float32(rows: np.ndarray) -> np.ndarray:
    """``rows`` as a contiguous float32 array (itself if it is one). float16 is cast by torch, with
    the CPU's half-precision conversion instructions: numpy's own cast is several times slower, and
    the cell join casts every cell it gathers (benchmarks/float16_join.py)."""
    if rows.dtype != np.float16:
        return np.ascontiguousarray(rows, dtype=np.float32)
    import torch

    if not (rows.flags.writeable and rows.flags.c_contiguous):
        rows = np.array(rows)  # torch shares only writable, contiguous memory; a float16 copy is cheap
    return torch.from_numpy(rows).float().numpy()


def float32_chunks(x: np.ndarray):
    """(start, rows as contiguous float32) over ``x`` in chunks of ``CHUNK``: faiss reads float32 only."""
    for s in range(0, len(x), CHUNK):
        yield s, as_float32(x[s:s + CHUNK])


def id_dtype(n: int):
    """Row ids in 4 bytes where they fit: the (N, k) id arrays are the search's largest allocation."""
    return np.int32 if n < 2**31 - 1 else np.int64
