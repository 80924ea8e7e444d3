"""raycse: contrastive sentence-embedding training and tuning on Ray.

Data flow, one package per floor: ``data`` (corpus, batch orders) -> ``encoder`` ->
``objectives`` (one module per method on a shared contrastive core) -> ``train`` (Ray Train
driver and per-worker loop) -> ``evaluation`` (STS) -> ``cli``.

``raycse.train(run, corpus=...)`` trains a :class:`raycse.config.RunConfig` (see
:func:`raycse.train.train`; the ``train`` package is callable, so the name means the same before and
after its modules are imported).
"""

from raycse import train  # noqa: F401 - the callable Ray Train package: raycse.train(run, ...)
from raycse._version import __version__  # noqa: F401 - the package's version
