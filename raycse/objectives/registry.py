"""Name -> objective class, so configs, the CLI and search spaces can name objectives.

Three ways in, looked up in this order:

- raycse's own (``simcse``, ``hicl``, ...): a file here and its class in
  :data:`raycse.objectives.catalog.BASES` (or here, for one that wraps others as HiCL does);
- an installed package's, by name: an entry point in the group ``raycse.objectives``
  (``[project.entry-points."raycse.objectives"] my_method = "my_pkg.module:MyObjective"``);
- any importable class, by its import path: ``objective.name: my_pkg.module:MyObjective``
  (``--objective my_pkg.module:MyObjective``). ``examples/symmetric_simcse.py`` is one.

A class from outside raycse must subclass :class:`raycse.objectives.base.Objective` and carry a
``Params`` dataclass (a subclass of :class:`~raycse.objectives.base.Params`). How a name is found and
its module imported (never from the working directory): :mod:`raycse.platform.plugins`."""

from __future__ import annotations

import dataclasses

from raycse.errors import ConfigError
from raycse.objectives.base import Objective, Params
from raycse.objectives.catalog import BASES, Catalog
from raycse.objectives.hicl import HiCL
from raycse.platform import plugins

ENTRY_POINT_GROUP = "raycse.objectives"


class Registry(Catalog):
    """The built-in catalog, then the installed entry points, then import paths (``module:Class``)."""

    def names(self) -> list[str]:
        """raycse's own objectives and those installed packages register (import paths are not listed)."""
        return sorted(set(self.classes) | set(plugins.entry_point_names(ENTRY_POINT_GROUP)))

    def get(self, name: str) -> type:
        if name in self.classes:
            return self.classes[name]
        cls = plugins.load(ENTRY_POINT_GROUP, name, "objective")
        if cls is None:
            raise ConfigError(f"unknown objective '{name}'; choose one of: {', '.join(self.names())}, or name "
                              f"your own as my_pkg.module:MyObjective")
        self.classes[name] = _checked(name, cls)
        return cls


def _checked(name: str, cls) -> type:
    if not (isinstance(cls, type) and issubclass(cls, Objective)):
        raise ConfigError(f"objective '{name}' is {cls!r}, not a subclass of raycse.objectives.base.Objective; "
                          f"name an Objective class")
    params = getattr(cls, "Params", None)
    if not (isinstance(params, type) and issubclass(params, Params) and dataclasses.is_dataclass(params)):
        raise ConfigError(f"objective '{name}' has no Params dataclass (a subclass of "
                          f"raycse.objectives.base.Params); give it one, even an empty one")
    return cls


OBJECTIVES = Registry([*BASES.classes.values(), HiCL])

names = OBJECTIVES.names
get = OBJECTIVES.get
knobs = OBJECTIVES.knobs
build_params = OBJECTIVES.build_params
build = OBJECTIVES.build
