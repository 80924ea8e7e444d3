"""Reading and cleaning a training corpus.

Text files (one sentence per line), JSONL and Parquet with a named text column. Cleaning as it
reads: strip, drop empty lines, cap characters per line, optionally deduplicate; undecodable
bytes are replaced with U+FFFD and counted (``on_decode_error: replace``, the default) or
refused with the line number (``error``). Every drop is counted in :class:`CorpusStats`.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional

from raycse.errors import DataError


@dataclass
class CorpusStats:
    lines_read: int = 0
    kept: int = 0
    empty_dropped: int = 0
    duplicates_dropped: int = 0
    decode_replaced: int = 0
    truncated: int = 0

    def summary(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


def detect_format(path: Path, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".csv", ".tsv"):
        return suffix[1:]
    return "text"


def _records(path: Path, fmt: str, columns: list[str], on_decode_error: str, stats: CorpusStats) -> Iterator[list]:
    """Rows of the named columns from JSONL, Parquet or CSV/TSV with a header (None where empty)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:
            raise DataError(f"cannot read Parquet file {path}: {str(exc).splitlines()[0]}") from None
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise DataError(f"column '{missing[0]}' not found in {path}; columns: {', '.join(table.column_names)}")
        for row in zip(*(table.column(c).to_pylist() for c in columns)):
            stats.lines_read += 1
            yield list(row)
        return
    header = None
    for lineno, line in _decoded_lines(path, on_decode_error, stats):
        if fmt == "jsonl":
            if not line.strip():
                yield [None] * len(columns)
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg}); one JSON object per line is expected") from None
            if not isinstance(record, dict) or any(c not in record for c in columns):
                keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                col = next(c for c in columns if not isinstance(record, dict) or c not in record)
                raise DataError(f"{path}:{lineno}: no field '{col}' (has: {keys}); set the data column names")
            yield [record[c] for c in columns]
            continue
        cells = next(csv.reader([line.rstrip("\r\n")], delimiter="\t" if fmt == "tsv" else ","))
        if header is None:
            header = cells
            missing = [c for c in columns if c not in header]
            if missing:
                raise DataError(f"column '{missing[0]}' not found in the header of {path}; columns: {', '.join(header)}")
            stats.lines_read -= 1  # the header is not data
            continue
        yield [cells[header.index(c)] if header.index(c) < len(cells) else None for c in columns]


def _decoded_lines(path: Path, on_decode_error: str, stats: CorpusStats) -> Iterator[tuple[int, str]]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            stats.lines_read += 1
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if on_decode_error == "error":
                    raise DataError(f"{path}:{lineno}: undecodable bytes at offset {exc.start} (not UTF-8); "
                                    f"fix the file or set data.on_decode_error: replace") from None
                stats.decode_replaced += 1
                yield lineno, raw.decode("utf-8", errors="replace")


def _raw_texts(path: Path, fmt: str, column: str, on_decode_error: str, stats: CorpusStats) -> Iterator[str]:
    if fmt == "text":
        for _, line in _decoded_lines(path, on_decode_error, stats):
            yield line
        return
    for (value,) in _records(path, fmt, [column], on_decode_error, stats):
        yield "" if value is None else str(value)


def iter_corpus(path: str, fmt: str = "auto", text_column: str = "text", max_chars: int = 20000,
                on_decode_error: str = "replace", dedup: bool = False,
                stats: Optional[CorpusStats] = None) -> Iterator[str]:
    """Yield cleaned texts; ``stats`` (if given) counts what was dropped or changed."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"corpus file not found: {path}")
    stats = stats if stats is not None else CorpusStats()
    seen: set[int] = set()
    for text in _raw_texts(p, detect_format(p, fmt), text_column, on_decode_error, stats):
        text = text.strip()
        if not text:
            stats.empty_dropped += 1
            continue
        if len(text) > max_chars:
            text = text[:max_chars]
            stats.truncated += 1
        if dedup:
            key = hash(text)
            if key in seen:
                stats.duplicates_dropped += 1
                continue
            seen.add(key)
        stats.kept += 1
        yield text


def read_corpus(path: str, fmt: str = "auto", text_column: str = "text", max_chars: int = 20000,
                on_decode_error: str = "replace", dedup: bool = False,
                max_sentences: Optional[int] = None) -> tuple[list[str], CorpusStats]:
    stats = CorpusStats()
    texts: list[str] = []
    for text in iter_corpus(path, fmt, text_column, max_chars, on_decode_error, dedup, stats):
        texts.append(text)
        if max_sentences is not None and len(texts) >= max_sentences:
            break
    if not texts:
        raise DataError(f"corpus {path} has no usable text after cleaning ({stats.summary()}); "
                        f"give a file with at least one non-empty line")
    return texts, stats


Pair = tuple[str, str, Optional[float]]


def read_pairs(path: str, fmt: str = "auto", text_column: str = "text", pair_column: Optional[str] = None,
               label_column: Optional[str] = None, score_scale: float = 1.0, max_chars: int = 20000,
               on_decode_error: str = "replace", max_examples: Optional[int] = None) -> tuple[list[Pair], CorpusStats]:
    """(q, a, score in [0, 1] or None) pairs; rows with an empty side are dropped and counted."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"pair file not found: {path}")
    fmt = detect_format(p, fmt)
    stats = CorpusStats()
    if fmt == "stsb":
        rows = _stsb_rows(p, on_decode_error, stats)
        score_scale = 5.0
    elif fmt == "text":
        raise DataError(f"{path}: pairs need a JSONL, Parquet, CSV/TSV (with a header) or stsb file, not plain text")
    else:
        cols = [text_column, pair_column] + ([label_column] if label_column else [])
        rows = _records(p, fmt, cols, on_decode_error, stats)
    pairs: list[Pair] = []
    for lineno, row in enumerate(rows, start=1):
        q = "" if row[0] is None else str(row[0]).strip()
        a = "" if row[1] is None else str(row[1]).strip()
        if not q or not a:
            stats.empty_dropped += 1
            continue
        if len(q) > max_chars or len(a) > max_chars:
            q, a = q[:max_chars], a[:max_chars]
            stats.truncated += 1
        score = None
        if len(row) > 2 and row[2] is not None and str(row[2]).strip() != "":
            try:
                score = float(row[2]) / score_scale
            except ValueError:
                raise DataError(f"{path}: row {lineno}: label {row[2]!r} is not a number") from None
        pairs.append((q, a, score))
        stats.kept += 1
        if max_examples is not None and len(pairs) >= max_examples:
            break
    if not pairs:
        raise DataError(f"{path} has no usable pairs after cleaning ({stats.summary()})")
    return pairs, stats


def _stsb_rows(path: Path, on_decode_error: str, stats: CorpusStats) -> Iterator[list]:
    for lineno, line in _decoded_lines(path, on_decode_error, stats):
        if not line.strip():
            yield [None, None]
            continue
        cols = line.rstrip("\r\n").split("\t")
        if len(cols) < 7:
            raise DataError(f"{path}:{lineno}: expected >= 7 tab-separated columns (STS Benchmark format)")
        yield [cols[5], cols[6], cols[4]]
