"""The Hugging Face hub, asked once and briefly: whether it can be reached before a model or data set
is fetched from it (offline, the hub client retries with back-off for ~25-35 s before failing)."""

from __future__ import annotations

import contextlib
import socket
from typing import Optional
from urllib.parse import urlsplit

PROBE_TIMEOUT_S = 3.0
ANSWER_KEPT_S = 60.0  # one command's checks and its reads ask once, not once each
_answers: dict = {}  # (host, port) -> (when, answer)


def unreachable(timeout_s: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """Why the hub cannot be asked now (offline mode, or no TCP connection to its endpoint within
    ``timeout_s``), or None when it can."""
    import time

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "the hub is switched off here (HF_HUB_OFFLINE=1)"
    url = urlsplit(constants.ENDPOINT)
    host = url.hostname or ""
    port = url.port or (80 if url.scheme == "http" else 443)
    when, answer = _answers.get((host, port), (float("-inf"), None))
    if time.monotonic() - when < ANSWER_KEPT_S:
        return answer
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            answer = None
    except OSError as exc:
        answer = f"the hub ({url.scheme}://{host}:{port}) cannot be reached from this machine ({exc.strerror or exc})"
    _answers[(host, port)] = (time.monotonic(), answer)
    return answer


@contextlib.contextmanager
def cache_only_if_unreachable():
    """Hugging Face reads inside come from the local cache alone where the hub cannot be reached (a load
    would otherwise retry for ~35 s, or be a download raycse must not make); yields why, or None when the
    hub can be asked. huggingface_hub's and datasets' flags are set directly: both read HF_HUB_OFFLINE at
    import, so the variable set now would not reach them."""
    import datasets.config
    import huggingface_hub.constants as constants

    reason = unreachable()
    saved = (constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE)
    if reason:
        constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield reason
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved
