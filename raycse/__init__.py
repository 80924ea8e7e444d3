"""raycse: contrastive sentence-embedding training and tuning on Ray.

One package per floor of the data flow, over the ground floor's ``platform`` (the Ray session,
outputs, storage, processes) and ``model`` (the encoder and its saved format): ``objectives`` ->
``config`` -> ``data`` -> ``grouping`` -> ``evaluation`` -> ``train`` -> ``tune`` -> ``analysis`` ->
``cli`` (docs/layout.md).

``raycse.train(run, corpus=...)`` trains a :class:`raycse.config.RunConfig` (see
:func:`raycse.train.train`; the ``train`` package is callable, so the name means the same before and
after its modules are imported).
"""

from raycse import train  # noqa: F401 - the callable Ray Train package: raycse.train(run, ...)
from raycse._version import __version__  # noqa: F401 - the package's version
