"""``raycse export`` as a function: :func:`export` copies a model into a new folder and adds its transformer as
ONNX (and int8 ONNX, and OpenVINO) files, checks that each embeds what the PyTorch model embeds, and writes what
it found into the folder (``raycse_export.json`` and the card), which appears whole or not at all.

The check, on :data:`CHECK_TEXTS` at batch sizes :data:`CHECK_BATCHES`: every float32 file's embeddings within
:data:`TOLERANCE` of the PyTorch model's (else nothing is written); the int8 file's cosine to them, said.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from raycse.errors import ModelError, require
from raycse.platform import object_store
from raycse.platform.outputs import written_folder
from raycse.platform.staging import EXPORT_RECORD, MANIFEST, check_not_inside
from raycse.shipping.settings import ExportSettings

TOLERANCE = 1e-4  # largest |difference| of a float32 file's embedding coordinates from PyTorch's
CHECK_BATCHES = (1, 3, 16)
CHECK_TEXTS = ["A man is playing a guitar.", "Two dogs run through a field of tall grass near the river.", "Hi",
               "The committee approved the budget after a long debate about the costs of the new bridge, which "
               "several members said was needed years ago.", "Ein Satz auf Deutsch.", "3.14159 ≈ π",
               "Stock markets fell sharply on Monday.", "A woman is slicing an onion.",
               " ".join(["a very long sentence that is cut at the model's length"] * 40)]
EXPORTED = ("onnx", "onnx int8", "openvino")  # what a check row is called


@dataclass
class ExportReport:
    """What :func:`export` wrote: ``path`` (the new folder), ``files`` (relative path -> bytes of each file it
    added), ``checks`` (row -> its largest difference and smallest cosine to the PyTorch model's embeddings),
    ``scores`` (row -> embedding precision -> STS-B dev Spearman x100, where asked), ``seconds`` (export time
    per file)."""

    path: "Path | str"  # (a URI where published to object storage)
    files: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)
    scores: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)


def export(model: Optional[str] = None, settings: Optional[ExportSettings] = None) -> ExportReport:
    """Export a model as ``raycse export`` does (``raycse.export``): a new folder holding the model and its
    transformer as ONNX (and, where asked, int8 ONNX and OpenVINO), each checked against the PyTorch model's
    embeddings; written whole or not at all.

    Args:
        model: a local directory, ``"default"``, a hub name or an object-store URI; None: ``settings.model``.
        settings: :class:`raycse.shipping.settings.ExportSettings` (``onnx``: the folder to write, a path or URI;
            ``quantize`` int8 and ``openvino``: the other formats; ``stsb_dev``: a file to score each format on;
            ``overwrite``).

    Returns:
        An :class:`ExportReport`: ``path``, ``files`` (format -> the files it added and their bytes), ``checks``
        (format -> its largest difference and smallest cosine to the PyTorch embeddings), ``scores`` and
        ``seconds``.

    Raises:
        raycse.errors.ConfigError: no folder named, one that exists (without ``overwrite``) or lies inside the
            model, or a bad setting, in one line, before anything is written.
        raycse.errors.RaycseError: an extra not installed (``pip install 'raycse[onnx]'``), or an exported
            format whose embeddings differ from the model's.

    >>> import os, tempfile, raycse
    >>> raycse.export("default", raycse.ExportSettings())
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: raycse export needs --onnx OUT, the folder to write (e.g. --onnx models/minilm-onnx)
    >>> out = os.path.join(tempfile.mkdtemp(), "minilm-onnx")
    >>> report = raycse.export("default", raycse.ExportSettings(onnx=out))  # (the shipped all-MiniLM-L6-v2)
    >>> list(report.files["onnx"]), report.checks["onnx"]["min_cosine"] > 0.9999
    (['onnx/model.onnx'], True)
    """
    s = settings or ExportSettings()
    s = dataclasses.replace(s, model=model) if model is not None else s
    s.validate()
    _require_extras(s)
    from raycse.model.loading import resolve_model

    source = Path(resolve_model(s.model, s.trust_remote_code))
    dev = _dev(s.stsb_dev)  # (read before the work: a bad file costs no export)
    remote = object_store.is_uri(s.onnx)
    dest = s.onnx if remote else Path(os.path.expanduser(s.onnx)).resolve()
    if not remote:
        check_not_inside(dest, "--onnx", {"MODEL": str(source)})
    with written_folder(dest, "--onnx", s.overwrite) as staging:  # (whole or not at all, a path or a URI)
        report = _write(source, staging, s, dev, leave_out=() if remote else (dest,))
    report.path = dest
    return report


def _require_extras(s: ExportSettings) -> None:
    for module in ("onnx", "onnxruntime", "onnxscript"):
        require(module, "onnx", "raycse export --onnx")
    if s.openvino:
        require("openvino", "openvino", "raycse export --openvino")


def _dev(path: Optional[str]):
    if not path:
        return None
    from raycse.evaluation.run import read_stsb_dev

    return read_stsb_dev(path)


def _write(source: Path, out: Path, s: ExportSettings, dev, leave_out: tuple = ()) -> ExportReport:
    """The model copied into ``out``, its files exported, checked and scored, the record, card and digests
    written. ``leave_out``: folders inside the source not to copy (the destination, when it lies there)."""
    from raycse.model.encoder import Encoder
    from raycse.model.loading import transformer_folder
    from raycse.platform.folders import write_manifest

    _copy_model(source, out, leave_out)
    reference = Encoder.from_pretrained(str(out), trust_remote_code=s.trust_remote_code)
    body = transformer_folder(out)
    report = ExportReport(out)
    for row, writer in _writers(s, out, body):
        started = time.perf_counter()
        print(f"[raycse] writing {row} ...", file=sys.stderr, flush=True)
        report.files[row] = writer(reference)
        report.seconds[row] = round(time.perf_counter() - started, 2)
    runners = {"pytorch": reference, **{row: _exported(out, row, s.trust_remote_code) for row in report.files}}
    report.checks = {row: _compare(reference, enc) for row, enc in runners.items() if row != "pytorch"}
    _refuse_differences(report.checks)
    if dev is not None:
        report.scores = {row: _score(enc, dev) for row, enc in runners.items()}
    _record(out, source, report)
    write_manifest(out)  # last: every file's digest, checked by each load of the export
    return report


def _copy_model(source: Path, out: Path, leave_out: tuple = ()) -> None:
    """The model's own regular files (:func:`raycse.platform.folders.copy_folder`: no link out of it, no staging
    folder, not ``out`` itself where it lies inside); an earlier export's files, and a fetched model's manifest,
    left out: this export writes its own."""
    from raycse.platform.folders import copy_folder

    copy_folder(source, out, "model", leave_out=(out, *leave_out),
                skip_names=("onnx", "openvino", EXPORT_RECORD, MANIFEST))


def _writers(s: ExportSettings, out: Path, body: Path):
    """(row, write(reference) -> {relative path: bytes}) of each file asked for, in order."""
    from raycse.model.exported import ONNX_DIR, ONNX_FILE, OPENVINO_DIR, OPENVINO_FILE, QINT8_FILE
    from raycse.model.onnx_export import export_onnx, quantize_int8, to_openvino

    graph = body / ONNX_DIR / ONNX_FILE

    def onnx(ref):
        export_onnx(ref.backbone, ref.tokenizer, graph)
        return _sizes(out, [graph])

    def int8(ref):
        quantize_int8(graph, body / ONNX_DIR / QINT8_FILE)
        return _sizes(out, [body / ONNX_DIR / QINT8_FILE])

    def openvino(ref):
        xml = body / OPENVINO_DIR / OPENVINO_FILE
        to_openvino(graph, xml)
        return _sizes(out, [xml, xml.with_suffix(".bin")])

    yield "onnx", onnx
    if s.quantize == "int8":
        yield "onnx int8", int8
    if s.openvino:
        yield "openvino", openvino


def _sizes(out: Path, files: list[Path]) -> dict[str, int]:
    return {str(f.relative_to(out)): f.stat().st_size for f in files}


def _exported(out: Path, row: str, trust: bool):
    from raycse.model.encoder import Encoder
    from raycse.model.exported import QINT8_FILE

    backend = "openvino" if row == "openvino" else "onnx"
    return Encoder.from_pretrained(str(out), trust_remote_code=trust, backend=backend,
                                   onnx_file=QINT8_FILE if row == "onnx int8" else None)


def _compare(reference, exported) -> dict:
    """The largest coordinate difference and the smallest cosine between the two models' embeddings of
    :data:`CHECK_TEXTS`, over :data:`CHECK_BATCHES` (padding differs with the batch)."""
    import numpy as np

    worst, cosine = 0.0, 1.0
    for batch in CHECK_BATCHES:
        a = reference.encode(CHECK_TEXTS, batch_size=batch)
        b = exported.encode(CHECK_TEXTS, batch_size=batch)
        worst = max(worst, float(np.abs(a - b).max()))
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        cosine = min(cosine, float(cos.min()))
    return {"max_abs_diff": worst, "min_cosine": cosine}


def _refuse_differences(checks: dict) -> None:
    for row, check in checks.items():
        if row != "onnx int8" and check["max_abs_diff"] > TOLERANCE:
            raise ModelError(f"the {row} file embeds differently from the model (largest difference "
                             f"{check['max_abs_diff']:.2e} > {TOLERANCE:g}); nothing was written. Please report it "
                             f"with the model's config.json")


def _score(encoder, dev) -> dict:
    """STS-B dev Spearman x100 at each embedding precision (:mod:`raycse.evaluation.quantized`)."""
    from raycse.evaluation.quantized import PRECISIONS
    from raycse.evaluation.sts import evaluate_precisions

    scores = evaluate_precisions(lambda xs: encoder.encode(xs), [dev], PRECISIONS)
    return {precision: by_task[dev.name] for precision, by_task in scores.items()}


def _record(out: Path, source: Path, report: ExportReport) -> None:
    """``raycse_export.json`` (what this export wrote and found) and the card's export section."""
    import onnx
    import onnxruntime
    import torch

    from raycse.model.card import EXPORT_HEADING, export_section
    from raycse.platform.redact import redact

    record = {"source": redact(str(source)), "files": report.files, "seconds": report.seconds,
              "checks": report.checks, "tolerance": TOLERANCE, "stsb_dev": report.scores,
              "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}}
    if "openvino" in report.files:
        import openvino

        record["versions"]["openvino"] = openvino.__version__
    (out / EXPORT_RECORD).write_text(json.dumps(record, indent=2))
    card = out / "README.md"
    text = card.read_text() if card.is_file() else f"# {source.name}\n"
    text = text.split(EXPORT_HEADING)[0]  # (an exported model exported again: one export section, this one's)
    card.write_text(text.rstrip("\n") + "\n\n" + "\n".join(export_section(record)) + "\n")
