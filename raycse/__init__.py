"""raycse: contrastive sentence-embedding training and tuning on Ray.

One package per floor of the data flow, over the ground floor's ``platform`` (the Ray session,
outputs, storage, processes) and ``model`` (the encoder and its saved format): ``objectives`` ->
``config`` -> ``data`` -> ``grouping`` -> ``evaluation`` -> ``shipping`` -> ``train`` -> ``tune`` -> ``analysis`` ->
``cli`` (docs/layout.md).

The Python API does what the CLI does, with the same checks and errors: ``raycse.train(run, ...)``
(a :class:`raycse.config.RunConfig`), ``raycse.evaluate(model, EvalSettings(...))``,
``raycse.export(model, ExportSettings(...))``,
``raycse.mine(DataConfig(...), output, MineSettings(...))``, ``raycse.tune(TuneSettings(...))`` and
``raycse.analyze(exp_dir)``. ``train`` and ``tune`` are callable packages (the name means the same before
and after their modules are imported). The public names load on first use, so ``import raycse`` costs
no torch (Ray Data's tasks import raycse's data modules, and with them this package):

    >>> import raycse
    >>> run = raycse.RunConfig.from_dict({"objective": {"name": "bsc", "tau": 0.1}})
    >>> run.objective.name, run.objective.typed().tau
    ('bsc', 0.1)
    >>> issubclass(raycse.Callback, object) and "train" in raycse.__all__
    True
"""

from raycse import train  # noqa: F401 - the callable Ray Train package: raycse.train(run, ...)
from raycse import tune  # noqa: F401 - the callable search package: raycse.tune(settings, ...)
from raycse._version import __version__  # noqa: F401 - the package's version

# public name -> "module" that defines it, or "module:name" (imported when the name is first read)
_LAZY = {"RunConfig": "raycse.config", "DataConfig": "raycse.config", "Callback": "raycse.train.callbacks",
         "Encoder": "raycse.model.encoder", "evaluate": "raycse.evaluation.run",
         "EvalSettings": "raycse.evaluation.settings", "mine": "raycse.grouping.mine:mine_triplets",
         "MineSettings": "raycse.grouping.mine", "TuneSettings": "raycse.tune.settings", "analyze": "raycse.analysis",
         "export": "raycse.shipping.run", "ExportSettings": "raycse.shipping.settings"}

__all__ = ["train", "evaluate", "export", "mine", "tune", "analyze", "RunConfig", "DataConfig", "EvalSettings",
           "ExportSettings", "MineSettings", "TuneSettings", "Callback", "Encoder", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, _, attribute = _LAZY[name].partition(":")
        value = getattr(importlib.import_module(module), attribute or name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raycse' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
