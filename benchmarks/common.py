"""Helpers shared by the benchmark scripts (paths to the shared data, the embedded model)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RAYCSE_SHARED", ROOT.parent / "shared"))
WIKI = SHARED / "data" / "wiki_sample.txt"
STSB_DEV = SHARED / "data" / "stsbenchmark" / "sts-dev.csv"
STSB_TRAIN = SHARED / "data" / "stsbenchmark" / "sts-train.csv"


def refuse(message: str) -> NoReturn:
    """A bad argument (or a file not ready): one line on stderr, named after the script run, and exit 2,
    as argparse does."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def cpu() -> str:
    """The CPU model and the ISA flags that decide kernel choice (and any ISA cap in force)."""
    from raycse.platform.machine import describe

    return describe()


def machine() -> str:
    return f"{cpu()}, torch {torch.__version__}, threads {torch.get_num_threads()}"


def first_sentences(n: int, path: Path = WIKI) -> list[str]:
    from raycse.data.corpus import read_corpus

    texts, _ = read_corpus(str(path), max_sentences=n)
    return texts


def train_run(out: str, settings: dict):
    """Train raycse with ``settings`` (dotted config keys), scoring STS-B dev only before and after, then
    stop Ray so that whatever runs next in this process has the cores to itself."""
    import ray

    from raycse.config import RunConfig, set_dotted
    from raycse.train.driver import train

    cfg = RunConfig()
    cfg.eval.stsb_dev = str(STSB_DEV)
    cfg.eval.eval_steps = 10**9
    for key, value in settings.items():
        set_dotted(cfg, key, value, _from_yaml=True)
    cfg.output_dir = out
    result = train(cfg, overwrite=True)
    ray.shutdown()
    return result


def add_recipe_args(ap) -> None:
    """The SimCSE recipe the throughput benchmarks share with their sentence-transformers peer."""
    ap.add_argument("--sentences", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-5)
