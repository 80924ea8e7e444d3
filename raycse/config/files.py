"""Config and search-space files: the YAML raycse reads (one readable line for any failure) and the
recipes it ships (``--config simcse``, ``--space hicl``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from raycse.errors import ConfigError
from raycse.platform import safe_yaml
from raycse.platform.safe_yaml import YamlLoader, YamlTooLarge  # noqa: F401 - YamlLoader: raycse.config's name for it

# the package's folder: raycse/configs/*.yaml and raycse/search_spaces/*.yaml, shipped in the wheel
RECIPES = Path(__file__).resolve().parent.parent


def shipped(kind: str) -> list[str]:
    """The names of the recipes raycse ships of ``kind`` (configs or search_spaces), sorted."""
    return sorted(f.stem for f in (RECIPES / kind).glob("*.yaml"))


def recipe(kind: str, name_or_path: str) -> str:
    """A run config (``kind`` configs) or a search space (search_spaces): a path as given, else a
    recipe shipped with raycse by its name (``--config simcse``, ``--space hicl``)."""
    if Path(os.path.expanduser(name_or_path)).exists() or "/" in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        return name_or_path
    packaged = RECIPES / kind / f"{name_or_path}.yaml"
    if packaged.is_file():
        return str(packaged)
    names = ", ".join(shipped(kind))
    raise ConfigError(f"{name_or_path!r} is neither a file nor one of raycse's {kind.replace('_', ' ')}: {names}")


def load_yaml(path: str | os.PathLike) -> dict:
    """Read a YAML mapping, turning every failure into one readable line."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = safe_yaml.load(p.read_text(encoding="utf-8"))
    except YamlTooLarge as exc:
        raise ConfigError(f"{p} is refused: {exc}; a raycse config or search space needs a few aliases at most"
                          ) from None
    except RecursionError:
        raise ConfigError(f"{p} nests deeper than {MAX_YAML_DEPTH} levels; a raycse config or search space needs "
                          f"at most a few") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"malformed YAML in {p}{where}: {problem}; fix the syntax and retry") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not UTF-8 text") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping (section: {{key: value}}), got {type(data).__name__}")
    if depth(data) > MAX_YAML_DEPTH:
        raise ConfigError(f"{p} nests deeper than {MAX_YAML_DEPTH} levels; a raycse config or search space needs "
                          f"at most a few")
    return data


MAX_YAML_DEPTH = 16  # the deepest shipped file (a search space with conditional knobs) nests 6


def depth(value, limit: int = MAX_YAML_DEPTH + 1) -> int:
    """How deep ``value``'s mappings and lists nest, counted no further than ``limit`` (no recursion)."""
    deepest, level = 0, [value]
    while level and deepest < limit:
        level = [v for item in level if isinstance(item, (dict, list))
                 for v in (item.values() if isinstance(item, dict) else item)]
        deepest += 1
    return deepest


def parse_scalar(text: str) -> Any:
    """'0.1' -> 0.1, 'true' -> True, 'x' -> 'x' (for --set objective.knob=value)."""
    too_deep = ConfigError(f"the value {text[:40]}... nests deeper than {MAX_YAML_DEPTH} levels; give a plain value")
    try:
        value = safe_yaml.load(text)
    except YamlTooLarge as exc:
        raise ConfigError(f"the value {text[:40]}... is refused: {exc}; give a plain value") from None
    except yaml.YAMLError:
        return text
    except RecursionError:
        raise too_deep from None
    if depth(value) > MAX_YAML_DEPTH:
        raise too_deep
    return value
