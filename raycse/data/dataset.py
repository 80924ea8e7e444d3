"""Corpora as Ray Datasets: streaming reads, cleaning with counts, seeded pre-shuffle, row ids.

Sources: local files and globs (``data/*.txt``), several paths separated by commas, any URI
that Ray's readers support (``s3://bucket/prefix/``, ``gs://...``), and Hugging Face datasets
(``data.format: hf``, ``data.corpus: NAME`` or ``NAME:CONFIG``, split ``data.split``).

Pipeline, all of it in Ray tasks (nothing is collected on the driver but counts and 8-byte
hashes):

1. read, files in a seeded random order (``shuffle=FileShuffleConfig(seed)``);
2. parse and clean each file (or Parquet/HF batch) with the same code as the in-memory reader
   (:func:`raycse.data.corpus.file_examples`), emitting one extra *stats row* per file/batch so
   the drop counts travel with the data;
3. randomize the block order (seeded), then in one task per block: shuffle the block's rows
   (seeded), sum and remove the stats rows;
4. optional global deduplication by text hash (first occurrence in the shuffled order wins);
5. ``data.max_sentences`` keeps the first N rows of the shuffled order;
6. number the rows ``_id`` = 0..N-1 so that grouping can refer to them.

The result is a :class:`Corpus`: a materialized, block-distributed Ray Dataset with columns
``_id``, ``text`` (and ``pair``, ``score`` for pairs) plus the counts of what was dropped.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

import numpy as np

from raycse.config.train import TrainConfig
from raycse.data.corpus import CorpusStats, ExampleColumns, detect_format, file_examples, text_key
from raycse.errors import DataError
from raycse.platform import object_store
from raycse.platform.capacity import CpuWait

# How long a corpus read waits for a CPU unless its caller says: the workers' default wait for their
# start (train.worker_start_timeout_s x train.worker_start_attempts); a training run passes its own.
DEFAULT_CPU_WAIT = CpuWait(TrainConfig.worker_start_timeout_s * TrainConfig.worker_start_attempts)

STAT_COLUMNS = {f.name: "_n_" + f.name for f in fields(CorpusStats)}


@dataclass
class Corpus:
    dataset: "object"  # ray.data.MaterializedDataset with _id, text[, pair, score]
    num_examples: int
    stats: CorpusStats
    pairs: bool
    blocks: list = field(default_factory=list)  # the dataset's Arrow blocks (ObjectRefs), numbered in order


def columns_of(d) -> ExampleColumns:
    return ExampleColumns(d.text_column, d.pair_column, d.label_column, d.score_scale, stsb=d.format == "stsb",
                          negatives=d.negative_columns)


# --------------------------------------------------------------------------------------- sources
def resolve_sources(spec: str) -> list[str]:
    """Comma-separated paths; local ones made absolute, globs expanded (sorted); URIs passed to Ray as they
    are, once something is there (a missing object is one line now, not a traceback from Ray Data)."""
    out: list[str] = []
    for part in [s.strip() for s in str(spec).split(",") if s.strip()]:
        if "://" in part:
            object_store.check_exists(part, "corpus")
            out.append(part)
            continue
        # absolute: Ray's read tasks do not run in the driver's working directory
        part = os.path.abspath(os.path.expanduser(part))
        if any(ch in part for ch in "*?["):
            matches = sorted(p for p in glob.glob(part, recursive=True) if os.path.isfile(p))
            if not matches:
                raise DataError(f"no corpus file matches {part}; check the pattern (globs: *, ?, **)")
            out.extend(matches)
        elif os.path.isdir(part):
            out.extend(_directory_files(part))
        elif os.path.isfile(part):
            out.append(part)
        elif os.path.lexists(part):
            raise DataError(f"corpus {_shown_path(part)} is not a regular file ({NOT_A_FILE}); give a file, a "
                            f"directory of files or a glob")
        else:
            raise DataError(f"corpus file not found: {_shown_path(part)}")
    if not out:
        raise DataError("no corpus given: pass --corpus FILE[,FILE...] (text, .jsonl, .parquet, globs or s3:// URIs)")
    for path in out:
        _check_utf8_path(path)
    return out


NOT_A_FILE = "a FIFO, socket or device, or a link that loops or points nowhere"


def _directory_files(directory: str) -> list[str]:
    """The regular files under a corpus directory (hidden ones left out), sorted. Anything else there
    (FIFOs, sockets, devices, links that loop or point nowhere) is skipped and counted: a read of it
    would block for ever or fail inside Ray Data's listing."""
    found, skipped = [], []
    for root, _, names in os.walk(directory):
        for name in names:
            if name.startswith("."):
                continue
            path = os.path.join(root, name)
            (found if os.path.isfile(path) else skipped).append(path)
    if skipped:
        print(f"[raycse] warning: corpus directory {_shown_path(directory)}: skipped {len(skipped)} entr"
              f"{'y' if len(skipped) == 1 else 'ies'} that {'is' if len(skipped) == 1 else 'are'} not a regular file "
              f"({NOT_A_FILE}), e.g. {_shown_path(skipped[0])}", flush=True)
    if not found:
        raise DataError(f"corpus directory {_shown_path(directory)} has no files")
    return sorted(found)


