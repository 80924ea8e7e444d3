"""STS evaluation in the SentEval layout: STS12-16 ("all" setting), STS-B test, SICK-R test.

Score = Spearman x100 of the cosine similarity of the two sentence vectors against the gold
scores, no trained regressor. STS12-16 use the "all" setting of SimCSE's evaluation: one
Spearman over the concatenation of every subset of the year; pairs whose gold line is empty
are skipped (as SentEval does).

Speed: every unique sentence of all requested tasks is embedded once, in batches sorted by
length (``Encoder.encode``), then pairs are scored by lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from raycse.config.eval_tasks import ALIASES, STS_YEAR_TASKS, TASKS, canonical_task  # noqa: F401 - re-exported
from raycse.errors import DataError

# Task -> (directory or file under the SentEval data root, subsets for the STS years).
STS_YEARS = {
    "STS12": ("STS/STS12-en-test", ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"]),
    "STS13": ("STS/STS13-en-test", ["FNWN", "headlines", "OnWN"]),
    "STS14": ("STS/STS14-en-test", ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"]),
    "STS15": ("STS/STS15-en-test", ["answers-forums", "answers-students", "belief", "headlines", "images"]),
    "STS16": ("STS/STS16-en-test", ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"]),
}
STSB_TEST = "STS/STSBenchmark/sts-test.csv"
SICK_TEST = "SICK/SICK_test_annotated.txt"
SENTEVAL_HINT = ("get the data with SentEval's data/downstream/get_transfer_data.bash "
                 "(github.com/facebookresearch/SentEval) and pass its data/downstream directory")

# texts -> (n, d) vectors; retrieval names a prompt too (embed(texts, prompt_name="query"))
EmbedFn = Callable[..., np.ndarray]


@dataclass
class STSData:
    """Sentence pairs with gold scores (one task)."""

    name: str
    sent1: list[str]
    sent2: list[str]
    gold: np.ndarray

    def __len__(self) -> int:
        return len(self.gold)


def gold_score(text: str, where: str, low: float = 0.0, high: float = 5.0) -> float:
    """A gold score as a finite number in the task's range (``low``-``high``): a NaN or an infinity
    would make the Spearman score NaN or meaningless."""
    try:
        score = float(text)
    except ValueError:
        raise DataError(f"{where}: score column is not a number: {text!r}") from None
    if not low <= score <= high:  # (False for NaN too)
        raise DataError(f"{where}: gold score {text.strip()!r} is not a number between {low:g} and {high:g}; fix "
                        f"the file")
    return score


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"missing evaluation file {path}; {SENTEVAL_HINT}")
    return path.read_bytes().decode("utf-8", errors="replace").splitlines()


def read_sts_year(root: Path, task: str) -> STSData:
    """One STS12-16 year: STS.input.<subset>.txt (s1<TAB>s2) + STS.gs.<subset>.txt (score or empty)."""
    rel, subsets = STS_YEARS[task]
    folder = Path(root) / rel
    s1, s2, gold = [], [], []
    for subset in subsets:
        pairs = _read_lines(folder / f"STS.input.{subset}.txt")
        scores = _read_lines(folder / f"STS.gs.{subset}.txt")
        if len(pairs) != len(scores):
            raise DataError(f"{folder}/STS.*.{subset}.txt: {len(pairs)} pairs but {len(scores)} gold lines")
        for lineno, (pair, score) in enumerate(zip(pairs, scores), start=1):
            if not score.strip():
                continue  # SentEval skips pairs without a gold score
            cols = pair.split("\t")
            if len(cols) < 2:
                raise DataError(f"{folder}/STS.input.{subset}.txt:{lineno}: expected two tab-separated sentences")
            s1.append(cols[0])
            s2.append(cols[1])
            gold.append(gold_score(score, f"{folder}/STS.gs.{subset}.txt:{lineno}"))
    return STSData(task, s1, s2, np.asarray(gold, dtype=np.float64))


def read_stsb(path: str | Path, name: str = "STSBenchmark") -> STSData:
    """STS Benchmark csv: tab-separated, no quoting; genre, file, year, id, score, s1, s2[, extra...]."""
    s1, s2, gold = [], [], []
    for lineno, line in enumerate(_read_lines(Path(path)), start=1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 7:
            raise DataError(f"{path}:{lineno}: expected >= 7 tab-separated columns (STS Benchmark format), got {len(cols)}")
        score = gold_score(cols[4], f"{path}:{lineno}")
        s1.append(cols[5])
        s2.append(cols[6])
        gold.append(score)
    if not gold:
        raise DataError(f"{path} holds no sentence pairs")
    return STSData(name, s1, s2, np.asarray(gold))


# The public STS-B dev set on the Hugging Face hub (sentence1, sentence2, score in [0, 1]): what
# eval.stsb_dev auto falls back to where RAYCSE_DATA names no file.
HUB_STSB = "sentence-transformers/stsb"
HUB_STSB_SPLIT = "validation"


def read_hub_stsb(name: str = "stsb_dev") -> Optional[STSData]:
    """STS-B dev from the hub dataset :data:`HUB_STSB`, or None where neither the hub nor this machine's
    Hugging Face cache has it (the hub is not asked when it cannot be reached: the cache only). Gold scores
    are x5, to STS-B's 0-5 (Spearman does not change)."""
    import importlib.util

    from raycse.platform import hub

    if importlib.util.find_spec("datasets") is None:
        return None
    import datasets

    try:
        with hub.cache_only_if_unreachable():
            rows = datasets.load_dataset(HUB_STSB, split=HUB_STSB_SPLIT)
    except Exception:  # not cached, or the hub refused: "auto" finds nothing (datasets raises several kinds)
        return None
    where = f"{HUB_STSB} ({HUB_STSB_SPLIT})"
    gold = [gold_score(str(5.0 * float(x)), where) for x in rows["score"]]
    if not gold:
        return None
    return STSData(name, list(rows["sentence1"]), list(rows["sentence2"]), np.asarray(gold))


