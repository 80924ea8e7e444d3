"""The fit census of the test suite (``RAYCSE_TEST_FITS=FILE bash scripts/test.sh``): while it is on, every Python
process of the suite's environment imports this module at its start (a ``.pth`` file tests/conftest.py puts in
site-packages for the run), and where Ray's trainer and Tuner load, it notes which test calls ``fit``: a test's
own process, a raycse command it runs, a script it starts, a job on a cluster it started. A fit inside a Tune
trial (a Ray worker) counts with the search that started it.

The test is the one running in the nearest pytest process among the caller's ancestors (each writes the test it
runs to the census folder), else the one in the caller's environment (a job's driver, whose parent is a raylet).

Test code only: nothing here is raycse's."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

CENSUS_DIR_ENV = "RAYCSE_TEST_FITS_DIR"
# where Ray defines them (Ray 2.55-2.60, Train v2): a module -> the class whose ``fit`` is one fit or search
DOORS = {"ray.train.v2.api.data_parallel_trainer": "DataParallelTrainer", "ray.tune.tuner": "Tuner"}


def in_ray_worker() -> bool:
    """A Ray worker process (a Tune trial's or a Train worker's)."""
    return os.path.basename(sys.argv[0] if sys.argv else "") == "default_worker.py"


def parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def current_test(folder: str) -> str:
    pid = os.getpid()
    while pid > 1:
        try:
            with open(os.path.join(folder, f"current-{pid}")) as running:
                return running.read()
        except OSError:
            pid = parent_of(pid)
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def ray_address() -> str:
    """The GCS address of the Ray this process is connected to ("" before it connects): the suite's shared Ray's
    (tests/conftest.py ray_cluster notes it), or one the fit's command started or joined."""
    ray = sys.modules.get("ray")
    try:
        return ray.get_runtime_context().gcs_address if ray is not None and ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - a census line without the address rather than a failed fit
        return ""


def note(door: str) -> None:
    folder = os.environ.get(CENSUS_DIR_ENV)
    if not folder or in_ray_worker():
        return
    test = current_test(folder)
    if test:
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "a") as out:
            out.write(f"{test}\t{door}\t{ray_address()}\n")


def wrap(module) -> None:
    cls = getattr(module, DOORS[module.__name__])
    inner = cls.fit

    def fit(self, *args, **kwargs):
        note(f"{type(self).__name__}.fit")
        return inner(self, *args, **kwargs)

    cls.fit = fit


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
    """The doors wrapped when they load (and now, where they have loaded already)."""
    if not os.environ.get(CENSUS_DIR_ENV) or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    for name in DOORS:
        if name in sys.modules:
            wrap(sys.modules[name])


install()
