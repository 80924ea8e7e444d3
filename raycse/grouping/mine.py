"""Hard-negative mining: (query, positive) pairs -> (query, positive, negative_1..k) triplets.

    raycse mine --corpus pairs.jsonl --text-column q --pair-column a --output triplets.jsonl

1. Read the pairs with the corpus pipeline (Ray Data: cleaning, counts); the candidate pool is the
   pairs' positives (deduplicated) or the texts of ``--candidates FILE``.
2. Embed queries, positives and candidates on the grouping's Ray Data actor pool.
3. Search the candidates for every query with faiss (exact or IVF, optionally sharded over Ray
   tasks, as grouping does), ``range_max`` deep plus room for the ones skipped below.
4. Per query, walk its ranking from rank ``range_min`` (0 = the best) to ``range_max`` (exclusive)
   and keep the first ``num_negatives`` candidates that are not its positive or itself (same
   text), score at most ``max_score`` and below ``score(positive) - margin`` (likely false
   negatives otherwise). Queries left with fewer are dropped and counted.
5. Write the triplets in the input's format family (JSONL, Parquet, CSV/TSV) to ``--output``,
   whole or not at all (a hidden file beside it, renamed at the end); negatives go to columns
   ``negative_1..k``, ready for ``raycse train --negative-column negative_1,...``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from raycse.config import TRUST_REMOTE_CODE, setting
from raycse.config.fields import at_least
from raycse.errors import ConfigError, DataError


@dataclass
class MineSettings:
    """How ``raycse mine`` searches; each field is also its flag (one definition)."""

    num_negatives: int = setting(1, "--num-negatives", "negatives per query", type=int)
    range_min: int = setting(0, "--range-min", "first rank considered (0 = the most similar)", type=int)
    range_max: int = setting(50, "--range-max", "ranks from --range-min up to this one (exclusive)", type=int)
    margin: Optional[float] = setting(None, "--margin", "skip candidates scoring >= score(positive) - MARGIN (likely "
                                      "false negatives; default off)", type=float)
    max_score: Optional[float] = setting(None, "--max-score", "skip candidates scoring above this (default off)",
                                         type=float)
    search: str = setting("auto", "--search", "faiss search: exact, IVF, or auto (exact up to 50,000 candidates)",
                          choices=["auto", "exact", "ivf"])
    shards: int = setting(1, "--shards", "search the candidates in N Ray tasks", type=int)
    embed_actors: Optional[int] = setting(None, "--embed-actors", "embedding actors, 1 CPU each (default: one per "
                                          "CPU of the cluster)", type=int)
    batch_size: int = setting(256, "--batch-size", "sentences per embedding call", type=int)
    max_length: int = setting(128, "--max-length", "token limit when embedding", type=int)
    trust_remote_code: bool = setting(False, "--trust-remote-code", TRUST_REMOTE_CODE, action="store_true")

    def validate(self) -> None:
        if self.num_negatives < 1:
            raise ConfigError(f"--num-negatives must be >= 1, got {self.num_negatives}")
        if not 0 <= self.range_min < self.range_max:
            raise ConfigError(f"need 0 <= --range-min < --range-max, got {self.range_min} and {self.range_max}")
        if self.range_max - self.range_min < self.num_negatives:
            raise ConfigError(f"the rank window [{self.range_min}, {self.range_max}) is narrower than "
                              f"--num-negatives {self.num_negatives}")
        for flag, value in (("--margin", self.margin), ("--max-score", self.max_score)):
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"{flag} must be a finite number, got {value}")
        if self.margin is not None and self.margin < 0:
            raise ConfigError(f"--margin must be >= 0, got {self.margin}")
        if self.search not in ("exact", "ivf", "auto"):
            raise ConfigError(f"--search must be exact, ivf or auto, got {self.search!r}")
        if self.shards < 1:
            raise ConfigError(f"--shards must be >= 1, got {self.shards}")
        if self.embed_actors is not None and self.embed_actors < 1:
            raise ConfigError(f"--embed-actors must be >= 1, got {self.embed_actors}")
        at_least("--max-length", self.max_length, 2)  # [CLS] and [SEP] alone take two tokens


@dataclass
class MineResult:
    path: Path
    triplets: int
    dropped: int  # queries with fewer than num_negatives usable candidates
    candidates: int
    seconds: dict = field(default_factory=dict)


FAMILIES = {"jsonl": (".jsonl", ".json", ".ndjson"), "parquet": (".parquet", ".pq"), "csv": (".csv",), "tsv": (".tsv",)}


def output_format(input_format: str, output: Path) -> str:
    """The input's format family, which ``output``'s suffix must name too."""
    fmt = "jsonl" if input_format == "auto" else input_format
    if fmt not in FAMILIES:
        raise ConfigError(f"mining reads pairs from JSONL, Parquet or CSV/TSV, not {input_format}")
    if output.suffix.lower() not in FAMILIES[fmt]:
        raise ConfigError(f"--output {output} must be a {fmt} file like the input ({', '.join(FAMILIES[fmt])}); "
                          f"triplets are written in the input's format")
    return fmt


def triplet_format(data, output: Path) -> str:
    """:func:`output_format` for the pairs ``data`` (a DataConfig) names: their format, or their first file's."""
    from raycse.data.corpus import detect_format
    from raycse.data.dataset import resolve_sources

    fmt = data.format if data.format != "auto" else detect_format(Path(resolve_sources(data.corpus)[0]))
    return output_format(fmt, output)


