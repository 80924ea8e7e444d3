"""Retrieval evaluation on a BEIR-layout directory: nDCG@10, MRR@10, Recall@100.

Layout (as BEIR's GenericDataLoader reads it): ``corpus.jsonl`` (``_id``, ``title``, ``text``),
``queries.jsonl`` (``_id``, ``text``), ``qrels/{split}.tsv`` (header, then ``query-id corpus-id
score``). Only queries that appear in the qrels are evaluated, and of those only queries with at
least one relevant document (score > 0), as BEIR's pytrec_eval run does.

Retrieval: documents are embedded as ``title + " " + text`` (stripped; the text alone without a
title), queries as their text; exact faiss inner product over L2-normalised vectors (cosine);
the top 100 per query, after dropping a document whose id equals the query's (BEIR's
``ignore_identical_ids``). Large corpora are embedded on the Ray Data actor pool of grouping.

Metrics, per query then averaged over the evaluated queries (trec_eval's definitions, checked in
the tests against pytrec_eval on the same run):
    nDCG@10    = DCG@10 / IDCG@10, DCG@k = sum_{r<=k} rel_r / log2(r + 1) (linear gain = the graded
                 score), IDCG from the qrels' scores sorted high to low
    MRR@10     = 1 / rank of the first relevant document in the top 10 (0 if none)
    Recall@100 = relevant documents in the top 100 / relevant documents in the qrels
The ranking sorts by score, high to low, ties by document id in reverse (trec_eval's order).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from raycse.errors import DataError
from raycse.platform.machine import import_faiss

METRICS = ("nDCG@10", "MRR@10", "Recall@100")
TOP_K = 100
BEIR_HINT = ("BEIR datasets: pip install beir, then beir.util.download_and_unzip(URL, DIR) with URL from "
             "github.com/beir-cellar/beir (e.g. .../datasets/scifact.zip), or any directory in that layout")
RAY_THRESHOLD = 50_000  # documents: above this the corpus is embedded on the Ray Data actor pool


@dataclass
class BeirData:
    doc_ids: list[str]
    docs: list[str]  # title + " " + text
    query_ids: list[str]
    queries: list[str]
    qrels: dict[str, dict[str, int]]  # query id -> document id -> graded relevance (> 0 only)


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise DataError(f"missing BEIR file {path}; {BEIR_HINT}")
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or "_id" not in row:
            raise DataError(f"{path}:{lineno}: expected an object with '_id'")
        rows.append(row)
    return rows


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """``query-id corpus-id score`` rows after a header; rows with score <= 0 are kept out (not relevant)."""
    if not path.is_file():
        raise DataError(f"missing BEIR qrels {path}; {BEIR_HINT}")
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        next(reader, None)  # header
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) < 3:
                raise DataError(f"{path}:{lineno}: expected query-id, corpus-id, score (tab-separated)")
            try:
                score = int(float(row[2]))
            except (ValueError, OverflowError):  # (OverflowError: an infinity; NaN is a ValueError)
                raise DataError(f"{path}:{lineno}: score is not a finite number: {row[2]!r}") from None
            qrels.setdefault(row[0], {})
            if score > 0:
                qrels[row[0]][row[1]] = score
    return qrels


def read_beir(directory: str | Path, split: str = "test") -> BeirData:
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"BEIR directory not found: {root}; {BEIR_HINT}")
    corpus = _jsonl(root / "corpus.jsonl")
    queries = {str(q["_id"]): str(q.get("text", "")) for q in _jsonl(root / "queries.jsonl")}
    qrels = {q: docs for q, docs in read_qrels(root / "qrels" / f"{split}.tsv").items() if docs}
    missing = [q for q in qrels if q not in queries]
    if missing:
        raise DataError(f"{root}/qrels/{split}.tsv names query {missing[0]!r} that queries.jsonl lacks")
    if not qrels:
        raise DataError(f"{root}/qrels/{split}.tsv has no query with a relevant document (score > 0)")
    docs = [(str(d["_id"]), (str(d.get("title") or "") + " " + str(d.get("text") or "")).strip()) for d in corpus]
    if not docs:
        raise DataError(f"{root}/corpus.jsonl holds no documents")
    qids = sorted(qrels)
    return BeirData([d for d, _ in docs], [t for _, t in docs], qids, [queries[q] for q in qids], qrels)


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


def search(doc_vecs: np.ndarray, query_vecs: np.ndarray, data: BeirData, k: int = TOP_K) -> dict[str, dict[str, float]]:
    """Exact inner-product top-k per query (faiss), without the document that shares the query's id."""
    faiss = import_faiss()

    index = faiss.IndexFlatIP(doc_vecs.shape[1])
    index.add(_normalise(doc_vecs))
    depth = min(k + 1, len(data.doc_ids))  # one more: the query's own id may be among them
    scores, idx = index.search(_normalise(query_vecs), depth)
    run: dict[str, dict[str, float]] = {}
    for qid, row_s, row_i in zip(data.query_ids, scores, idx):
        hits = [(data.doc_ids[i], float(s)) for s, i in zip(row_s, row_i) if i >= 0 and data.doc_ids[i] != qid]
        run[qid] = dict(hits[:k])
    return run


def ranking(scores: dict[str, float]) -> list[str]:
    """trec_eval's order: score high to low, ties by document id high to low."""
    return [d for d, _ in sorted(scores.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def query_metrics(rels: dict[str, int], scores: dict[str, float]) -> dict[str, float]:
    ranked = ranking(scores)
    dcg = sum(rels.get(d, 0) / math.log2(r + 2) for r, d in enumerate(ranked[:10]))
    ideal = sorted(rels.values(), reverse=True)[:10]
    idcg = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
    first = next((r for r, d in enumerate(ranked[:10]) if rels.get(d, 0) > 0), None)
    found = sum(1 for d in ranked[:100] if rels.get(d, 0) > 0)
    return {"nDCG@10": dcg / idcg if idcg > 0 else 0.0, "MRR@10": 0.0 if first is None else 1.0 / (first + 1),
            "Recall@100": found / len(rels)}


def retrieval_metrics(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean over the queries with a relevant document (a query missing from the run scores 0)."""
    per = [query_metrics(rels, run.get(q, {})) for q, rels in qrels.items() if rels]
    return {m: float(np.mean([p[m] for p in per])) for m in METRICS}


# sentence-transformers' prompt names for retrieval (encode_query / encode_document): used where the
# model has them, else its default prompt
QUERY, DOCUMENT = "query", "document"

def embed_documents(data: BeirData, embed: Callable[[Sequence[str]], np.ndarray], model_path: Optional[str] = None,
                    max_length: int = 256, actors: int = 1, precision: str = "fp32",
                    ray_threshold: int = RAY_THRESHOLD, trust_remote_code: bool = False) -> np.ndarray:
    """Document vectors, after the model's "document" prompt where it has one (as
    ``SentenceTransformer.encode_document``): in this process (``embed(texts, prompt_name=...)``), or on the
    Ray Data actor pool for corpora over ``ray_threshold`` (Ray started by the caller)."""
    if len(data.docs) <= ray_threshold or model_path is None:
        return embed(data.docs, prompt_name=DOCUMENT)
    from raycse.grouping.embed import embed_corpus, texts_corpus

    return embed_corpus(texts_corpus(data.docs), model_path, max_length, actors=actors, precision=precision,
                        prompt_name=DOCUMENT, trust_remote_code=trust_remote_code)


def format_metrics(scores: dict[str, float]) -> str:
    return "\n".join(f"{m} {scores[m]:.4f}" for m in METRICS)
