"""The model card (``README.md``) a saved model directory carries, in the Hugging Face card layout.

Written from what the run recorded (its resolved config and its ``metrics.json`` summary), so it
says what produced the model: base model, objective and knobs, data and its counts, steps, dev
scores before and after, the raycse version, and how to load it. Torch-free: ``raycse analyze
--export-best`` writes one too, with the search's best configuration and its seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from raycse._version import __version__

PAPERS = {  # as the README's objectives table cites them
    "simcse": "SimCSE, Gao et al. 2021",
    "hicl": "HiCL, Wu et al. 2023",
    "compcse": "CompCSE, Chanchani & Huang 2023",
    "sgopt": "SG-OPT, Kim et al. 2021",
    "laser": "LA(SER)^3, Xu et al. 2023",
    "bsc": "batch-softmax contrastive loss, Chernyavskiy et al. 2021",
}


def _score(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "not scored"


def _front_matter(run: dict) -> list[str]:
    base = str(run["model"]["name_or_path"])
    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity", "tags:",
             "- sentence-transformers", "- sentence-similarity", "- feature-extraction", "- raycse",
             f"- {run['objective']['name']}"]
    if base == "default":
        lines.append("base_model: sentence-transformers/all-MiniLM-L6-v2")
    elif "/" in base and not base.startswith(("/", ".", "~")) and "://" not in base:
        lines.append(f"base_model: {base}")  # a hub name
    return lines + ["---", ""]


def _training(run: dict, summary: dict) -> list[str]:
    obj, train, data = run["objective"], run["train"], run["data"]
    params = summary.get("objective_knobs") or obj.get("params", {})  # all knobs, defaults included
    knobs = ", ".join(f"`{k}={v}`" for k, v in sorted(params.items())) or "its defaults"
    corpus = summary.get("corpus", {})
    counts = ", ".join(f"{k} {v}" for k, v in corpus.items() if v)
    last = summary.get("last") or {}
    steps = last.get("step", "?")
    return [
        "## Training", "",
        f"- **Objective:** `{obj['name']}` ({PAPERS.get(obj['name'], 'see raycse objectives')}), knobs {knobs}",
        f"- **Data:** `{data.get('corpus')}` (format {data.get('format')}): {summary.get('num_examples', '?')} "
        f"training examples ({counts})",
        f"- **Steps:** {steps} of batch {train['batch_size']} x {train['num_workers']} worker(s), "
        f"{train['epochs']} epoch(s), lr {train['lr']}, warm-up {train['warmup_ratio']}, precision "
        f"{train['precision']}, seed {train['seed']}; batch order `{run['grouping']['strategy']}`",
        f"- **Pooling:** {run['model']['pooling']}, max length {run['model']['max_length']} tokens in training",
        "",
    ]


def _scores(summary: dict) -> list[str]:
    best, last = summary.get("best") or {}, summary.get("last") or {}
    key = summary.get("score_key", "stsb_dev_spearman")
    label = "STS-B dev Spearman x100" if key == "stsb_dev_spearman" else f"BEIR {key[5:]} x100 (model selection)"
    before = best.get(f"{key}_initial", last.get(f"{key}_initial"))
    return [
        "## Scores", "",
        f"| {label} | value |", "|---|---|",
        f"| before training | {_score(before)} |",
        f"| this model (step {best.get('step', last.get('step', '?'))}) | {_score(best.get(key))} |",
        f"| last step ({last.get('step', '?')}) | {_score(last.get(key))} |",
        "",
    ]


def _search(search: dict) -> list[str]:
    knobs = ", ".join(f"`{k}={v}`" for k, v in sorted(search["config"].items()))
    seeds = ", ".join(f"seed {s}: {v:.2f}" for s, v in zip(search["seeds"], search["seed_scores"]))
    return [
        "## Hyperparameter search", "",
        f"Best configuration of the Ray Tune experiment `{search['experiment']}` (target {search['target']}): "
        f"{knobs}.", "",
        f"Its seeds on STS-B dev: {seeds}; this directory is seed {search['exported_seed']}'s model.", "",
    ]


def _usage(name: str, pooling: str) -> list[str]:
    pool = ("out.last_hidden_state[:, 0]" if pooling != "mean" else
            "(out.last_hidden_state * mask).sum(1) / mask.sum(1)")
    fetch = []
    if "://" in name:  # on object storage: raycse fetches it once into a local cache (by its manifest)
        fetch = ["from raycse.encoder import resolve_model", "", f'path = resolve_model("{name}")', ""]
        name = "path"
    quoted = name if fetch else f'"{name}"'
    return [
        "## Usage", "",
        "```python", *fetch, "from sentence_transformers import SentenceTransformer", "",
        f"model = SentenceTransformer({quoted})",
        'embeddings = model.encode(["A man is playing a guitar.", "Someone plays music."])',
        "print(model.similarity(embeddings, embeddings))", "```", "",
        f"With transformers alone ({pooling} pooling):", "",
        "```python", "import torch", "from transformers import AutoModel, AutoTokenizer", "",
        f"tok, model = AutoTokenizer.from_pretrained({quoted}), AutoModel.from_pretrained({quoted})",
        'batch = tok(["A man is playing a guitar."], padding=True, truncation=True, return_tensors="pt")',
        "with torch.no_grad():", "    out = model(**batch)",
        'mask = batch["attention_mask"].unsqueeze(-1)',
        f"embedding = torch.nn.functional.normalize({pool}, dim=-1)", "```", "",
    ]


def model_card(run: dict, summary: dict, model_dir, search: Optional[dict] = None) -> str:
    """The card's text. ``run``: the resolved config as a dict; ``summary``: the run's metrics.json;
    ``search``: experiment, target, config, seeds, seed_scores, exported_seed (for --export-best)."""
    name = str(model_dir)
    lines = _front_matter(run)
    parts = name.rstrip("/").split("/")
    title = parts[-2] if parts[-1] == "model" and len(parts) > 1 else parts[-1]  # OUTPUT/model -> OUTPUT
    lines += [f"# {title or name}", "",
              f"A sentence-embedding model fine-tuned with raycse {__version__} from "
              f"`{run['model']['name_or_path']}` (`default` = the embedded all-MiniLM-L6-v2).", ""]
    lines += _training(run, summary) + _scores(summary)
    if search:
        lines += _search(search)
    lines += _usage(name, run["model"]["pooling"])
    return "\n".join(lines)


def write_model_card(model_dir: Path, run: dict, summary: dict, search: Optional[dict] = None) -> Path:
    path = Path(model_dir) / "README.md"
    path.write_text(model_card(run, summary, Path(model_dir), search))
    return path
