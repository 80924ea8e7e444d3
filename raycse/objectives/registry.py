"""Name -> objective class, so configs, the CLI and search spaces can name objectives."""

from __future__ import annotations

import dataclasses
import typing

from raycse.conversion import coerce
from raycse.errors import ConfigError

_OBJECTIVES: dict[str, type] = {}
# Knob names that changed (one name per knob everywhere: flags, YAML, search spaces, code)
RENAMED = {"temperature": "tau", "trainable_temperature": "trainable_tau", "temperature_lr": "tau_lr"}


def register(cls):
    _OBJECTIVES[cls.name] = cls
    return cls


def _load_builtin() -> None:
    # Imported for their @register side effect.
    from raycse.objectives import bsc, compcse, hicl, laser, sgopt, simcse  # noqa: F401


def names() -> list[str]:
    _load_builtin()
    return sorted(_OBJECTIVES)


def get(name: str):
    _load_builtin()
    if name not in _OBJECTIVES:
        raise ConfigError(f"unknown objective '{name}'; choose one of: {', '.join(sorted(_OBJECTIVES))}")
    return _OBJECTIVES[name]


def knobs(name: str) -> dict[str, typing.Any]:
    """The objective's knob names and defaults."""
    cls = get(name)
    return {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(cls.Params)}


def build_params(name: str, raw: dict | None):
    """Validate ``raw`` against the objective's params dataclass (unknown keys, types, ranges)."""
    cls = get(name)
    raw = dict(raw or {})
    fields = {f.name: f for f in dataclasses.fields(cls.Params)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        renamed = "".join(f" ('{u}' is now '{RENAMED[u]}')" for u in unknown if u in RENAMED)
        raise ConfigError(
            f"objective '{name}' has no knob {', '.join(repr(u) for u in unknown)}{renamed}; "
            f"its knobs are: {', '.join(sorted(fields)) or '(none)'}"
        )
    hints = typing.get_type_hints(cls.Params)
    values = {k: coerce(f"objective.{k}", v, hints[k]) for k, v in raw.items()}
    params = cls.Params(**values)
    params.validate()
    return params


def build(name: str, raw: dict | None):
    return get(name)(build_params(name, raw))