def _shown_path(path: str) -> str:
    """A path as a message can print it: bytes that are not UTF-8 (kept by Python as surrogates) escaped."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _check_utf8_path(path: str) -> None:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(f"corpus path {_shown_path(path)} is not valid UTF-8, and Ray passes paths as UTF-8; rename "
                        f"it (e.g. convmv -f latin1 -t utf8) or move the file to a UTF-8 path") from None


def _has_text(open_file, name: str) -> bool:
    """Whether a corpus file holds a row (Parquet) or a non-blank byte within its first 64 MiB; an
    unreadable one counts as text, so the read names the file and its problem."""
    try:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            with open_file() as fh:
                return pq.ParquetFile(fh).metadata.num_rows > 0
        with open_file() as fh:
            for _ in range(64):
                block = fh.read(1 << 20)
                if not block or block.strip():
                    break
            return bool(block.strip()) or len(block) == 1 << 20
    except Exception:
        return True


def _uri_files(uri: str) -> list[tuple]:
    """(filesystem, path) of every file at ``uri``: the object, or the objects under the prefix."""
    import pyarrow.fs as pafs

    fs, path = object_store.filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [(fs, path)]
    found = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return [(fs, i.path) for i in found if i.type == pafs.FileType.File and not i.base_name.startswith(".")]


EMPTY_CHECK_FILES = 100  # files looked into before the check leaves the verdict to the read


def check_not_empty(sources: list) -> None:
    """A corpus of empty or blank files, local or on object storage, is refused before Ray starts.
    Reads until the first non-blank byte, at most 64 MiB a file and :data:`EMPTY_CHECK_FILES` files
    (a prefix of countless blank objects is then left to the read, which fails on it in one line)."""
    checked = 0
    for src in sources:
        if object_store.is_uri(src):
            try:
                files = _uri_files(src)
            except OSError:
                return  # (resolve_sources found it: a store failing now fails the read, naming itself)
            opens = [(lambda fs=fs, path=path: fs.open_input_file(path), path) for fs, path in files]
        else:
            opens = [(lambda src=src: open(src, "rb"), src)]
        for open_file, name in opens:
            if checked == EMPTY_CHECK_FILES or _has_text(open_file, name):
                return
            checked += 1
    raise DataError(f"the corpus has no usable text: {', '.join(sources[:3])}{' ...' if len(sources) > 3 else ''} "
                    f"{'is' if len(sources) == 1 else 'are'} empty or blank; give a corpus with one sentence per "
                    f"line (or records with a text field)")


def saved_to_disk(path: str) -> bool:
    """A directory ``datasets``' ``save_to_disk`` wrote (a Dataset or a DatasetDict)."""
    p = Path(os.path.expanduser(path))
    return p.is_dir() and any((p / f).is_file() for f in ("dataset_info.json", "state.json", "dataset_dict.json"))


