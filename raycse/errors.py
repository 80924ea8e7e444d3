"""User-facing errors.

Anything a user can fix (a bad path, an out-of-range knob, an empty corpus) raises
:class:`RaycseError` with one line that names the problem and the fix. The CLI prints
that line and exits non-zero; bugs keep their traceback.
"""


class RaycseError(Exception):
    """A problem with the user's input, with a one-line message saying how to fix it."""


class ConfigError(RaycseError, ValueError):
    """An invalid configuration value, unknown key or malformed YAML: what an extension raises for a setting it
    cannot take (``raycse: error: MESSAGE`` and exit 2 on the command line).

    Args:
        message: one line naming the setting, what is wrong, and the fix.

    Returns:
        An exception to raise.

    Raises:
        Nothing itself.

    >>> try:
    ...     raise ConfigError("objective.tau must be > 0, got 0; e.g. --set objective.tau=0.05")
    ... except RaycseError as err:
    ...     print(err)
    objective.tau must be > 0, got 0; e.g. --set objective.tau=0.05
    """


class DataError(RaycseError):
    """A corpus or evaluation file that cannot be used."""


class ModelError(RaycseError):
    """A model that cannot be found or loaded."""


def require(module: str, extra: str, what: str) -> None:
    """Fail at once, in one line naming the extra to install, when ``what`` needs ``module`` and it is
    not installed (not after Ray started, or after an hour of embedding)."""
    require_installed(module, f"raycse[{extra}]", what)


def require_installed(module: str, requirement: str, what: str) -> None:
    """:func:`require` for any package: ``requirement`` is what pip installs it by."""
    import importlib.util

    try:
        missing = importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package missing, or the module blocked (sys.modules[m] = None)
        missing = True
    if missing:
        raise RaycseError(f"{what} needs the '{module}' package, which is not installed: pip install "
                          f"'{requirement}'")


class LossNotFinite(RaycseError, FloatingPointError):
    """The training loss became NaN or infinite: the run stops, naming the step."""


class ResourceError(RaycseError):
    """The cluster could not give a run what it asked for (workers, placement groups) in time."""


# What a disk or a permission refuses (no space, quota, read-only, not allowed): the user's to fix.


def named(err: OSError, path) -> OSError:
    """``err`` naming ``path`` when it names no file (a failed write names none): for the one line."""
    if err.filename is None:
        return OSError(err.errno, err.strerror, str(path))
    return err
DISK_ERRNOS = (28, 122, 13, 30, 1)  # ENOSPC, EDQUOT, EACCES, EROFS, EPERM


def disk_error_line(exc: BaseException) -> "str | None":
    """One line for a failed write or read that the disk or a permission refused, found anywhere in
    ``exc``'s chain (a Ray worker's error carries the worker's as ``cause`` or only as text), else None."""
    import re

    seen, todo = set(), [exc]
    while todo:
        err = todo.pop(0)
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in DISK_ERRNOS:
            where = err.filename2 or err.filename or "a file"  # (a copy names its source first, its target second)
            return f"{err.strerror} at {where}; free space there, or choose a path this user can write to"
        found = re.search(r"\[Errno (\d+)\] ([^:\n\]]+): '([^'\n]+)'(?: -> '([^'\n]+)')?", str(err))
        if found and int(found.group(1)) in DISK_ERRNOS:
            return (f"{found.group(2)} at {found.group(4) or found.group(3)}; free space there, or choose a path this "
                    f"user can write to")
        todo += [err.__cause__, err.__context__, getattr(err, "cause", None)]
    return None
