"""The data part of a run: where the training text comes from and how it is cleaned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raycse.config.fields import Section, at_least, detail, knob, one_of
from raycse.config.sources import check_sources
from raycse.errors import ConfigError
from raycse.platform.conversion import shown

CORPUS_FORMATS = ("auto", "text", "jsonl", "parquet", "csv", "tsv", "stsb", "hf")


DECODE_POLICIES = ("replace", "error")



@dataclass
class DataConfig(Section):
    """Where the training text comes from and how it is cleaned: the ``data`` section of a run (``--corpus``,
    ``--format``, the columns, ``data.sources`` for a mixture); what ``raycse.mine`` reads too.

    Args:
        corpus: a file, folder, glob or URI; format: auto, text, jsonl, parquet, csv, stsb or hf; text_column,
            pair_column, label_column, negative_column: the columns; the other fields: ``raycse train --help``.

    Returns:
        ``is_pairs``, ``is_mixture`` and the other properties say what the data holds.

    Raises:
        raycse.errors.ConfigError: from ``validate``, a value it cannot take, one line.

    >>> d = DataConfig(corpus="pairs.jsonl", text_column="q", pair_column="a")
    >>> d.validate(); d.is_pairs, d.is_mixture
    (True, False)
    """

    @property
    def is_pairs(self) -> bool:
        return bool(self.pair_column) or self.format == "stsb"

    corpus: Optional[str] = knob(None, '--corpus',
                                 'training data: a file (.txt one sentence per line, .jsonl, .parquet, .csv/.tsv with'
                                 ' a header), a glob, a directory, several comma-separated, a URI Ray reads (s3://, '
                                 'gs://), or with --format hf a Hugging Face dataset NAME[:CONFIG], a save_to_disk '
                                 'directory or a builder name with --data-files')
    format: str = knob("auto", '--format',
                       'auto (by suffix) | text | jsonl | parquet | csv | tsv | stsb (the headerless STS Benchmark '
                       'TSV, read as scored pairs) | hf (a Hugging Face dataset)')
    text_column: str = knob("text", '--text-column',
                            'text field of JSONL/Parquet/CSV corpora')
    pair_column: Optional[str] = knob(None, '--pair-column',
                                      'second text field: train on pairs (q, a[, score]) with a pair objective '
                                      '(supervised simcse, bsc)')
    label_column: Optional[str] = knob(None, '--label-column',
                                       'label or score field of pairs (0/1 labels or scores)')
    negative_column: Optional[str] = knob(None, '--negative-column',
                                          'hard-negative field(s) of pairs, comma-separated (triplets, e.g. NLI '
                                          'contradictions: supervised simcse, bsc)')
    score_scale: float = knob(1.0, '--score-scale',
                              'divide scores by this to land in [0, 1] (5 for 0-5 STS scores; stsb sets it itself)')
    max_chars: int = detail(20000,
                            'characters kept per line before tokenizing (tokens are cut to model.max_length anyway: '
                            'this bounds memory on pathological lines)')
    on_decode_error: str = detail("replace",
                                  'undecodable bytes in a text file: replace (with U+FFFD, counted) | error (refuse '
                                  'the file)')
    max_sentences: Optional[int] = knob(None, '--max-sentences',
                                        'use only the first N cleaned sentences (default: all)')
    dedup: bool = knob(False, '--dedup',
                       'drop repeated examples across the whole corpus (counted)')
    split: str = detail("train", 'the Hugging Face split read with --format hf')
    data_files: Optional[str] = knob(None, '--data-files',
                                     'with --format hf and a builder name as --corpus (json, csv, parquet, text): its'
                                     ' local files, comma-separated (datasets.load_dataset(NAME, data_files=...), '
                                     'offline)')

    prompts: dict = knob({}, '--prompts',
                         'text put before each sentence of a column in training, as YAML, e.g. \'{text: "query: ", '
                         'pair: "passage: "}\' (E5/BGE-style instructions); the model keeps them as its "query" and '
                         '"document" prompts, the text column\'s as its default (default: none)')

    sources: dict = detail({},
                           'several datasets in one run (a mixture), NAME -> its settings: corpus, format, columns, '
                           'prompts as the data section takes them, objective (name and knobs), grouping, share of '
                           'the steps (every source\'s given: scaled to sum to 1; some given: the others share '
                           'what is left by data.mixing); what a source leaves out is the run\'s. Each batch comes '
                           'from one source. '
                           '--source NAME=PATH adds one, --set data.sources.NAME.KEY=VALUE sets its KEY')
    mixing: str = knob("proportional", '--mixing',
                       'with data.sources, which source each step\'s batch comes from: proportional (a source\'s '
                       'share of the steps is its share of the examples) | round_robin (equal shares, in turn) | '
                       'temperature (shares ~ examples^(1/T), T = data.mixing_temperature); a source\'s share '
                       'overrides them')
    mixing_temperature: float = detail(2.0, 'the T of data.mixing temperature (1: proportional; larger: more even)')

    @property
    def is_mixture(self) -> bool:
        return bool(self.sources)

    def validate(self) -> None:
        check_sources(self.sources, self.corpus, self.mixing, self.mixing_temperature)
        one_of("data.format", self.format, CORPUS_FORMATS)
        self.check_prompts()
        one_of("data.on_decode_error", self.on_decode_error, DECODE_POLICIES)
        at_least("data.max_chars", self.max_chars, 1)
        if not self.score_scale > 0:
            raise ConfigError(f"data.score_scale must be > 0, got {self.score_scale}")
        if self.label_column and not self.pair_column and self.format != "stsb":
            raise ConfigError("data.label_column needs data.pair_column (labels belong to pairs)")
        if self.negative_column and not self.pair_column:
            raise ConfigError("data.negative_column needs data.pair_column (the positive of each anchor)")
        if self.negative_column and not self.negative_columns:
            raise ConfigError(f"data.negative_column names no column: {self.negative_column!r}")
        if self.max_sentences is not None:
            at_least("data.max_sentences", self.max_sentences, 1)
        if self.data_files and self.format != "hf":
            raise ConfigError("data.data_files goes with --format hf (datasets.load_dataset(NAME, data_files=...)); "
                              "for plain files pass them as --corpus")

    def check_prompts(self) -> None:
        roles = ("text", "pair") if self.is_pairs else ("text",)
        wrong = [k for k in self.prompts if k not in roles]
        if wrong:
            raise ConfigError(f"data.prompts has {shown(wrong[0])}; its keys are the columns {' and '.join(roles)}"
                              + ("" if self.is_pairs else " (pair needs data.pair_column)"))
        bad = [k for k, v in self.prompts.items() if not isinstance(v, str) or not v.strip()]
        if bad:
            raise ConfigError(f"data.prompts.{bad[0]} must be a non-empty text, got {shown(self.prompts[bad[0]])}; "
                              f"quote it, e.g. {bad[0]}: \"query: \"")

    @property
    def negative_columns(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in (self.negative_column or "").split(",") if c.strip())
