"""``raycse eval`` as a function: :func:`evaluate` scores one model on what an :class:`EvalSettings` names
and returns the text the CLI prints with the scores behind it. Every input is read and checked before the
model loads, so a bad file or flag costs no model load.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Optional

from raycse.errors import RaycseError
from raycse.evaluation.settings import EvalSettings
from raycse.platform.staging import check_writable_file, write_text_atomic


@dataclass
class EvalReport:
    """What :func:`evaluate` found: ``text``, the tables ``raycse eval`` prints; ``scores``, the JSON
    ``--json`` writes (``scores``: task -> Spearman x100 and ``avg``; ``mteb``, ``dims``, ``length_attack``,
    ``beir`` where asked for)."""

    text: str
    scores: dict = field(default_factory=dict)


def evaluate(model: Optional[str] = None, settings: Optional[EvalSettings] = None) -> EvalReport:
    """Score ``model`` (a local directory, ``"default"``, a hub name or an object-store URI; default:
    ``settings.model``) on the data ``settings`` names, as ``raycse eval`` does (``raycse.evaluate``); writes
    ``settings.json_out`` where set. ``.text`` of the report is what the CLI prints.

    Args:
        model: the model to score; None: ``settings.model``.
        settings: what to score it on (raycse.evaluation.settings.EvalSettings: STS-B dev, SentEval, BEIR, MTEB,
            dims, precisions); None: the defaults, which name no data.

    Returns:
        An :class:`EvalReport`: ``text`` (the tables) and ``scores`` (the JSON).

    Raises:
        raycse.errors.RaycseError: no data named, or a file, model or setting it cannot use: one line, before the
            model loads where it can be told then.

    >>> import os, tempfile, raycse
    >>> dev = os.path.join(tempfile.mkdtemp(), "sts-dev.csv")  # (four scored pairs, STS-B's layout)
    >>> rows = [("A man is playing a guitar.", "A man plays the guitar.", 4.8),
    ...         ("A cat sleeps on the sofa.", "The stock market fell today.", 0.2),
    ...         ("A woman is cooking dinner.", "A woman cooks food.", 4.0),
    ...         ("Two dogs run in a field.", "Dogs are running outside.", 3.6)]
    >>> _ = open(dev, "w").write("".join(f"g\\tf\\t2012\\t{i}\\t{g}\\t{a}\\t{b}\\n" for i, (a, b, g) in enumerate(rows)))
    >>> report = raycse.evaluate("default", raycse.EvalSettings(stsb_dev=dev))  # (all-MiniLM-L6-v2, shipped)
    >>> report.scores["scores"]["STSB-dev"]
    100.0
    >>> raycse.evaluate("default", raycse.EvalSettings())
    Traceback (most recent call last):
    ...
    raycse.errors.RaycseError: nothing to evaluate: pass --senteval-dir DIR (SentEval layout), --stsb-dev FILE, --beir-dir DIR (BEIR layout) and/or --mteb TASKS / --mteb-local KIND:PATH
    """
    s = settings or EvalSettings()
    s = dataclasses.replace(s, model=model) if model is not None else s
    json_out = check_writable_file(s.json_out) if s.json_out else None  # before the work, not after
    datasets, beir = _inputs(s)
    suite = _mteb_inputs(s)
    asked = _dims(s.dims, s.model, s.trust_remote_code)  # before the model loads: a bad size is one line
    from raycse.model.encoder import Encoder

    encoder = Encoder.from_pretrained(s.model, pooling=s.pooling, max_seq_length=s.max_length,
                                      trust_remote_code=s.trust_remote_code, backend=s.backend, onnx_file=s.onnx_file)
    dims = asked or sorted((d for d in encoder.matryoshka_dims or [] if d < encoder.output_size), reverse=True)
    embed = _embedder(encoder, s)
    if {"int8", "uint8"} & set(_precisions(s)):
        from raycse.evaluation.quantized import CALIBRATION

        print(f"[raycse] {CALIBRATION}", file=sys.stderr)
    scores: dict = {}
    text = [*_sts_and_mteb(s, encoder, embed, datasets, suite, dims, scores)]
    if s.length_attack:
        from raycse.evaluation.length_attack import format_rows, length_attack

        rows = length_attack(embed, datasets, s.length_attack, encoder.tokenizer, s.max_length or encoder.max_seq_length)
        text.append(format_rows(rows))
        scores["length_attack"] = rows
    if beir is not None:
        table, scores["beir"] = _beir(s, beir, embed, encoder)
        text.append(table)
    if json_out:
        write_text_atomic(json_out, json.dumps(scores, indent=2))
    return EvalReport("\n".join(text), scores)


def _embedder(encoder, s: EvalSettings):
    from raycse.model.precision import resolve_precision

    dtype = resolve_precision(s.precision, encoder.device)

    def embed(xs, prompt_name=None, progress=False):
        return encoder.encode(xs, batch_size=s.batch_size, max_length=s.max_length, progress=progress,
                              autocast_dtype=dtype, prompt_name=prompt_name)

    return embed


def _sts_and_mteb(s: EvalSettings, encoder, embed, datasets: list, suite, dims: list, scores: dict) -> list:
    """The STS tasks' and MTEB's scores into ``scores``; their tables: one for both (raycse's scores, then
    mteb's main scores), and the prefix sizes' where asked."""
    from raycse.evaluation.sts import embedded_once, evaluate_datasets, evaluate_precisions, format_table, format_widths

    precisions = _precisions(s)
    if datasets:
        print(f"[raycse] {s.model}: pooling {encoder.pooler.kind}, "
              f"{sum(len(d) for d in datasets)} pairs in {len(datasets)} task(s)", file=sys.stderr)
        whole = embedded_once(lambda xs: embed(xs, progress=True))  # (each prefix size reuses it)
        by_precision = evaluate_precisions(whole, datasets, precisions)
        scores["scores"] = by_precision["float32"]
        if len(precisions) > 1:
            scores.setdefault("embedding_precision", {})["sts"] = by_precision
    if suite is not None:
        print(f"[raycse] {s.model}: MTEB, {len(suite.tasks)} task(s): "
              f"{', '.join(task.metadata.name for task in suite.tasks)}", file=sys.stderr)
        scores["mteb"] = suite.run(lambda xs, prompt_name=None: embed(xs, prompt_name, progress=True), s.model,
                                   s.batch_size)
    text = []
    if datasets or suite is not None:
        text.append(format_table({**scores.get("scores", {}), **{f"{row['task']} (mteb {row['main_score']})":
                                                                 row["score"] for row in scores.get("mteb", {}).values()}}))
    if datasets and dims:  # the same vectors' prefixes (cosine re-normalises them)
        scores["dims"] = {str(d): evaluate_datasets(lambda xs, d=d: whole(xs)[:, :d], datasets) for d in dims}
        text.append(format_widths({encoder.output_size: scores["scores"], **dict(zip(dims, scores["dims"].values()))}))
    if datasets and len(precisions) > 1:
        text.append(_precision_table(scores["embedding_precision"]["sts"], 2))
    return text


def _precisions(s: EvalSettings) -> list[str]:
    """float32 (the main scores) and the precisions --embedding-precision adds."""
    from raycse.evaluation.quantized import parse_precisions

    return ["float32", *(p for p in parse_precisions(s.embedding_precision) if p != "float32")]


def _precision_table(by_precision: dict, digits: int) -> str:
    from raycse.evaluation.sts import format_columns

    return format_columns(by_precision, "precision", digits)


def _inputs(s: EvalSettings) -> tuple[list, object]:
    """Every evaluation file read and checked before the model loads: (STS datasets, BEIR data or None)."""
    from raycse.evaluation.sts import TASKS, canonical_task, load_task

    if not (s.senteval_dir or s.stsb_dev or s.beir_dir or s.mteb or s.mteb_local):
        raise RaycseError("nothing to evaluate: pass --senteval-dir DIR (SentEval layout), --stsb-dev FILE, "
                          "--beir-dir DIR (BEIR layout) and/or --mteb TASKS / --mteb-local KIND:PATH")
    s.validate()
    if s.length_attack and not (s.senteval_dir or s.stsb_dev):
        raise RaycseError("--length-attack scores STS pairs: add --senteval-dir DIR or --stsb-dev FILE")
    datasets = [load_task(s.senteval_dir, canonical_task(t)) for t in (s.tasks or TASKS)] if s.senteval_dir else []
    if s.stsb_dev:
        datasets.append(read_stsb_dev(s.stsb_dev))
    beir = None
    if s.beir_dir:
        from raycse.errors import require
        from raycse.evaluation.beir import read_beir

        require("faiss", "grouping", "raycse eval --beir-dir")
        beir = read_beir(s.beir_dir, s.split)
    return datasets, beir


def read_stsb_dev(path: str):
    """The STS-B dev set at ``path`` (``auto``: as training's ``eval.stsb_dev auto`` finds it), or one line."""
    from raycse.evaluation.sts import read_stsb

    if path.lower() != "auto":
        return read_stsb(path, name="STSB-dev")
    from raycse.config import EvalConfig
    from raycse.evaluation.selection import stsb_dev

    dev = stsb_dev(EvalConfig(stsb_dev="auto"), name="STSB-dev")
    if dev is None:
        raise RaycseError("--stsb-dev auto found no STS-B dev set: set RAYCSE_DATA to a folder holding "
                          "stsbenchmark/sts-dev.csv, or pass --stsb-dev FILE (the Hugging Face dataset "
                          "sentence-transformers/stsb is neither reachable nor cached here)")
    return dev


def _mteb_inputs(s: EvalSettings):
    """The MTEB tasks asked for, their data read (or refused) before the model loads; None if none."""
    if not (s.mteb or s.mteb_local):
        return None
    from raycse.evaluation.mteb_eval import load_suite, parse_local, parse_registered

    specs = parse_registered(s.mteb) if s.mteb else []
    for local in s.mteb_local or []:
        specs += parse_local(local, s.tasks)
    return load_suite(specs, s.split)


def _dims(text: Optional[str], model: str, trust_remote_code: bool) -> list[int]:
    """--dims: the prefix sizes to score besides the whole embedding, widest first."""
    from raycse.model.loading import embedding_width_of, resolve_model
    from raycse.platform.conversion import coerce

    if not text:
        return []
    dims = coerce("--dims", text, list)
    width = embedding_width_of(resolve_model(model, trust_remote_code)) or float("inf")
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= width for d in dims):
        raise RaycseError(f"--dims must be sizes from 1 to the model's {width} coordinates, e.g. 256,128,64; "
                          f"got {text}")
    return sorted({d for d in dims if d < width}, reverse=True)


def _beir(s: EvalSettings, beir, embed, encoder) -> tuple[str, dict]:
    from raycse.evaluation.beir import QUERY, RAY_THRESHOLD, embed_documents, format_metrics, retrieval_metrics, search
    from raycse.model.loading import resolve_model

    print(f"[raycse] {s.model}: BEIR {s.beir_dir} ({s.split}): {len(beir.docs)} documents, "
          f"{len(beir.queries)} queries with relevant documents", file=sys.stderr)
    # what the Ray actors load for big corpora
    model_path = None if s.pooling or s.backend != "torch" else resolve_model(s.model, s.trust_remote_code)
    if model_path and len(beir.docs) > RAY_THRESHOLD:
        from raycse.platform.ray_session import ensure_ray

        ensure_ray()
    docs = embed_documents(beir, lambda xs, prompt_name: embed(xs, prompt_name, progress=True), model_path,
                           s.max_length or encoder.max_seq_length, precision=s.precision,
                           trust_remote_code=s.trust_remote_code)
    queries = embed(beir.queries, QUERY)
    scores = retrieval_metrics(beir.qrels, search(docs, queries, beir))
    precisions = _precisions(s)
    if len(precisions) == 1:
        return format_metrics(scores), scores
    from raycse.evaluation.beir import TOP_K
    from raycse.evaluation.quantized import search_at

    by_precision = {"float32": scores, **{p: retrieval_metrics(beir.qrels, search_at(docs, queries, beir, p, TOP_K))
                                          for p in precisions[1:]}}
    return (format_metrics(scores) + "\n" + _precision_table(by_precision, 4),
            {**scores, "embedding_precision": by_precision})
