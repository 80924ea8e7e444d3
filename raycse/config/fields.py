"""What every config part is made of: fields that are also flags (:func:`knob`, :func:`setting`), the
freezing of a resolved run (:class:`Section`) and the checks that name a key and its accepted values."""

from __future__ import annotations

import dataclasses
from dataclasses import field

from raycse.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def knob(default, flag: str, help: str):
    """A config field that is also a ``raycse train`` flag: one name, one default, one help text
    (the CLI builds the flag from this, :func:`flag_fields`). A mapping's default is built anew for
    each config (``{}``)."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"flag": flag, "help": help})
    return field(default=default, metadata={"flag": flag, "help": help})


def setting(default, flag: str, help: str, to_value=None, flag_default=None, **argparse_kw):
    """A command's setting that is also its flag (``raycse tune``, ``raycse mine``): one name, one default,
    one help text, from which the CLI builds the flag (:func:`raycse.cli.add_setting_flags`).
    ``argparse_kw``: how the flag reads (type, choices, action, metavar); ``to_value``: the setting from
    the flag's value where they differ (``--seeds 3`` -> [0, 1, 2]), with ``flag_default`` as the flag's
    default. A list default is built anew for each settings object."""
    meta = {"flag": flag, "help": help, "argparse": argparse_kw, "to_value": to_value, "flag_default": flag_default}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def detail(default, help: str):
    """A config field without a flag of its own, set in the YAML or with ``--set KEY=VALUE``: one default and one
    help text, which ``raycse train --help`` lists (:func:`raycse.config.run.unflagged_fields`). A mapping's or
    list's default is built anew for each config."""
    if isinstance(default, (dict, list)):
        kind = type(default)
        return field(default_factory=lambda: kind(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


class Section:
    """A part of a run config: set freely while the run is built (YAML, flags, ``--set``), frozen in the
    resolved run (:meth:`RunConfig.resolved`) that a fit trains, which nothing changes afterwards."""

    def __setattr__(self, name: str, value) -> None:
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(
                f"cannot set {type(self).__name__}.{name}: the resolved run is frozen; make a changed one with "
                f"run.resolved({{'section.{name}': value}})")
        object.__setattr__(self, name, value)


def one_of(key: str, value: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(allowed)}; got {value!r}")


def at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key} must be >= {low}, got {value}")
