"""A table of objectives by name, and the base objectives HiCL can wrap.

On the floor between the method files and :mod:`raycse.objectives.registry`: HiCL builds its base
from :data:`BASES` here, and the registry adds HiCL to them, so no objective imports the module
that imports it."""

from __future__ import annotations

import dataclasses
import typing

from raycse.errors import ConfigError
from raycse.objectives.bsc import BSC
from raycse.objectives.compcse import CompCSE
from raycse.objectives.laser import Laser
from raycse.objectives.sgopt import SGOPT
from raycse.objectives.simcse import SimCSE
from raycse.platform.conversion import coerce

# Knob names that changed (one name per knob everywhere: flags, YAML, search spaces, code)
RENAMED = {"temperature": "tau", "trainable_temperature": "trainable_tau", "temperature_lr": "tau_lr"}


class Catalog:
    """Name -> objective class: look one up, list its knobs, validate its params, build it."""

    def __init__(self, classes: typing.Iterable[type]):
        self.classes = {cls.name: cls for cls in classes}

    def names(self) -> list[str]:
        return sorted(self.classes)

    def get(self, name: str) -> type:
        if name not in self.classes:
            raise ConfigError(f"unknown objective '{name}'; choose one of: {', '.join(self.names())}")
        return self.classes[name]

    def knobs(self, name: str) -> dict[str, typing.Any]:
        """The objective's knob names and defaults."""
        return {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
                for f in dataclasses.fields(self.get(name).Params)}

    def build_params(self, name: str, raw: typing.Optional[dict]):
        """Validate ``raw`` against the objective's params dataclass (unknown keys, types, ranges)."""
        cls = self.get(name)
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
        params = cls.Params(**{k: coerce(f"objective.{k}", v, hints[k]) for k, v in raw.items()})
        params.validate()
        return params

    def build(self, name: str, raw: typing.Optional[dict]):
        return self.get(name)(self.build_params(name, raw))


BASES = Catalog([SimCSE, CompCSE, SGOPT, Laser, BSC])  # every objective but HiCL, which wraps one of them
