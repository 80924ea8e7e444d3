"""The sample corpus a first run trains on (the quickstart's), found through settings, never a neighbour folder.

In order: ``$RAYCSE_DATA/wiki_sample.txt`` where :data:`raycse.config.DATA_ENV` names a folder holding it;
else SimCSE's own training corpus, ``wiki1m_for_simcse.txt`` of the Hugging Face dataset
``princeton-nlp/datasets-for-simcse`` (1M Wikipedia sentences, 120 MB; the sample is its head), fetched
from the hub, or read from this machine's hub cache where the hub cannot be reached. Only its first
:data:`HUB_SENTENCES` sentences are used, so a first run takes as long either way.

``python -m raycse.data.sample`` prints the ``raycse train`` arguments that name it, one a line, or one
line saying what to pass and exit 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from raycse.config import DATA_ENV

SAMPLE_IN_DATA = "wiki_sample.txt"
HUB_REPO = "princeton-nlp/datasets-for-simcse"
HUB_FILE = "wiki1m_for_simcse.txt"
HUB_SENTENCES = 11915  # as many as wiki_sample.txt holds


def from_data_folder() -> Optional[str]:
    """``$RAYCSE_DATA/wiki_sample.txt``, or None where the setting is unset or its folder lacks the file."""
    root = os.environ.get(DATA_ENV)
    if not root:
        return None
    path = Path(os.path.expanduser(root)) / SAMPLE_IN_DATA
    return str(path) if path.is_file() else None


def from_hub() -> Optional[str]:
    """The local path of :data:`HUB_FILE`: downloaded (with the hub client's progress bar) where the hub can be
    reached, else from the hub cache; None where neither has it."""
    import importlib.util

    if importlib.util.find_spec("huggingface_hub") is None:
        return None
    from huggingface_hub import hf_hub_download

    from raycse.platform import hub

    with hub.cache_only_if_unreachable() as unreachable:
        try:
            return hf_hub_download(HUB_REPO, HUB_FILE, repo_type="dataset", local_files_only=bool(unreachable))
        except Exception:  # not cached, or the hub refused (the client raises several kinds): none here
            return None


def train_arguments() -> Optional[list[str]]:
    """``raycse train`` arguments naming the sample corpus, or None where there is none."""
    path = from_data_folder()
    if path is not None:
        return ["--corpus", path]
    path = from_hub()
    if path is None:
        return None
    print(f"[raycse] corpus: the first {HUB_SENTENCES:,} sentences of {HUB_FILE} (the Hugging Face dataset "
          f"{HUB_REPO}; no ${DATA_ENV}/{SAMPLE_IN_DATA} here)", file=sys.stderr)
    return ["--corpus", path, "--max-sentences", str(HUB_SENTENCES)]


def main() -> int:
    try:
        args = train_arguments()
    except KeyboardInterrupt:  # during the download: the hub client resumes its partial file on the next try
        print("raycse: interrupted (SIGINT): the sample corpus was not fetched; run again to resume", file=sys.stderr)
        return 130
    if args is None:
        print(f"raycse: no sample corpus here: pass a corpus of your own (a file of sentences), set {DATA_ENV} to a "
              f"folder holding {SAMPLE_IN_DATA}, or let this machine reach the Hugging Face hub once ({HUB_REPO})",
              file=sys.stderr)
        return 2
    print("\n".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