def select(scores: np.ndarray, ids: np.ndarray, pos_score: np.ndarray, query: list[str], positive: list[str],
           candidates: list[str], s: MineSettings) -> list[Optional[list[int]]]:
    """Per query, the candidate ids kept (see the module doc, step 4), or None when too few."""
    out: list[Optional[list[int]]] = []
    for qi in range(len(query)):
        kept, rank = [], 0
        for score, cid in zip(scores[qi], ids[qi]):
            if cid < 0:
                break
            text = candidates[cid]
            if text == positive[qi] or text == query[qi]:
                continue  # not ranked: the pair itself
            if rank >= s.range_max:
                break
            rank += 1
            if rank - 1 < s.range_min:
                continue
            if s.max_score is not None and score > s.max_score:
                continue
            if s.margin is not None and score >= pos_score[qi] - s.margin:
                continue
            kept.append(int(cid))
            if len(kept) == s.num_negatives:
                break
        out.append(kept if len(kept) == s.num_negatives else None)
    return out


def mine_triplets(data, output, settings: Optional[MineSettings] = None, model: str = "default",
                  candidates: Optional[str] = None, seed: int = 0, overwrite: bool = False) -> MineResult:
    """``raycse mine`` as a function (``raycse.mine``): every input checked before Ray starts, then :func:`mine`:
    each pair's hardest negatives (the candidates the model ranks closest to its anchor, less those too close to
    be safe), written as triplets.

    Args:
        data: a :class:`raycse.config.DataConfig` of the pairs (``corpus`` and ``pair_column`` set).
        output: the triplets file, in the pairs' format family (JSONL, Parquet, CSV, TSV).
        settings: :class:`MineSettings` (negatives a pair, the ranks to draw from, the margin below the positive,
            the faiss search, embedding actors).
        model: the model that ranks the candidates (a directory, ``"default"``, a hub name or a URI).
        candidates: a corpus of other sentences to draw the negatives from (default: the pairs' second texts).
        seed: the seed of the draw among the ranks.
        overwrite: replace ``output`` where it exists.

    Returns:
        A :class:`MineResult`: ``path``, ``triplets`` (rows written), ``dropped`` (anchors with too few usable
        candidates), ``candidates`` and ``seconds`` (by phase).

    Raises:
        raycse.errors.ConfigError: a missing or bad input, an output that exists or lies inside an input, in one
            line, before Ray starts.

    >>> import json, os, tempfile, raycse
    >>> from raycse.config import DataConfig
    >>> mine_triplets(DataConfig(corpus="pairs.jsonl"), "triplets.jsonl")
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: raycse mine needs --pair-column (see raycse mine --help)

    A negative for each of 32 question-answer pairs, ranked by the shipped all-MiniLM-L6-v2:

    >>> work = tempfile.mkdtemp()
    >>> pairs = os.path.join(work, "pairs.jsonl")
    >>> _ = open(pairs, "w").write("".join(json.dumps({"q": f"What is topic {i}?", "p": f"Topic {i} is a subject."})
    ...                                    + "\\n" for i in range(32)))
    >>> data = DataConfig(corpus=pairs, text_column="q", pair_column="p")
    >>> mined = raycse.mine(data, os.path.join(work, "triplets.jsonl"))  # (starts Ray)
    >>> mined.triplets, mined.path.name, sorted(json.loads(mined.path.read_text().splitlines()[0]))
    (32, 'triplets.jsonl', ['negative_1', 'p', 'q'])
    """
    from raycse.data.dataset import ray_data_errors, resolve_sources
    from raycse.errors import require
    from raycse.model.loading import check_max_length, resolve_model
    from raycse.platform.interrupts import interrupted
    from raycse.platform.ray_session import cluster_cpus, ensure_ray, setup_ray_data
    from raycse.platform.staging import check_not_inside, check_writable_file

    s = dataclasses.replace(settings or MineSettings())  # (a copy: the caller's settings are left as they are)
    missing = [f for f, v in (("--corpus", data.corpus), ("--pair-column", data.pair_column), ("--output", output))
               if not v]
    if missing:
        raise ConfigError(f"raycse mine needs {', '.join(missing)} (see raycse mine --help)")
    s.validate()
    require("faiss", "grouping", "raycse mine")
    out = check_writable_file(os.path.expanduser(os.fspath(output)))
    check_not_inside(out, "--output", {"--corpus": data.corpus, "--candidates": candidates, "--model": model})
    if out.exists() and not overwrite:
        raise ConfigError(f"--output {out} exists; pass --overwrite to replace it")
    data.validate()
    resolve_sources(data.corpus)
    triplet_format(data, out)
    if candidates:
        resolve_sources(candidates)
    model_path = resolve_model(model, s.trust_remote_code)  # everything checked before Ray starts
    check_max_length(model_path, s.max_length, f"model {model}")
    ensure_ray()
    setup_ray_data()
    if s.embed_actors is None:  # default: one per CPU of the cluster (0 was refused above)
        s.embed_actors = cluster_cpus()
    try:
        with ray_data_errors():
            return mine(data, model_path, Path(out), s, candidates, seed)
    except KeyboardInterrupt as caught:
        stop = interrupted(caught)
        stop.detail = f"nothing was written to {out}; rerun the same command to mine again"
        raise stop from None


