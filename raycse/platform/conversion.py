"""Typed conversion of YAML and command-line values: the ground floor that the config and the
objectives' knobs both use (so neither imports the other for it)."""

from __future__ import annotations

import math
import typing
from typing import Any

from raycse.errors import ConfigError


def coerce(key: str, value: Any, hint: Any) -> Any:
    """Convert a YAML/CLI value to the field's declared type, or fail naming the key."""
    optional = False
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0]
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{key} must not be empty")
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
                return value.strip().lower() in ("true", "yes", "1", "on")
            raise ValueError
        if hint is int:
            if isinstance(value, bool):
                raise ValueError
            f = float(value)
            if f != int(f):
                raise ValueError
            return int(f)
        if hint is float:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not math.isfinite(number):  # inf/nan pass every "> 0" check and fail steps later
                raise ConfigError(f"{key} must be a finite number, got {shown(value)}")
            return number
        if hint is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
        if hint is dict:
            return _mapping(key, value)
        if hint is list:
            return _sequence(key, value)
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key} must be {getattr(hint, '__name__', hint)}, got {shown(value)}") from None
    return value


MAPPING_EXAMPLES = {"data.prompts": '{text: "query: "}', "model.lora": "{r: 8, alpha: 16}"}  # for the refusal


def _mapping(key: str, value: Any) -> dict:
    """A mapping from YAML, or from a flag's YAML text (braces optional: ``text: "q: "``)."""
    if isinstance(value, str):
        import yaml

        from raycse.platform import safe_yaml

        text = value.strip()
        try:
            value = safe_yaml.load(text if text.startswith("{") else "{" + text + "}") if text else {}
        except (yaml.YAMLError, RecursionError):
            example = MAPPING_EXAMPLES.get(key, "{name: value}")
            raise ConfigError(f"{key} must be a YAML mapping such as '{example}', got {shown(value)}") from None
    if not isinstance(value, dict):
        raise ValueError
    return dict(value)


def _sequence(key: str, value: Any) -> list:
    """A list from YAML, or from a flag's text: ``384,256,128`` or ``[384, 256, 128]``."""
    if isinstance(value, str):
        import yaml

        from raycse.platform import safe_yaml

        text = value.strip()
        try:
            value = safe_yaml.load(text if text.startswith("[") else "[" + text + "]")
        except (yaml.YAMLError, RecursionError):
            raise ConfigError(f"{key} must be a list such as 384,256,128, got {shown(value)}") from None
    if not isinstance(value, (list, tuple)):
        raise ValueError
    return list(value)


def shown(value: Any, limit: int = 80) -> str:
    """``value`` as an error message quotes it: its repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def env_seconds(variable: str, default: float) -> float:
    """A wait's bound in seconds from the environment variable ``variable`` (``default`` where unset);
    anything but a finite number > 0 is one line naming the variable."""
    import os

    value = os.environ.get(variable, str(default))
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"{variable} must be a number of seconds > 0, got {value!r}")
    return seconds
