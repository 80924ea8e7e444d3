"""The model card (``README.md``) a saved model directory carries, in the Hugging Face card layout.

Written from what the run recorded (its resolved config and its ``metrics.json`` summary), so it
says what produced the model: base model, objective and knobs, data and its counts, steps, dev
scores before and after, the raycse version, and how to load it. Torch-free: ``raycse analyze
--export-best`` writes one too, with the search's best configuration and its seeds.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Optional

from raycse._version import __version__

PAPERS = {  # as the README's objectives table cites them
    "simcse": "SimCSE, Gao et al. 2021",
    "hicl": "HiCL, Wu et al. 2023",
    "compcse": "CompCSE, Chanchani & Huang 2023",
    "sgopt": "SG-OPT, Kim et al. 2021",
    "laser": "LA(SER)^3, Xiao et al. 2023",
    "bsc": "batch-softmax contrastive loss, Chernyavskiy et al. 2022",
}
LOSSES = {  # one line per objective: what the model was trained to minimise
    "simcse": "InfoNCE between two dropout views of each sentence, in-batch negatives",
    "hicl": "alpha x segment-level InfoNCE + beta x segment-to-sequence InfoNCE + (1 - alpha - beta) x the base "
            "objective's loss on length-weighted segment means",
    "compcse": "InfoNCE with the composition of the sentence's two halves as its positive",
    "sgopt": "L_opt3: the trained encoder's vector against every pooled hidden layer of a frozen copy, plus "
             "lambda x the distance of the weights to the copy",
    "laser": "InfoNCE between a sentence and its elongation (copied m times)",
    "bsc": "symmetric batch-softmax contrastive loss on pairs, mu-weighted with MSE on the scores",
}
CITATIONS = {
    "simcse": """@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing},
  year = {2021}
}""",
    "hicl": """@inproceedings{wu2023hicl,
  title = {{HiCL}: Hierarchical Contrastive Learning of Unsupervised Sentence Embeddings},
  author = {Wu, Zhuofeng and Xiao, Chaowei and Vydiswaran, V. G. Vinod},
  booktitle = {Findings of the Association for Computational Linguistics: EMNLP 2023},
  year = {2023}
}""",
    "compcse": """@inproceedings{chanchani2023composition,
  title = {Composition-contrastive Learning for Sentence Embeddings},
  author = {Chanchani, Sachin and Huang, Ruihong},
  booktitle = {Proceedings of the 61st Annual Meeting of the Association for Computational Linguistics},
  year = {2023}
}""",
    "sgopt": """@inproceedings{kim2021selfguided,
  title = {Self-Guided Contrastive Learning for {BERT} Sentence Representations},
  author = {Kim, Taeuk and Yoo, Kang Min and Lee, Sang-goo},
  booktitle = {Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics},
  year = {2021}
}""",
    "laser": """@inproceedings{xiao2023length,
  title = {Length is a Curse and a Blessing for Document-level Semantics},
  author = {Xiao, Chenghao and Li, Yizhi and Hudson, G. Thomas and Lin, Chenghua and Al Moubayed, Noura},
  booktitle = {Proceedings of the 2023 Conference on Empirical Methods in Natural Language Processing},
  year = {2023}
}""",
    "bsc": """@inproceedings{chernyavskiy2022batch,
  title = {Batch-Softmax Contrastive Loss for Pairwise Sentence Scoring Tasks},
  author = {Chernyavskiy, Anton and Ilvovsky, Dmitry and Kalinin, Pavel and Nakov, Preslav},
  booktitle = {Proceedings of the 2022 Conference of the North American Chapter of the Association for
               Computational Linguistics: Human Language Technologies},
  year = {2022}
}""",
}
FRAMEWORKS = ("raycse", "torch", "transformers", "sentence-transformers", "ray", "tokenizers")


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
        *(_sources(summary["sources"]) if summary.get("sources") else [
            f"- **Data:** `{data.get('corpus')}` (format {data.get('format')}): {summary.get('num_examples', '?')} "
            f"training examples ({counts})"]),
        f"- **Steps:** {steps} of batch {train['batch_size']} x {train['num_workers']} worker(s), "
        f"{train['epochs']} epoch(s), lr {train['lr']}, warm-up {train['warmup_ratio']}, precision "
        f"{train['precision']}, seed {train['seed']}; batch order `{run['grouping']['strategy']}`",
        f"- **Pooling:** {run['model']['pooling']}, max length {run['model']['max_length']} tokens in training",
        *_references(run),
        "",
    ]


def _sources(sources: list) -> list[str]:
    """A mixture's lines: each source's corpus, rows, objective, share of the steps and the steps it got (its
    prompts, where it has them, are the model's prompts named after it)."""
    return [f"- **Data:** a mixture of {len(sources)} sources, each batch from one:"] + [
        f"  - `{s['name']}`: `{s['corpus']}`, {s['rows']} examples, objective `{s['objective']}`, "
        f"{s['share']:.0%} of the steps ({s['steps']} trained)" for s in sources]


def _references(run: dict) -> list[str]:
    """The teacher it was distilled from and the guide that masked its negatives, where the run had them."""
    model, obj = run.get("model") or {}, run.get("objective") or {}
    lines = []
    if model.get("teacher") and (obj.get("distill_weight", 1.0) or 0) > 0:
        lines.append(f"- **Teacher:** `{model['teacher']}`, distilled with `{obj.get('distill', 'kl')}` at weight "
                     f"{obj.get('distill_weight', 1.0)} (its embeddings of every training sentence, computed once)")
    if model.get("guide"):
        guide = "the starting model" if model["guide"] == "initial" else f"`{model['guide']}`"
        lines.append(f"- **Guide:** {guide} (GISTEmbed): in-batch negatives it scores above the positive minus "
                     f"margin {obj.get('guide_margin', 0.0)} were left out of the loss")
    return lines


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _modules(files: Path) -> list[str]:
    """The model's sentence-transformers modules in order, each with what it does."""
    out = []
    for m in _read_json(files / "modules.json") or []:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        cfg = _read_json(files / m.get("path", "") / "config.json") if m.get("path") else {}
        if kind == "Pooling":
            from raycse.errors import ModelError
            from raycse.model.st_format import pooling_of

            try:  # (either config form: sentence-transformers 6's pooling_mode or the legacy booleans)
                mode = pooling_of(cfg, files / m.get("path", ""))
            except ModelError:
                mode = "?"
            kind += f" ({mode}, {_pooled_width(cfg) or '?'} dimensions)"
        elif kind == "Dense":
            act = str(cfg.get("activation_function", "")).rsplit(".", 1)[-1]
            kind += f" ({cfg.get('in_features', '?')} -> {cfg.get('out_features', '?')}, {act or 'identity'})"
        elif kind == "Transformer":
            arch = _read_json(files / "config.json")
            kind += f" ({arch.get('model_type', '?')}, {arch.get('num_hidden_layers', '?')} layers, hidden " \
                    f"{arch.get('hidden_size', '?')})"
        out.append(kind)
    return out


def _output_dim(files: Path) -> Optional[int]:
    """The sentence vector's size: the last Dense's output, else the pooled width."""
    dim = None
    for m in _read_json(files / "modules.json") or []:
        cfg = _read_json(files / m.get("path", "") / "config.json") if m.get("path") else {}
        dim = cfg.get("out_features", _pooled_width(cfg) or dim)
    return dim


def _pooled_width(cfg: dict) -> Optional[int]:
    """A Pooling config's width: ``embedding_dimension`` in sentence-transformers 6, ``word_embedding_dimension`` before."""
    return cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))


