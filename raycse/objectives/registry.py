"""Name -> objective class, so configs, the CLI and search spaces can name objectives.

Three ways in, looked up in this order:

- raycse's own (``simcse``, ``hicl``, ...): a file here and its class in
  :data:`raycse.objectives.catalog.BASES` (or here, for one that wraps others as HiCL does);
- an installed package's, by name: an entry point in the group ``raycse.objectives``
  (``[project.entry-points."raycse.objectives"] my_method = "my_pkg.module:MyObjective"``);
- any importable class, by its import path: ``objective.name: my_pkg.module:MyObjective``
  (``--objective my_pkg.module:MyObjective``). ``examples/symmetric_simcse.py`` is one.

A class from outside raycse must subclass :class:`raycse.objectives.base.Objective` and carry a
``Params`` dataclass (a subclass of :class:`~raycse.objectives.base.Params`). Its module is imported
from the installed packages and PYTHONPATH only, never from the working directory: a config from
someone else cannot make raycse run a file that happens to sit where the command runs. On a cluster
the module must be importable on every node (installed there, or shipped with the job's runtime
env: ``py_modules`` / ``working_dir``)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from importlib.metadata import entry_points

from raycse.errors import ConfigError
from raycse.objectives.base import Objective, Params
from raycse.objectives.catalog import BASES, Catalog
from raycse.objectives.hicl import HiCL

ENTRY_POINT_GROUP = "raycse.objectives"


class Registry(Catalog):
    """The built-in catalog, then the installed entry points, then import paths (``module:Class``)."""

    def names(self) -> list[str]:
        """raycse's own objectives and those installed packages register (import paths are not listed)."""
        return sorted(set(self.classes) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})

    def get(self, name: str) -> type:
        if name in self.classes:
            return self.classes[name]
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if found:
            cls = self._load(name, lambda: found[0].load(), f"entry point {found[0].value}")
        elif ":" in name:
            module, _, attr = name.partition(":")
            cls = self._load(name, lambda: getattr(_import_outside_cwd(module), attr), name)
        else:
            raise ConfigError(f"unknown objective '{name}'; choose one of: {', '.join(self.names())}, or name "
                              f"your own as my_pkg.module:MyObjective")
        self.classes[name] = cls
        return cls

    @staticmethod
    def _load(name: str, load, where: str) -> type:
        try:
            cls = load()
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"objective '{name}' cannot be loaded ({where}): {str(exc).splitlines()[0]}; check the "
                              f"name, and that its module is installed or on PYTHONPATH") from None
        if not (isinstance(cls, type) and issubclass(cls, Objective)):
            raise ConfigError(f"objective '{name}' ({where}) is {cls!r}, not a subclass of "
                              f"raycse.objectives.base.Objective; name an Objective class")
        params = getattr(cls, "Params", None)
        if not (isinstance(params, type) and issubclass(params, Params) and dataclasses.is_dataclass(params)):
            raise ConfigError(f"objective '{name}' ({where}) has no Params dataclass (a subclass of "
                              f"raycse.objectives.base.Params); give it one, even an empty one")
        return cls


def _import_outside_cwd(module: str):
    """``importlib.import_module`` with the working directory off the search path for the import."""
    here = {"", ".", os.getcwd()}
    kept = sys.path[:]
    sys.path[:] = [p for p in sys.path if p not in here and os.path.abspath(p) != os.getcwd()]
    try:
        return importlib.import_module(module)
    finally:
        sys.path[:] = kept + [p for p in sys.path if p not in kept]


OBJECTIVES = Registry([*BASES.classes.values(), HiCL])

names = OBJECTIVES.names
get = OBJECTIVES.get
knobs = OBJECTIVES.knobs
build_params = OBJECTIVES.build_params
build = OBJECTIVES.build
