"""A user's own extension, found by name without editing raycse: an installed
package's entry point in one of raycse's groups (``[project.entry-points."raycse.objectives"]
my_method = "my_pkg.module:MyObjective"``), or an import path ``my_pkg.module:Name``.

Modules load from the installed packages and PYTHONPATH only, never from the working directory: a
config from someone else cannot make raycse run a file that happens to sit where the command runs. On a
cluster the module must be importable on every node (installed there, or shipped with the job's runtime
env: ``py_modules`` / ``working_dir``).

    >>> load("raycse.objectives", "collections:OrderedDict", "objective").__name__
    'OrderedDict'
    >>> load("raycse.objectives", "no_such_module_xyz:Thing", "objective")
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: objective 'no_such_module_xyz:Thing' cannot be loaded (no_such_module_xyz:Thing): No module named 'no_such_module_xyz'; check the name, and that its module is installed or on PYTHONPATH
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import entry_points
from typing import Optional

from raycse.errors import ConfigError


def entry_point_names(group: str) -> list[str]:
    """The names installed packages register in ``group``."""
    return sorted({ep.name for ep in entry_points(group=group)})


def load(group: str, name: str, kind: str) -> Optional[object]:
    """The object ``name`` means in ``group`` (an entry point's, else an import path's); None where it is
    neither. A name that cannot be loaded is one line naming ``kind`` (objective, grouping strategy...)."""
    found = [ep for ep in entry_points(group=group) if ep.name == name]
    if found:
        where, loader = f"entry point {found[0].value}", found[0].load
    elif ":" in name:
        module, _, attr = name.partition(":")
        where, loader = name, lambda: getattr(import_outside_cwd(module), attr)
    else:
        return None
    try:
        return loader()
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{kind} '{name}' cannot be loaded ({where}): {_first_line(exc)}; check the "
                          f"name, and that its module is installed or on PYTHONPATH") from None
    except Exception as exc:  # noqa: BLE001 - a plug-in's module is someone else's code: any failure is one line
        raise ConfigError(f"{kind} '{name}' failed while its module was imported ({where}): "
                          f"{type(exc).__name__}: {_first_line(exc)}; fix the module, or name another {kind}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def load_instance(group: str, name: str, kind: str, base: type) -> Optional[object]:
    """:func:`load`, as an instance of ``base`` (a subclass of it is made with no arguments); None where
    ``name`` is no extension's; one line where it is something else."""
    found = load(group, name, kind)
    if found is None:
        return None
    if isinstance(found, type) and issubclass(found, base):
        try:
            found = found()
        except Exception as exc:  # noqa: BLE001 - its constructor is someone else's code
            raise ConfigError(f"{kind} '{name}' failed as it was made ({found.__module__}.{found.__qualname__}()): "
                              f"{type(exc).__name__}: {_first_line(exc)}; fix it, or name another {kind}") from None
    if not isinstance(found, base):
        raise ConfigError(f"{kind} '{name}' is {found!r}, not a {base.__module__}.{base.__qualname__}; name a "
                          f"{base.__name__} subclass (or an instance of one)")
    return found


def import_outside_cwd(module: str):
    """``importlib.import_module`` with the working directory off the search path for the import, unless the user
    put it there on purpose: an entry of PYTHONPATH (``PYTHONPATH=. raycse train --objective mymod:X``) is kept;
    the one Python adds by itself for ``python -m`` or a script in this directory is not."""
    cwd = os.getcwd()
    explicit = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    kept = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != cwd or cwd in explicit]
    try:
        return importlib.import_module(module)
    finally:
        sys.path[:] = kept + [p for p in sys.path if p not in kept]