def check_hub_dataset(d) -> None:
    """A dataset named by a hub id while the hub cannot be reached is refused at once (the hub client
    would retry for ~35 s first). With HF_HUB_OFFLINE=1 the datasets library reads its cache only.
    A saved directory and a builder over local files (data.data_files) need no hub."""
    from huggingface_hub import constants

    from raycse.platform import hub

    if d.data_files or saved_to_disk(str(d.corpus).partition(":")[0]):
        return
    unreachable = None if constants.HF_HUB_OFFLINE else hub.unreachable()
    if unreachable:
        raise DataError(f"cannot load Hugging Face dataset '{d.corpus}': {unreachable}; a dataset in the local "
                        f"cache loads with HF_HUB_OFFLINE=1, or save it as Parquet/JSONL and pass that file "
                        f"with --corpus")


def _file_shuffle(seed: int):
    from ray.data import FileShuffleConfig

    return FileShuffleConfig(seed=seed)


# --------------------------------------------------------------------------------------- parsing
def _rows_to_table(examples: list, pairs: bool, stats: CorpusStats, negatives: bool = False):
    """Examples + one stats row (text null) -> an Arrow table."""
    import pyarrow as pa

    n = len(examples)
    cols: dict = {}
    if pairs:
        cols["text"] = [e[0] for e in examples] + [None]
        cols["pair"] = [e[1] for e in examples] + [None]
        cols["score"] = pa.array([e[2] for e in examples] + [None], type=pa.float64())
        if negatives:  # hard negatives travel with their row (grouping keeps them)
            cols["negatives"] = pa.array([list(e[3]) for e in examples] + [None], type=pa.list_(pa.string()))
    else:
        cols["text"] = list(examples) + [None]
    for name, col in STAT_COLUMNS.items():
        cols[col] = pa.array([0] * n + [getattr(stats, name)], type=pa.int64())
    return pa.table(cols)


class ParseFiles:
    """map_batches over ``read_binary_files`` rows (one file each): parse + clean with the shared code."""

    def __init__(self, fmt: str, columns: ExampleColumns, max_chars: int, on_decode_error: str):
        self.fmt, self.columns, self.max_chars, self.on_decode_error = fmt, columns, max_chars, on_decode_error

    def __call__(self, batch: dict):
        import pyarrow as pa

        tables = []
        for data, path in zip(batch["bytes"], batch["path"]):
            stats = CorpusStats()
            examples = list(file_examples(str(path), self.fmt, self.columns, self.max_chars, self.on_decode_error,
                                          stats, data=bytes(data)))
            tables.append(_rows_to_table(examples, self.columns.pairs, stats, bool(self.columns.negatives)))
        return pa.concat_tables(tables)


class CleanColumns:
    """map_batches over native Parquet / HF rows: the same cleaning as for files."""

    def __init__(self, columns: ExampleColumns, max_chars: int):
        self.columns, self.max_chars = columns, max_chars

    def __call__(self, batch: dict):
        from raycse.data.corpus import clean_negatives, clean_pair, clean_text

        stats = CorpusStats(lines_read=len(batch[self.columns.text]))
        examples = []
        if self.columns.pairs:
            cells = [batch[self.columns.text], batch[self.columns.pair]]
            if self.columns.label:
                cells.append(batch[self.columns.label])
            k = len(self.columns.negatives)
            cells += [batch[c] for c in self.columns.negatives]
            for i, row in enumerate(zip(*cells)):
                row = list(row)
                pair = clean_pair(row[:len(row) - k], self.max_chars, self.columns.score_scale, f"row {i}", stats,
                                  (self.columns.text, self.columns.pair))
                if pair is not None and k:
                    pair = (*pair, clean_negatives(row[len(row) - k:], self.columns.negatives, self.max_chars,
                                                   f"row {i}"))
                if pair is not None:
                    examples.append(pair)
        else:
            texts = (clean_text(raw, self.max_chars, stats, self.columns.text, f"row {i}")
                     for i, raw in enumerate(batch[self.columns.text]))
            examples = [t for t in texts if t is not None]
        return _rows_to_table(examples, self.columns.pairs, stats, bool(self.columns.negatives))


