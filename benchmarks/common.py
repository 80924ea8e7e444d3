"""Helpers shared by the benchmark scripts (paths to the shared data, the embedded model)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RAYCSE_SHARED", ROOT.parent / "shared"))
WIKI = SHARED / "data" / "wiki_sample.txt"
STSB_DEV = SHARED / "data" / "stsbenchmark" / "sts-dev.csv"
STSB_TRAIN = SHARED / "data" / "stsbenchmark" / "sts-train.csv"


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, threads {torch.get_num_threads()}"


def first_sentences(n: int, path: Path = WIKI) -> list[str]:
    from raycse.data.corpus import read_corpus

    texts, _ = read_corpus(str(path), max_sentences=n)
    return texts