def _max_length(files: Path) -> Optional[int]:
    """The longest input the model reads: raycse's own record, else the Transformer module's config
    (sentence-transformers 5), else the tokenizer's ``model_max_length`` (where 6 keeps it)."""
    for name, key in (("raycse.json", "max_seq_length"), ("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):
        value = _read_json(files / name).get(key)
        if value:
            return value
    return None


def _model(files: Optional[Path]) -> list[str]:
    """What the saved model is, from its own files (the card says what a user loads)."""
    if files is None or not (files / "modules.json").is_file():
        return []
    st = _read_json(files / "config_sentence_transformers.json")
    rows = [("Modules", " -> ".join(_modules(files))), ("Output dimension", _output_dim(files)),
            ("Maximum sequence length", _max_length(files)),
            ("Similarity function", st.get("similarity_fn_name") or "cosine")]
    return ["## Model", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]


def _hyperparameters(run: dict, summary: dict) -> list[str]:
    train, obj = run["train"], run["objective"]
    last = summary.get("last") or {}
    rows = [("objective", f"`{obj['name']}`: {LOSSES.get(obj['name'], '')}"),
            ("batch size per worker x workers", f"{train['batch_size']} x {train['num_workers']}"),
            ("steps", last.get("step", "?")), ("epochs", train["epochs"]), ("learning rate", train["lr"]),
            ("warm-up ratio", train["warmup_ratio"]), ("weight decay", train["weight_decay"]),
            ("max gradient norm", train["max_grad_norm"]), ("precision", train["precision"]),
            ("seed", train["seed"]), ("batch order", run["grouping"]["strategy"]),
            ("pooling", run["model"]["pooling"]), ("max length in training", run["model"]["max_length"])]
    params = summary.get("objective_knobs") or obj.get("params", {})
    rows += [(f"objective.{k}", v) for k, v in sorted(params.items())]
    return ["### Training hyperparameters", "", "| name | value |", "|---|---|",
            *[f"| {k} | {v} |" for k, v in rows], ""]


def _versions() -> list[str]:
    from importlib import metadata

    rows = [("Python", platform.python_version())]
    for name in FRAMEWORKS:
        try:
            rows.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    return ["## Framework versions", "", *[f"- {k}: {v}" for k, v in rows], ""]


def _citation(run: dict) -> list[str]:
    name = run["objective"]["name"]
    cited = [name] + ([run["objective"].get("params", {}).get("base", "simcse")] if name == "hicl" else [])
    entries = [CITATIONS[n] for n in dict.fromkeys(cited) if n in CITATIONS]
    if not entries:
        return []
    return ["## Citation", "", "```bibtex", "\n\n".join(entries), "```", ""]


def _scores(summary: dict) -> list[str]:
    best, last = summary.get("best") or {}, summary.get("last") or {}
    key = summary.get("score_key", "stsb_dev_spearman")
    if key.startswith("stsb_dev_spearman"):  # stsb_dev_spearman_binary: on binary embeddings
        quantized = key[len("stsb_dev_spearman_"):]
        label = "STS-B dev Spearman x100" + (f" ({quantized} embeddings)" if quantized else "")
    else:  # beir_ndcg@10 -> BEIR ndcg@10; mteb_STS12 -> MTEB STS12 (mteb's main score)
        kind, _, name = key.partition("_")
        label = f"{kind.upper()} {name} x100 (model selection)"
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


def _prompts(run: dict) -> list[str]:
    """How to embed with the prompts the model was trained with (data.prompts)."""
    prompts = (run.get("data") or {}).get("prompts") or {}
    if not prompts:
        return []
    lines = ["## Prompts", "", "Trained with a prompt before each sentence; sentence-transformers puts it there itself:", ""]
    if "text" in prompts:
        lines.append(f"- `{prompts['text']}`: the prompt `query`: `model.encode_query(...)` uses it, and "
                     f"`model.encode(...)` too unless the base model named another default prompt.")
    if "pair" in prompts:
        lines.append(f"- `{prompts['pair']}`: the prompt `document`: `model.encode_document(...)` uses it.")
    return lines + ["", "With transformers alone, put the prompt before each sentence yourself.", ""]


def _matryoshka(run: dict) -> list[str]:
    """How to serve the shorter embeddings it was trained for (objective.matryoshka_dims)."""
    dims = (run.get("objective") or {}).get("matryoshka_dims")
    if not dims:
        return []
    smallest = min(int(d) for d in dims)
    return ["## Shorter embeddings (Matryoshka)", "",
            f"Trained so that the first {', '.join(str(d) for d in sorted(dims, reverse=True))} coordinates, "
            f"re-normalised, are embeddings of their own:", "",
            "```python", f"model = SentenceTransformer(path, truncate_dim={smallest})", "```", "",
            "`raycse eval` scores each of these sizes.", ""]


def _adapter(run: dict) -> list[str]:
    """What LoRA training left beside the merged weights (model.lora)."""
    lora = (run.get("model") or {}).get("lora")
    if not lora:
        return []
    from raycse.model.adapters import ADAPTER_DIR, lora_settings

    s = lora_settings(lora)
    targets = ", ".join(s["target_modules"]) if s["target_modules"] else "peft's defaults for the model type"
    return ["## LoRA adapter", "",
            f"Trained as LoRA adapters (r={s['r']}, alpha={s['alpha']:g}, dropout={s['dropout']:g}, on {targets}) over "
            f"frozen base weights. The weights here are merged (W + alpha/r BA); the adapter alone is in "
            f"`{ADAPTER_DIR}/`:", "",
            "```python", "from peft import PeftModel", "from transformers import AutoModel", "",
            "from raycse.model.loading import resolve_model", "",
            f'base = AutoModel.from_pretrained(resolve_model("{run["model"]["name_or_path"]}"))  # the base model',
            f'model = PeftModel.from_pretrained(base, "{ADAPTER_DIR}")', "```", ""]


def _usage(name: str, pooling: str) -> list[str]:
    pool = ("out.last_hidden_state[:, 0]" if pooling != "mean" else
            "(out.last_hidden_state * mask).sum(1) / mask.sum(1)")
    fetch = []
    if "://" in name:  # on object storage: raycse fetches it once into a local cache (by its manifest)
        fetch = ["from raycse.model.loading import resolve_model", "", f'path = resolve_model("{name}")', ""]
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


def _remote_code(run: dict) -> list[str]:
    """Said where the run trusted its base model's own code: whoever loads this model runs that code too."""
    if not run["model"].get("trust_remote_code"):
        return []
    return ["**Runs code of its own.** The base model was loaded with `trust_remote_code` (its configs' `auto_map`), "
            "so loading this model runs that code too: `SentenceTransformer(path, trust_remote_code=True)`, "
            "`AutoModel.from_pretrained(path, trust_remote_code=True)`, `raycse eval path --trust-remote-code`. "
            "Read the code first.", ""]


def model_card(run: dict, summary: dict, model_dir, search: Optional[dict] = None,
               files: Optional[Path] = None) -> str:
    """The card's text. ``run``: the resolved config as a dict; ``summary``: the run's metrics.json;
    ``search``: experiment, target, config, seeds, seed_scores, exported_seed (for --export-best);
    ``model_dir``: the name the card shows; ``files``: the saved model's directory, read for its
    modules, output dimension, maximum length and similarity function."""
    name = str(model_dir)
    lines = _front_matter(run)
    parts = name.rstrip("/").split("/")
    title = parts[-2] if parts[-1] == "model" and len(parts) > 1 else parts[-1]  # OUTPUT/model -> OUTPUT
    lines += [f"# {title or name}", "",
              f"A sentence-embedding model fine-tuned with raycse {__version__} from "
              f"`{run['model']['name_or_path']}` (`default` = the embedded all-MiniLM-L6-v2).", ""]
    lines += _remote_code(run)
    lines += _model(files) + _training(run, summary) + _hyperparameters(run, summary) + _scores(summary)
    if search:
        lines += _search(search)
    lines += _usage(name, run["model"]["pooling"]) + _prompts(run) + _matryoshka(run) + _adapter(run)
    lines += _versions() + _citation(run)
    return "\n".join(lines)


EXPORT_HEADING = "## Exported files"


def export_section(record: dict) -> list[str]:
    """The card's part about ``raycse export``'s files (``record``: its ``raycse_export.json``): each file with
    its size, how to load it, how close it embeds to the PyTorch model, and its STS-B dev score where taken."""
    lines = [EXPORT_HEADING, "", "Written by `raycse export` (PyTorch's own ONNX exporter, opset 18; the transformer's "
             "graph only: pooling, Dense, normalisation and prompts are this folder's modules, as for PyTorch).", "",
             "| file | MB | export s | largest difference | smallest cosine | STS-B dev |", "|---|---|---|---|---|---|"]
    scores = record.get("stsb_dev") or {}
    if scores:
        lines.append(f"| PyTorch (model.safetensors) | | | | | {_score(scores['pytorch'].get('float32'))} |")
    for row, files in record["files"].items():
        check = record["checks"].get(row, {})
        size = sum(files.values()) / 1e6
        lines.append(f"| {', '.join(f'`{f}`' for f in files)} | {size:.1f} | {record['seconds'].get(row, '')} | "
                     f"{check.get('max_abs_diff', 0):.1e} | {check.get('min_cosine', 1):.6f} | "
                     f"{_score(scores[row].get('float32')) if scores else ''} |")
    lines += ["", f"Differences are to the PyTorch model's embeddings of sample sentences at several batch sizes; "
              f"every float32 file is within {record['tolerance']:g}.", ""]
    lines += _precision_scores(scores)
    lines += ["```bash", "raycse eval . --backend onnx --stsb-dev auto            # onnx/model.onnx in onnxruntime"]
    if any("qint8" in f for files in record["files"].values() for f in files):
        lines.append("raycse eval . --backend onnx --onnx-file model_qint8.onnx --stsb-dev auto")
    if "openvino" in record["files"]:
        lines.append("raycse eval . --backend openvino --stsb-dev auto        # openvino/openvino_model.xml")
    lines += ["```", "", "```python", "from raycse import Encoder", "",
              'model = Encoder.from_pretrained(".", backend="onnx")  # or backend="openvino"',
              'embeddings = model.encode(["A man is playing a guitar."])', "```", "",
              "The files follow sentence-transformers' backend layout, but `SentenceTransformer(path, backend=\"onnx\")` "
              "needs optimum, which does not yet support transformers 5: that route is not claimed here.", ""]
    return lines


def _precision_scores(scores: dict) -> list[str]:
    """The export's STS-B dev scores (``scores``: where it runs -> embedding precision -> score) as a table."""
    if not scores:
        return []
    precisions = list(scores["pytorch"])
    return ["STS-B dev Spearman x100 with the embeddings quantized as an index keeps them (sentence-transformers' "
            "`quantize_embeddings`; int8/uint8 calibrated on the dev set's sentences; bits by Hamming similarity):", "",
            "| runs in | " + " | ".join(precisions) + " |", "|---" * (len(precisions) + 1) + "|",
            *(f"| {row} | " + " | ".join(_score(by[p]) for p in precisions) + " |" for row, by in scores.items()), ""]
