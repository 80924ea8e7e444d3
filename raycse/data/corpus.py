"""Reading and cleaning a training corpus.

Text files (one sentence per line), JSONL and Parquet with a named text column. Cleaning as it
reads: strip, drop empty lines, cap characters per line, optionally deduplicate; undecodable
bytes are replaced with U+FFFD and counted (``on_decode_error: replace``, the default) or
refused with the line number (``error``). Every drop is counted in :class:`CorpusStats`.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
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
    extra_rows: int = 0  # added by the objective (CompCSE's subsampling); included in kept
    repeats: int = 0  # examples equal to an earlier one (what deduplication drops, or dropped)

    def summary(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())

    def record(self) -> dict:
        """The counts for metrics.json (a mixture's stats record each source's: raycse.train.mixture)."""
        return asdict(self)

    def repetition_warning(self, dedup: bool) -> Optional[str]:
        """A warning when more than half the examples repeat another, else None."""
        total = self.kept + self.duplicates_dropped
        if not total or self.repeats * 2 <= total:
            return None
        if dedup:
            return (f"deduplication dropped {self.repeats} of {total} examples as repeats; {self.kept} are left "
                    f"to train on: check that the corpus is the one meant")
        return (f"{self.repeats} of {total} examples repeat another: each repeat in a batch is a false in-batch "
                f"negative; deduplicate the corpus (--dedup true) or check that it is the one meant")


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


def _records(path: Path, fmt: str, columns: list[str], on_decode_error: str, stats: CorpusStats,
             data: Optional[bytes] = None) -> Iterator[list]:
    """Rows of the named columns from JSONL, Parquet or CSV/TSV with a header (None where empty).

    ``data``: the file's bytes when they were already read (Ray Data hands files over as bytes);
    ``path`` then only names the file in messages.
    """
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(io.BytesIO(data) if data is not None else path)
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
    for lineno, line in _decoded_lines(path, on_decode_error, stats, data):
        if fmt == "jsonl":
            if not line.strip():
                yield [None] * len(columns)
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg}); one JSON object per line is expected") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{lineno}: a JSON {type(record).__name__}, not an object; one JSON object "
                                f"per line is expected")
            if any(c not in record for c in columns):
                col = next(c for c in columns if c not in record)
                raise missing_field_error(path, col, list(record), data)
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


BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # (UTF-32 LE's starts as UTF-16 LE's)


JSONL_COUNT_LINES = 1_000_000  # how far a missing field's records are counted, for the message


def missing_field_error(path: Path, column: str, first: list, data: Optional[bytes] = None) -> DataError:
    """The error for a JSONL field some records lack: how many have it and how many do not (counted
    over the file's first ``JSONL_COUNT_LINES`` lines), and where it is first missing."""
    have = lack = lines = 0
    first_missing = None
    with (io.BytesIO(data) if data is not None else open(path, "rb")) as fh:
        for lines, raw in enumerate(fh, start=1):
            if lines > JSONL_COUNT_LINES:
                break
            try:
                record = json.loads(raw) if raw.strip() else None
            except ValueError:
                continue
            if isinstance(record, dict):
                if column in record:
                    have += 1
                else:
                    lack += 1
                    first_missing = first_missing or lines
    seen = f" of the first {JSONL_COUNT_LINES:,} lines" if lines > JSONL_COUNT_LINES else ""
    if not have:
        return DataError(f"column '{column}' not found in {path}: none of its {lack} records{seen} has it (the first's "
                         f"fields: {', '.join(map(str, first)) or 'none'}); set data.text_column / pair_column / "
                         f"label_column / negative_column")
    return DataError(f"{path}: field '{column}' is missing from {lack} of {have + lack} records{seen} (first at line "
                     f"{first_missing}, whose fields are: {', '.join(map(str, first)) or 'none'}); {have} have it: fill "
                     f"it in every record or set data.text_column / pair_column / label_column / negative_column")


def _decoded_lines(path: Path, on_decode_error: str, stats: CorpusStats,
                   data: Optional[bytes] = None) -> Iterator[tuple[int, str]]:
    """A file's lines as text: UTF-8, or the UTF-16/32 its byte-order mark names. A NUL byte in a
    UTF-8 line is refused: it is a UTF-16 file without a mark, or not text at all."""
    with (io.BytesIO(data) if data is not None else open(path, "rb")) as fh:
        head = fh.read(4)
        fh.seek(0)
        encoding = next((name for bom, name in BOMS if head.startswith(bom)), None)
        if encoding not in (None, "utf-8-sig"):
            text = io.TextIOWrapper(fh, encoding=encoding, errors="strict" if on_decode_error == "error" else "replace",
                                    newline=None)
            try:
                for lineno, line in enumerate(text, start=1):
                    stats.lines_read += 1
                    yield lineno, line
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}: undecodable {encoding} ({exc.reason}); fix the file or set "
                                f"data.on_decode_error: replace") from None
            return
        for lineno, raw in enumerate(fh, start=1):
            stats.lines_read += 1
            if lineno == 1 and encoding:
                raw = raw[len(codecs.BOM_UTF8):]
            if b"\0" in raw:
                raise DataError(f"{path}:{lineno}: NUL bytes in a text line: a UTF-16 file without a byte-order mark, "
                                f"or not a text file; convert it to UTF-8")
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if on_decode_error == "error":
                    raise DataError(f"{path}:{lineno}: undecodable bytes at offset {exc.start} (not UTF-8); "
                                    f"fix the file or set data.on_decode_error: replace") from None
                stats.decode_replaced += 1
                yield lineno, raw.decode("utf-8", errors="replace")