def _check_columns(present: list[str], wanted: list[str], where: str) -> None:
    missing = [c for c in wanted if c not in present]
    if missing:
        raise DataError(f"column '{missing[0]}' not found in {where}; columns: {', '.join(present)}"
                        f" (set data.text_column / pair_column / label_column / negative_column)")


def _check_jsonl_columns(path: str, first: list[str], wanted: list[str]) -> None:
    """A column the first record lacks: refused with how many records have it and how many do not."""
    from raycse.data.corpus import missing_field_error

    missing = [c for c in wanted if c not in first]
    if missing:
        raise missing_field_error(Path(path), missing[0], first)


def _check_text_types(schema, text_columns: list[str], where: str) -> None:
    """Text columns of a Parquet file must hold strings: numbers or lists would be trained on as "0"."""
    import pyarrow as pa

    for name in text_columns:
        kind = schema.field(name).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)
                or getattr(pa.types, "is_string_view", lambda _: False)(kind)):
            raise DataError(f"column '{name}' of {where} holds {kind} values, not text; name a text column "
                            f"(data.text_column / pair_column / negative_column)")


def _first_columns(path: str, fmt: str) -> Optional[list[str]]:
    """The fields of the first JSON record, or the header of a CSV/TSV file; None when it cannot tell
    (empty or malformed: the reader reports those with their line numbers)."""
    import csv
    import json

    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            if fmt != "jsonl":
                return next(csv.reader([line.rstrip("\r\n")], delimiter="\t" if fmt == "tsv" else ","))
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                return None
            return list(record) if isinstance(record, dict) else None
    return None


def in_memory(source, d):
    """A Ray Dataset from what the Python API was handed: a ``ray.data.Dataset`` as it is, a
    ``datasets.Dataset`` (or a DatasetDict: its ``data.split``) through Ray's own converter."""
    import ray.data

    if isinstance(source, ray.data.Dataset):
        return source
    if hasattr(source, "keys") and hasattr(source, "column_names") and not hasattr(source, "features"):
        if d.split not in source:
            raise DataError(f"the DatasetDict has no split '{d.split}' (it has {', '.join(source)}); set data.split")
        source = source[d.split]
    if hasattr(source, "features") and hasattr(source, "select_columns"):  # a datasets.Dataset
        return from_hf(source)
    raise DataError(f"corpus must be a path, a ray.data.Dataset or a datasets.Dataset, got {type(source).__name__}")


def from_hf(hf):
    """A Ray Dataset of a Hugging Face dataset's rows, which are on this machine already.

    Not ``ray.data.from_huggingface``: before it converts, it reloads the dataset by its builder's
    name to look for the hub's Parquet copy. For a builder over local files (``json``, ``csv``) that
    globs the working directory recursively (150 s from a checkout with its venv; unbounded from a
    large home directory), and it then asks huggingface.co with no timeout."""
    import datasets
    import ray.data

    if isinstance(hf, datasets.IterableDataset):  # streamed, as Ray's converter streams it
        from raycse.data.hf_stream import StreamedHFDatasource

        return ray.data.read_datasource(StreamedHFDatasource(hf))
    return local_dataset(hf.with_format("arrow")[:])  # (the view: select/shuffle applied)


def local_dataset(table):
    """A Ray Dataset of an Arrow table this process holds, as one block, described here.

    Not ``ray.data.from_arrow``: it asks a 1-CPU task on the cluster for the table's row count and
    schema, and waits for it without a bound (on a cluster whose CPUs another job holds, for ever).
    ``ray.data.from_blocks`` computes them in this process."""
    import ray.data

    return ray.data.from_blocks([table])


