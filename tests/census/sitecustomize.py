"""The fit census of the test suite (``RAYCSE_TEST_FITS=FILE bash scripts/test.sh``): every Python process
started with this folder on PYTHONPATH imports this module first, and where raycse's own doors to Ray Train and
Ray Tune load, it notes which test called them (the test process, a raycse command it runs, a script it
starts). A fit inside a Tune trial runs in a Ray worker and counts with the search that started it.

Test code only: nothing here is raycse's."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

CENSUS_DIR_ENV = "RAYCSE_TEST_FITS_DIR"
# raycse's doors to Ray: a module -> the function in it whose call is one end-to-end fit or search
DOORS = {"raycse.train.fit": "fit_and_release", "raycse.tune.experiment": "_fit_under_signals"}


def in_ray_worker() -> bool:
    """A Ray worker process (a Tune trial's or a Train worker's): its test is not known from its environment,
    which it inherited from whoever started that Ray."""
    return os.path.basename(sys.argv[0] if sys.argv else "") == "default_worker.py"


def note(door: str) -> None:
    folder = os.environ.get(CENSUS_DIR_ENV)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    if not folder or in_ray_worker() or not test:
        return
    with open(os.path.join(folder, f"{os.getpid()}.txt"), "a") as out:
        out.write(f"{test}\t{door}\n")


def wrap(module) -> None:
    name = DOORS[module.__name__]
    inner = getattr(module, name)

    def counted(*args, **kwargs):
        note(f"{module.__name__}.{name}")
        return inner(*args, **kwargs)

    setattr(module, name, counted)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        wrap(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in DOORS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    if os.environ.get(CENSUS_DIR_ENV) and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
