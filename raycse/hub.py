"""The Hugging Face hub, asked once and briefly: whether it can be reached before a model or data set
is fetched from it (offline, the hub client retries with back-off for ~25-35 s before failing)."""

from __future__ import annotations

import socket
from typing import Optional
from urllib.parse import urlsplit

PROBE_TIMEOUT_S = 3.0


def unreachable(timeout_s: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """Why the hub cannot be asked now (offline mode, or no TCP connection to its endpoint within
    ``timeout_s``), or None when it can."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "the hub is switched off here (HF_HUB_OFFLINE=1)"
    url = urlsplit(constants.ENDPOINT)
    host = url.hostname or ""
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"the hub ({url.scheme}://{host}:{port}) cannot be reached from this machine ({exc.strerror or exc})"