def _hf_dataset(d):
    """A Hugging Face dataset for --format hf: a save_to_disk directory, a builder over local files
    (data.data_files), or a hub id (NAME[:CONFIG]; needs the hub or its local cache)."""
    import datasets

    name, _, config = str(d.corpus).partition(":")
    if saved_to_disk(name):
        hf = datasets.load_from_disk(os.path.expanduser(name))
        if isinstance(hf, datasets.DatasetDict):
            if d.split not in hf:
                raise DataError(f"{name} holds splits {', '.join(hf)}, not '{d.split}'; set data.split")
            hf = hf[d.split]
        return hf
    check_hub_dataset(d)
    files = [f.strip() for f in (d.data_files or "").split(",") if f.strip()] or None
    try:
        return datasets.load_dataset(name, config or None, split=d.split, data_files=files)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise DataError(f"cannot load Hugging Face dataset '{d.corpus}' split '{d.split}' ({reason}); offline, "
                        f"save it elsewhere as Parquet/JSONL and pass that file with --corpus") from None


def raw_dataset(d, seed: int, shuffle: bool = True, source=None, paths: Optional[list] = None):
    """The lazily read, parsed and cleaned (but not yet shuffled or numbered) dataset; its files in a
    seeded random order, or in their own with ``shuffle`` off. ``source``: a dataset object handed
    to the Python API instead of ``d.corpus``; ``paths``: ``d.corpus``'s files, when the caller
    resolved them already (:func:`resolve_sources`: a listing of object storage is not free)."""
    import ray.data

    columns = columns_of(d)
    wanted = ([columns.text] + ([columns.pair] if columns.pair else []) + ([columns.label] if columns.label else [])
              + list(columns.negatives))
    if source is not None or d.format == "hf":
        if source is not None:
            ds = in_memory(source, d)
            _check_columns(list(ds.schema().names), wanted, f"the {type(source).__name__} handed to raycse.train")
            ds = ds.select_columns(wanted)
        else:  # columns checked and selected before the conversion: only those are converted
            hf = _hf_dataset(d)
            _check_columns(list(hf.column_names), wanted, f"Hugging Face dataset {d.corpus}")
            ds = from_hf(hf.select_columns(wanted))
        return ds.map_batches(CleanColumns(columns, d.max_chars), batch_format="numpy", zero_copy_batch=False)
    paths = paths or resolve_sources(d.corpus)
    fmt = d.format if d.format != "auto" else detect_format(_pathlike(paths[0]))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        if "://" not in paths[0]:
            try:
                schema = pq.read_schema(paths[0])
            except Exception as exc:
                raise DataError(f"cannot read Parquet file {paths[0]}: {str(exc).splitlines()[0]}") from None
            _check_columns(schema.names, wanted, paths[0])
            _check_text_types(schema, [c for c in wanted if c != columns.label], paths[0])
        ds = ray.data.read_parquet(paths, columns=wanted, shuffle=_file_shuffle(seed) if shuffle else None)
        return ds.map_batches(CleanColumns(columns, d.max_chars), batch_format="numpy", zero_copy_batch=False)
    if "://" not in paths[0] and fmt in ("jsonl", "csv", "tsv"):
        present = _first_columns(paths[0], fmt)  # a missing column is one clean line, before Ray Data starts
        if present is not None and fmt == "jsonl":
            _check_jsonl_columns(paths[0], present, wanted)
        elif present is not None:
            _check_columns(present, wanted, paths[0])
    ds = ray.data.read_binary_files(paths, include_paths=True, shuffle=_file_shuffle(seed) if shuffle else None)
    # format auto: each file by its own suffix (a .txt and a .jsonl can be read together)
    return ds.map_batches(ParseFiles(d.format, columns, d.max_chars, d.on_decode_error), batch_size=1,
                          batch_format="numpy", zero_copy_batch=False)


def _pathlike(path: str):
    return Path(path.split("://", 1)[-1])