def _raw_texts(path: Path, fmt: str, column: str, on_decode_error: str, stats: CorpusStats,
               data: Optional[bytes] = None) -> Iterator[str]:
    if fmt == "text":
        for _, line in _decoded_lines(path, on_decode_error, stats, data):
            yield line
        return
    for lineno, (value,) in enumerate(_records(path, fmt, [column], on_decode_error, stats, data), start=1):
        yield as_text(value, column, f"{path}: row {lineno}")


def text_key(text: str) -> int:
    """A stable 63-bit hash of a text (Python's hash() is salted per process; workers must agree)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") >> 1


def file_examples(path: str, fmt: str, columns: "ExampleColumns", max_chars: int, on_decode_error: str,
                  stats: CorpusStats, data: Optional[bytes] = None) -> Iterator:
    """Cleaned examples of one file: texts, or (q, a, score-or-None) pairs when ``columns.pairs``.

    Strips, drops empty rows (a pair with an empty side), caps characters, parses scores; every
    drop or change is counted in ``stats``. Deduplication is the caller's (it spans files).
    """
    p = Path(path)
    fmt = detect_format(p, fmt)
    if not columns.pairs:
        for raw in _raw_texts(p, fmt, columns.text, on_decode_error, stats, data):
            text = clean_text(raw, max_chars, stats)
            if text is not None:
                yield text
        return
    score_scale = columns.score_scale
    if fmt == "stsb":
        rows = _stsb_rows(p, on_decode_error, stats, data)
        score_scale = 5.0
    elif fmt == "text":
        raise DataError(f"{path}: pairs need a JSONL, Parquet, CSV/TSV (with a header) or stsb file, not plain text")
    else:
        cols = [columns.text, columns.pair] + ([columns.label] if columns.label else []) + list(columns.negatives)
        rows = _records(p, fmt, cols, on_decode_error, stats, data)
    k = len(columns.negatives)
    for lineno, row in enumerate(rows, start=1):
        where = f"{path}: row {lineno}"
        pair = clean_pair(row[:len(row) - k], max_chars, score_scale, where, stats, (columns.text, columns.pair))
        if pair is not None and k:
            pair = (*pair, clean_negatives(row[len(row) - k:], columns.negatives, max_chars, where))
        if pair is not None:
            yield pair


def as_text(value, column: str, where: str) -> str:
    """A text cell as a string ("" for a missing one): a number or a list in a text column is refused,
    not turned into "0" or "[0, 1]" and trained on."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise DataError(f"{where}: column '{column}' holds {type(value).__name__} values, not text; name a text column "
                    f"(data.text_column / pair_column / negative_column)")


def has_text(text: str) -> bool:
    """Whether ``text`` holds anything a tokenizer keeps: a character that is not a separator (spaces, NBSP)
    nor a control, format (zero-width spaces, joiners, marks of direction), private or unassigned one.
    A line of those alone tokenizes to no token at all: it trained as an empty sentence."""
    import unicodedata

    return any(c.isalnum() or unicodedata.category(c)[0] not in "ZC" for c in text)


def clean_text(raw, max_chars: int, stats: CorpusStats, column: str = "text", where: str = "") -> Optional[str]:
    """Strip and cap one text; None (counted) when nothing is left. The unit separator (0x1F) becomes
    a space: it marks the fields of CompCSE's span rows, so a sentence holding two of them was read
    as a row of three fields."""
    text = as_text(raw, column, where or "corpus").replace("\x1f", " ").strip()
    if not text or not has_text(text):
        stats.empty_dropped += 1
        return None
    if len(text) > max_chars:
        stats.truncated += 1
        text = text[:max_chars]
    stats.kept += 1
    return text


