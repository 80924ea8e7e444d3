"""raycse: contrastive sentence-embedding training and tuning on Ray.

Data flow, one package per floor: ``data`` (corpus, batch orders) -> ``encoder`` ->
``objectives`` (one module per method on a shared contrastive core) -> ``train`` (Ray Train
driver and per-worker loop) -> ``evaluation`` (STS) -> ``cli``.
"""

from raycse._version import __version__  # noqa: F401 - the package's version


def train(run, overwrite: bool = False):
    """Train a :class:`raycse.config.RunConfig` on Ray Train; returns a ``TrainResult``."""
    from raycse.train.driver import train as _train

    return _train(run, overwrite=overwrite)