# --------------------------------------------------------------------------------------- block tasks
def _finish_block(table, seed: int, block: int, expand=None, shuffle: bool = True):
    """Sum and drop the stats rows, add the objective's extra rows, shuffle the block (seeded, unless
    ``shuffle`` is off), hash texts for deduplication."""
    import pyarrow.compute as pc

    totals = {name: int(pc.sum(table[col]).as_py() or 0) for name, col in STAT_COLUMNS.items()
              if col in table.column_names}
    table = table.filter(pc.is_valid(table["text"])).drop_columns(list(STAT_COLUMNS.values()))
    if expand is not None:
        table, totals["extra_rows"] = _expand_rows(table, expand, np.random.default_rng([seed, block, 1]))
    if shuffle:
        table = table.take(np.random.default_rng([seed, block]).permutation(table.num_rows))
    texts = table["text"].to_pylist()
    if "pair" in table.column_names:
        texts = [f"{t}\t{p}" for t, p in zip(texts, table["pair"].to_pylist())]
    hashes = np.fromiter((text_key(t) for t in texts), dtype=np.int64, count=len(texts))
    return table, (totals, hashes)


def _expand_rows(table, expand, rng):
    """Each text followed by its extra rows (single-text corpora only; pairs never expand)."""
    import pyarrow as pa

    texts = table["text"].to_pylist()
    out = []
    for text in texts:
        out.append(text)
        out.extend(expand(text, rng))
    return pa.table({"text": pa.array(out, pa.string())}), len(out) - len(texts)


def _select_and_number(table, keep: Optional[np.ndarray], first_id: int):
    import pyarrow as pa

    if keep is not None:
        table = table.filter(pa.array(keep))
    ids = pa.array(np.arange(first_id, first_id + table.num_rows, dtype=np.int64))
    return table.add_column(0, "_id", ids)


def load_corpus(d, seed: int, dedup: Optional[bool] = None, expand=None, shuffle: bool = True, source=None,
                paths: Optional[list] = None, cpu_wait: CpuWait = DEFAULT_CPU_WAIT) -> Corpus:
    """Read, clean, pre-shuffle and number a corpus as a distributed Ray Dataset (see the module doc).

    ``expand(text, rng) -> list[str]``: extra rows made from each text (an objective's
    ``row_expander``, e.g. CompCSE's subsampling), added before the shuffle, deduplication and
    ``data.max_sentences`` (which therefore counts the extra rows too). The read waits for a free CPU
    as ``cpu_wait`` says, then fails naming what holds them. ``shuffle`` off keeps the files' own order
    (no pre-shuffle: grouping.strategy none). ``source``: a ray.data.Dataset or datasets.Dataset read
    instead of ``d.corpus`` (the Python API's); ``paths``: ``d.corpus``'s files already resolved
    (:func:`raw_dataset`)."""
    import ray

    ds = raw_dataset(d, seed, shuffle, source, paths)
    if shuffle:
        ds = ds.randomize_block_order(seed=seed)
    else:  # the files' order must survive the read (Ray Data may otherwise finish blocks out of order)
        ds.context.execution_options.preserve_order = True
    cpu_wait.wait(f"read the corpus {d.corpus}")
    tables, stats, hashes = _finish_blocks(ds, seed, expand, shuffle)
    keeps = _first_occurrences(hashes, stats, d.dedup if dedup is None else dedup)
    counts = _cap(hashes, keeps, d.max_sentences)
    stats.kept = total = int(sum(counts))  # after dedup and data.max_sentences
    if total == 0:
        raise DataError(f"corpus {d.corpus} has no usable {'pairs' if d.is_pairs else 'text'} after cleaning "
                        f"({stats.summary()}); give a file with at least one non-empty line")
    # DEFAULT scheduling: inside a Tune trial, tasks would otherwise be pinned to the trial's tiny bundle
    number = ray.remote(scheduling_strategy="DEFAULT")(_select_and_number)
    offsets = np.cumsum([0] + counts[:-1])
    refs = [number.remote(t, k, int(o)) for t, k, o in zip(tables, keeps, offsets)]
    return Corpus(ray.data.from_arrow_refs(refs), total, stats, d.is_pairs, refs)


