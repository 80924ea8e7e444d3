"""Name -> objective class, so configs, the CLI and search spaces can name objectives.

Adding an objective: its file (a ``Params`` dataclass, ``collate``, ``loss``) and its class in
:data:`raycse.objectives.catalog.BASES` (or here, for one that wraps others as HiCL does)."""

from __future__ import annotations

from raycse.objectives.catalog import BASES, Catalog
from raycse.objectives.hicl import HiCL

OBJECTIVES = Catalog([*BASES.classes.values(), HiCL])

names = OBJECTIVES.names
get = OBJECTIVES.get
knobs = OBJECTIVES.knobs
build_params = OBJECTIVES.build_params
build = OBJECTIVES.build
