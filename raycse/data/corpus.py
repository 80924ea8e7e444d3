"""Reading and cleaning a training corpus.

Text files (one sentence per line), JSONL and Parquet with a named text column. Cleaning as it
reads: strip, drop empty lines, cap characters per line, optionally deduplicate; undecodable
bytes are replaced with U+FFFD and counted (``on_decode_error: replace``, the default) or
refused with the line number (``error``). Every drop is counted in :class:`CorpusStats`.
"""

from __future__ import annotations

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
    suffix = "".join(path.suffixes[-2:]).lower() if path.suffix == ".gz" else path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    return "text"


def _raw_texts(path: Path, fmt: str, column: str, on_decode_error: str, stats: CorpusStats) -> Iterator[str]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:
            raise DataError(f"cannot read Parquet file {path}: {str(exc).splitlines()[0]}") from None
        if column not in table.column_names:
            raise DataError(f"column '{column}' not found in {path}; columns: {', '.join(table.column_names)} "
                            f"(set data.text_column / --text-column)")
        for value in table.column(column).to_pylist():
            stats.lines_read += 1
            yield "" if value is None else str(value)
        return
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            stats.lines_read += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if on_decode_error == "error":
                    raise DataError(f"{path}:{lineno}: undecodable bytes at offset {exc.start} (not UTF-8); "
                                    f"fix the file or set data.on_decode_error: replace") from None
                stats.decode_replaced += 1
                line = raw.decode("utf-8", errors="replace")
            if fmt == "jsonl":
                if not line.strip():
                    yield ""
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg}); one JSON object per line is expected") from None
                if not isinstance(record, dict) or column not in record:
                    keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                    raise DataError(f"{path}:{lineno}: no field '{column}' (has: {keys}); set data.text_column / --text-column")
                value = record[column]
                yield "" if value is None else str(value)
            else:
                yield line


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