def read_sick(path: str | Path) -> STSData:
    """SICK_test_annotated.txt: header, then pair_ID, sentence_A, sentence_B, relatedness_score, ..."""
    lines = _read_lines(Path(path))
    s1, s2, gold = [], [], []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 4:
            raise DataError(f"{path}:{lineno}: expected >= 4 tab-separated columns (SICK format)")
        s1.append(cols[1])
        s2.append(cols[2])
        gold.append(gold_score(cols[3], f"{path}:{lineno}", low=1.0))
    return STSData("SICKRelatedness", s1, s2, np.asarray(gold))


def load_task(senteval_dir: str | Path, task: str) -> STSData:
    root = Path(senteval_dir)
    if not root.is_dir():
        raise DataError(f"SentEval directory not found: {root}; {SENTEVAL_HINT}")
    task = canonical_task(task)
    if task in STS_YEARS:
        return read_sts_year(root, task)
    if task == "STSBenchmark":
        return read_stsb(root / STSB_TEST)
    return read_sick(root / SICK_TEST)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.clip(np.linalg.norm(a, axis=1, keepdims=True), 1e-12, None)
    b = b / np.clip(np.linalg.norm(b, axis=1, keepdims=True), 1e-12, None)
    return np.sum(a * b, axis=1)


def spearman100(pred: np.ndarray, gold: np.ndarray) -> float:
    from scipy.stats import spearmanr  # ~0.5 s of imports, paid only where a score is computed

    return float(spearmanr(pred, gold).statistic * 100.0)


def embed_unique(embed: EmbedFn, datasets: Iterable[STSData]) -> dict[str, np.ndarray]:
    """Embed every distinct sentence of all datasets exactly once."""
    unique = sorted({s for d in datasets for s in (*d.sent1, *d.sent2)})
    vectors = embed(unique)
    return {s: vectors[i] for i, s in enumerate(unique)}


def similarities(data: STSData, table: dict[str, np.ndarray], precision: str = "float32") -> np.ndarray:
    """Each pair's cosine; at another ``precision``, its similarity quantized (:mod:`raycse.evaluation.quantized`)."""
    a = np.stack([table[s] for s in data.sent1])
    b = np.stack([table[s] for s in data.sent2])
    if precision == "float32":
        return cosine_rows(a, b)
    from raycse.evaluation.quantized import sts_similarities

    return sts_similarities(a, b, precision)


def evaluate_datasets(embed: EmbedFn, datasets: Sequence[STSData], precision: str = "float32") -> dict[str, float]:
    """Spearman x100 per dataset plus their mean ("avg"), the embeddings quantized at ``precision``."""
    return evaluate_precisions(embed, datasets, [precision])[precision]


def evaluate_precisions(embed: EmbedFn, datasets: Sequence[STSData], precisions: Sequence[str]) -> dict[str, dict]:
    """:func:`evaluate_datasets` at each of ``precisions``, every sentence embedded once."""
    datasets = list(datasets)
    table = embed_unique(embed, datasets)
    out = {}
    for precision in precisions:
        scores = {d.name: spearman100(similarities(d, table, precision), d.gold) for d in datasets}
        if len(scores) > 1:
            scores["avg"] = float(np.mean(list(scores.values())))
        out[precision] = scores
    return out


def evaluate_senteval(embed: EmbedFn, senteval_dir: str | Path, tasks: Optional[Sequence[str]] = None) -> dict[str, float]:
    names = [canonical_task(t) for t in (tasks or TASKS)]
    return evaluate_datasets(embed, [load_task(senteval_dir, t) for t in names])


def embedded_once(embed: EmbedFn) -> EmbedFn:
    """``embed`` remembering its answer for each list of texts (scoring several prefix sizes of the
    same vectors embeds them once)."""
    seen: dict = {}

    def once(xs):
        key = tuple(xs)
        if key not in seen:
            seen[key] = embed(xs)
        return seen[key]

    return once


def format_widths(by_width: dict[int, dict[str, float]]) -> str:
    """Each task's score (rows) at each embedding width (columns, widest first)."""
    return format_columns({w: by_width[w] for w in sorted(by_width, reverse=True)}, "dims")


def format_columns(columns: dict, corner: str, digits: int = 2) -> str:
    """Each row's score (rows: the first column's keys) in each column (``columns``: name -> row -> score)."""
    names = list(next(iter(columns.values())))
    first = max(len(n) for n in [*names, corner])
    width = max(6, *(len(str(c)) for c in columns))
    head = f"{corner:<{first}}" + "".join(f"  {c:>{width}}" for c in columns)
    return "\n".join([head] + [f"{n:<{first}}" + "".join(f"  {col[n]:{width}.{digits}f}" for col in columns.values())
                               for n in names])


def format_table(scores: dict[str, float]) -> str:
    names = list(scores)
    width = max(len(n) for n in names)
    return "\n".join(f"{n:<{width}}  {scores[n]:6.2f}" for n in names)
