"""raycse: contrastive sentence-embedding training and tuning on Ray.

One package per floor of the data flow, over the ground floor's ``platform`` (the Ray session,
outputs, storage, processes) and ``model`` (the encoder and its saved format): ``objectives`` ->
``config`` -> ``data`` -> ``grouping`` -> ``evaluation`` -> ``train`` -> ``tune`` -> ``analysis`` ->
``cli`` (docs/layout.md).

``raycse.train(run, corpus=..., callbacks=...)`` trains a :class:`raycse.config.RunConfig` (see
:func:`raycse.train.train`; the ``train`` package is callable, so the name means the same before and
after its modules are imported). The public names below load on first use, so ``import raycse``
costs no torch (Ray Data's tasks import raycse's data modules, and with them this package):

    >>> import raycse
    >>> run = raycse.RunConfig.from_dict({"objective": {"name": "bsc", "tau": 0.1}})
    >>> run.objective.name, run.objective.typed().tau
    ('bsc', 0.1)
    >>> issubclass(raycse.Callback, object) and "train" in raycse.__all__
    True
"""

from raycse import train  # noqa: F401 - the callable Ray Train package: raycse.train(run, ...)
from raycse._version import __version__  # noqa: F401 - the package's version

# public name -> the module that defines it (imported when the name is first read)
_LAZY = {"RunConfig": "raycse.config", "Callback": "raycse.train.callbacks", "Encoder": "raycse.model.encoder"}

__all__ = ["train", "RunConfig", "Callback", "Encoder", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raycse' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