def _finish_blocks(ds, seed: int, expand, shuffle: bool) -> tuple:
    """Each read block cleaned, expanded and shuffled in a task of its own: (the blocks' table refs, the
    corpus's counts summed, each block's 8-byte row hashes: all the driver gathers)."""
    import ray

    finish = ray.remote(num_returns=2, scheduling_strategy="DEFAULT")(_finish_block)
    with ray_data_errors():
        parts = [finish.remote(ref, seed, i, expand, shuffle) for i, ref in enumerate(ds.to_arrow_refs())]
        meta = ray.get([p[1] for p in parts])
    stats = CorpusStats()
    for totals, _ in meta:
        for k, v in totals.items():
            setattr(stats, k, getattr(stats, k) + v)
    return [p[0] for p in parts], stats, [h for _, h in meta]


def _first_occurrences(hashes: list, stats: CorpusStats, dedup: bool) -> list:
    """Counts the repeats into ``stats``; with ``dedup``, each block's mask of the rows seen first (the
    rest are dropped and counted), else None for every block (all kept)."""
    keeps: list[Optional[np.ndarray]] = [None] * len(hashes)
    if not hashes:
        return keeps
    flat = np.concatenate(hashes)
    first = np.zeros(len(flat), dtype=bool)
    first[np.unique(flat, return_index=True)[1]] = True
    stats.repeats = int(len(flat) - first.sum())
    if dedup:
        stats.duplicates_dropped = stats.repeats
        bounds = np.cumsum([0] + [len(h) for h in hashes])
        keeps = [first[bounds[i]:bounds[i + 1]] for i in range(len(hashes))]
    return keeps


def _cap(hashes: list, keeps: list, max_sentences: Optional[int]) -> list[int]:
    """Each block's rows kept, the first ``max_sentences`` of the shuffled order at most; ``keeps`` (the
    blocks' masks, None = all) is narrowed in place where the cap cuts a block."""
    counts = [len(h) if k is None else int(k.sum()) for h, k in zip(hashes, keeps)]
    if max_sentences is None:
        return counts
    budget = max_sentences
    for i, c in enumerate(counts):
        take = min(c, budget)
        if take < c:
            idx = np.flatnonzero(keeps[i] if keeps[i] is not None else np.ones(len(hashes[i]), dtype=bool))
            keeps[i] = np.zeros(len(hashes[i]), dtype=bool)
            keeps[i][idx[:take]] = True
            counts[i] = take
        budget -= take
    return counts


class ray_data_errors:
    """Turn a DataError raised inside a Ray task back into itself (one clean line, not a traceback), and
    Ray Data's own no-progress timeout (an execution that waited for CPUs or GPUs another job holds,
    RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S, 30 minutes by default) into one line naming what holds them."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        import ray.data.exceptions

        # (Ray Data's no-progress timeout and its error are newer than raycse's oldest Ray)
        timed_out = getattr(ray.data.exceptions, "ExecutionTimeoutError", None)
        if timed_out is not None and isinstance(exc, timed_out):
            from raycse.platform.capacity import ClusterBusyError, held_resources

            raise ClusterBusyError(f"{str(exc).splitlines()[0]} ({held_resources()}); free the cluster or add a "
                                   "node, or raise RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S") from None
        cause = exc
        for _ in range(8):  # RayTaskError -> cause chains
            if isinstance(cause, DataError):
                raise DataError(str(cause)) from None
            nxt = getattr(cause, "cause", None) or cause.__cause__
            if nxt is None or nxt is cause:
                break
            cause = nxt
        text = str(exc)
        if "DataError" in text:
            line = next((ln for ln in text.splitlines() if "DataError:" in ln), text.splitlines()[-1])
            raise DataError(line.split("DataError:", 1)[-1].strip()) from None
        return False
