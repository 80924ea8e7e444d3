"""User-facing errors.

Anything a user can fix (a bad path, an out-of-range knob, an empty corpus) raises
:class:`RaycseError` with one line that names the problem and the fix. The CLI prints
that line and exits non-zero; bugs keep their traceback.
"""


class RaycseError(Exception):
    """A problem with the user's input, with a one-line message saying how to fix it."""


class ConfigError(RaycseError, ValueError):
    """An invalid configuration value, unknown key or malformed YAML."""


class DataError(RaycseError):
    """A corpus or evaluation file that cannot be used."""


class ModelError(RaycseError):
    """A model that cannot be found or loaded."""


def require(module: str, extra: str, what: str) -> None:
    """Fail at once, in one line naming the extra to install, when ``what`` needs ``module`` and it is
    not installed (not after Ray started, or after an hour of embedding)."""
    import importlib.util

    try:
        missing = importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package missing, or the module blocked (sys.modules[m] = None)
        missing = True
    if missing:
        raise RaycseError(f"{what} needs the '{module}' package, which is not installed: pip install "
                          f"'raycse[{extra}]'")


class ResourceError(RaycseError):
    """The cluster could not give a run what it asked for (workers, placement groups) in time."""