def mine(data, model_path: str, output: Path, s: MineSettings, candidates_file: Optional[str] = None,
         seed: int = 0) -> MineResult:
    """``data``: a DataConfig of the pairs (pair_column set). Writes ``output``; see the module doc."""
    import time

    from raycse.data.dataset import load_corpus
    from raycse.grouping.embed import embed_corpus, texts_corpus
    from raycse.grouping.knn import normalize, top_k

    s.validate()
    fmt = triplet_format(data, output)
    t = {"start": time.perf_counter()}
    pairs = load_corpus(data, seed)
    rows = pairs.dataset.select_columns(["_id", "text", "pair"]).to_pandas().sort_values("_id")
    query, positive = rows["text"].tolist(), rows["pair"].tolist()
    if candidates_file:
        from dataclasses import replace

        cands_corpus = load_corpus(replace(data, corpus=candidates_file, pair_column=None, label_column=None,
                                           negative_column=None, format="auto", text_column="text"), seed,
                                   dedup=True)
        candidates = [r["text"] for r in sorted(cands_corpus.dataset.iter_rows(), key=lambda r: r["_id"])]
    else:
        candidates = sorted(set(positive))
    t["read"] = time.perf_counter()
    embed = dict(actors=s.embed_actors or 1, batch_size=s.batch_size, trust_remote_code=s.trust_remote_code)  # (the CLI's None: one per CPU, set there)
    q_vec = normalize(embed_corpus(pairs, model_path, s.max_length, by="first", **embed))
    c_vec = normalize(embed_corpus(texts_corpus(candidates), model_path, s.max_length, **embed))
    if candidates_file:
        p_vec = normalize(embed_corpus(pairs, model_path, s.max_length, by="second", **embed))
    else:  # the candidates are the positives: their vectors are already there
        row_of = {text: i for i, text in enumerate(candidates)}
        p_vec = c_vec[[row_of[text] for text in positive]]
    t["embed"] = time.perf_counter()
    method = s.search if s.search != "auto" else ("exact" if len(candidates) <= 50000 else "ivf")
    depth = min(len(candidates), s.range_max + 2)  # + the positive and the query itself, if they are candidates
    scores, ids, _ = top_k(c_vec, q_vec, depth, method, shards=s.shards, seed=seed)
    pos_score = (q_vec * p_vec).sum(1)
    chosen = select(scores, ids, pos_score, query, positive, candidates, s)
    t["search"] = time.perf_counter()
    keep = [i for i, c in enumerate(chosen) if c is not None]
    if not keep:
        raise DataError(f"no query kept {s.num_negatives} negative(s) in ranks [{s.range_min}, {s.range_max}) "
                        f"after the margin / max-score filters; widen the window or relax the filters")
    table = {data.text_column: [query[i] for i in keep], data.pair_column: [positive[i] for i in keep]}
    for m in range(s.num_negatives):
        table[f"negative_{m + 1}"] = [candidates[chosen[i][m]] for i in keep]
    write_table(table, output, fmt)
    t["write"] = time.perf_counter()
    secs = {k: round(t[k] - t[prev], 2) for prev, k in zip(list(t)[:-1], list(t)[1:])}
    return MineResult(output, len(keep), len(query) - len(keep), len(candidates), secs)


def write_table(columns: dict, output: Path, fmt: str) -> None:
    """Whole or not at all (raycse.platform.outputs.written_file): a hidden file beside ``output``, renamed over it
    when complete, and nothing left when the write fails."""
    import pandas as pd

    from raycse.platform.outputs import written_file

    df = pd.DataFrame(columns)
    with written_file(output) as tmp:
        if fmt == "parquet":
            df.to_parquet(tmp, index=False)
        elif fmt == "jsonl":
            df.to_json(tmp, orient="records", lines=True, force_ascii=False)
        else:
            df.to_csv(tmp, index=False, sep="\t" if fmt == "tsv" else ",")