def clean_pair(row, max_chars: int, score_scale: float, where: str, stats: CorpusStats,
               names: tuple = ("text", "pair")) -> Optional["Pair"]:
    """(q, a[, label]) raw cells -> (q, a, score / score_scale or None); None (counted) if a side is empty."""
    q = as_text(row[0], names[0], where).strip()
    a = as_text(row[1], names[1], where).strip()
    if not q or not a or not has_text(q) or not has_text(a):
        stats.empty_dropped += 1
        return None
    if len(q) > max_chars or len(a) > max_chars:
        q, a = q[:max_chars], a[:max_chars]
        stats.truncated += 1
    score = None
    if len(row) > 2 and row[2] is not None and str(row[2]).strip() != "":
        try:
            score = float(row[2]) / score_scale
        except ValueError:
            raise DataError(f"{where}: label {row[2]!r} is not a number; fix it or drop the label column") from None
        if score != score:  # NaN: no label
            score = None
        elif score in (float("inf"), float("-inf")):
            raise DataError(f"{where}: label {row[2]!r} is not a finite number; fix it or drop the label column")
    stats.kept += 1
    return q, a, score


def clean_negatives(cells, names: tuple, max_chars: int, where: str) -> tuple[str, ...]:
    """A pair's hard negatives, stripped and capped; an empty one is an error (a triplet needs it)."""
    out = []
    for name, cell in zip(names, cells):
        text = as_text(cell, name, where).strip()
        if not text:
            raise DataError(f"{where}: negative column '{name}' is empty; fill it or drop the row")
        out.append(text[:max_chars])
    return tuple(out)


@dataclass
class ExampleColumns:
    """Which columns hold the example: a text, or a pair (text, pair[, label]) scaled to [0, 1], with
    its hard negatives (``negatives``: column names) as a fourth element."""

    text: str = "text"
    pair: Optional[str] = None
    label: Optional[str] = None
    score_scale: float = 1.0
    stsb: bool = False
    negatives: tuple = ()

    @property
    def pairs(self) -> bool:
        return bool(self.pair) or self.stsb


def read_examples(path: str, fmt: str = "auto", columns: Optional[ExampleColumns] = None, max_chars: int = 20000,
                  on_decode_error: str = "replace", dedup: bool = False,
                  max_examples: Optional[int] = None) -> tuple[list, CorpusStats]:
    """All cleaned examples of one local file, in file order (the in-memory reader)."""
    columns = columns or ExampleColumns(stsb=fmt == "stsb")
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{'pair' if columns.pairs else 'corpus'} file not found: {path}")
    stats = CorpusStats()
    out: list = []
    seen: set[int] = set()
    for ex in file_examples(path, fmt, columns, max_chars, on_decode_error, stats):
        if dedup:
            key = text_key(ex if isinstance(ex, str) else ex[0] + "\t" + ex[1])
            if key in seen:
                stats.duplicates_dropped += 1
                stats.kept -= 1
                continue
            seen.add(key)
        out.append(ex)
        if max_examples is not None and len(out) >= max_examples:
            break
    if not out:
        raise DataError(f"{path} has no usable {'pairs' if columns.pairs else 'text'} after cleaning "
                        f"({stats.summary()}); give a file with at least one non-empty line")
    return out, stats


def read_corpus(path: str, fmt: str = "auto", text_column: str = "text", max_chars: int = 20000,
                on_decode_error: str = "replace", dedup: bool = False,
                max_sentences: Optional[int] = None) -> tuple[list[str], CorpusStats]:
    return read_examples(path, fmt, ExampleColumns(text=text_column), max_chars, on_decode_error, dedup, max_sentences)


# A pair row: (q, a, score or None[, (negative, ...)]), the field order of raycse.objectives.base.Pair, which
# reads it by name (a plain tuple here: corpus reads run in Ray Data tasks that do not import torch)
Pair = tuple


def _stsb_rows(path: Path, on_decode_error: str, stats: CorpusStats, data: Optional[bytes] = None) -> Iterator[list]:
    for lineno, line in _decoded_lines(path, on_decode_error, stats, data):
        if not line.strip():
            yield [None, None]
            continue
        cols = line.rstrip("\r\n").split("\t")
        if len(cols) < 7:
            raise DataError(f"{path}:{lineno}: expected >= 7 tab-separated columns (STS Benchmark format)")
        yield [cols[5], cols[6], cols[4]]
