"""Credentials never leave the process: what raycse prints, logs, saves or tracks goes through here.

A URI may carry a secret in two places pyarrow, MLflow and HTTP clients read: its user-info
(``s3://KEY:SECRET@bucket/x``, ``http://user:password@host``) and its query parameters
(``?access_key=...&secret_key=...&session_token=...``, an Azure SAS ``sig=``). :func:`redact` masks
both in any text; :func:`redact_obj` does it through a config or metrics mapping. The URI itself keeps
working where it is used (the filesystem is opened from the original); only its record is masked.

Where Ray records a URI itself (a storage path of Train or Tune, an experiment kept for
``--resume``), raycse cannot mask the record: :func:`refuse_credentials` turns such a URI away before
anything starts, pointing to the environment variables that carry the same credentials.

Ground floor: no raycse imports but :mod:`raycse.errors`.
"""

from __future__ import annotations

import io
import re
import sys
from contextlib import contextmanager

MASK = "***"

# scheme://userinfo@ : the user-info never holds '/', so this cannot reach into a path. One slash too:
# a URI that went through pathlib (a path argument read as a local path) is printed as s3:/KEY:SECRET@b.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*:/{1,2})(?P<info>[^/@\s?#'\"]+)@")
# user:secret@host:port without a scheme (a Ray address): a word that starts the token, a colon, no '/', ',' or
# space up to the '@', then a host name or [IPv6] address and its port. Only an address with a port: a file
# name (v1:final@2024.txt) or a goal list (sts:max,sts@64:max) holds ':' and '@' and no credential.
_BARE_USERINFO = re.compile(r"(?<![\w.+\-/:@%~])[\w.~%+\-]*:[^\s/@'\",]+@(?P<host>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])"
                            r"(?=:\d+(?:[/\s'\",;)]|$))")
# ?name=value / &name=value where the name says it is a secret
_SECRET_PARAM = re.compile(
    r"(?P<lead>[?&;](?:[A-Za-z0-9_.\-]*?)(?:key|secret|token|passw|pwd|sig|signature|credential|auth)"
    r"[A-Za-z0-9_.\-]*=)(?P<value>[^&;#\s'\"]+)", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every URI's or address's user-info and secret-named query values replaced by ``***``."""
    if ":/" not in text and "=" not in text and "@" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    text = _BARE_USERINFO.sub(lambda m: f"{MASK}@{m.group('host')}", text)
    return _SECRET_PARAM.sub(lambda m: f"{m.group('lead')}{MASK}", text)


def redact_obj(obj):
    """A copy of a JSON-like value (dicts, lists, tuples, strings) with every string redacted."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_obj(k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v) for v in obj)
    return obj


def has_credentials(text) -> bool:
    return isinstance(text, str) and redact(text) != text


def refuse_credentials(what: str, value) -> None:
    """One line, before anything starts, for a credential in a URI that Ray would record as given."""
    from raycse.errors import ConfigError

    if has_credentials(value):
        if "\n" in str(value):  # a file's text (a search space): only its lines that carry one, so one line
            value = " / ".join(line.strip() for line in str(value).splitlines() if has_credentials(line))
        raise ConfigError(f"{what} {redact(value)} carries credentials inside the URI, and Ray records this URI "
                          f"as given; put them in the environment instead (AWS_ACCESS_KEY_ID / "
                          f"AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, MLFLOW_TRACKING_USERNAME / "
                          f"MLFLOW_TRACKING_PASSWORD, ...) and drop them from the URI")


class StreamWrapper(io.TextIOBase):
    """A text stream in front of ``_stream`` that answers for it what libraries ask a console stream."""

    _stream = None

    def isatty(self) -> bool:
        try:
            return self._stream.isatty()
        except ValueError:  # closed (e.g. asked by Ray's colorama at exit, after the stream it wraps is gone)
            return False

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", "utf-8")

    def writable(self) -> bool:
        return True


class RedactingStream(StreamWrapper):
    """A text stream that redacts every write before passing it on (a line may arrive in pieces:
    text is held back only while the last line is incomplete and could still hold a URI)."""

    def __init__(self, stream):
        self._stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        data = self._pending + text
        cut = max(data.rfind("\n"), data.rfind("\r")) + 1
        if cut == 0 and len(data) < 4096 and ":" in data:  # wait for the line's end: a URI or user:secret@host
            self._pending = data
            return len(text)
        self._pending = "" if cut == 0 else data[cut:]
        self._stream.write(redact(data if cut == 0 else data[:cut]))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._stream.write(redact(self._pending))
            self._pending = ""
        self._stream.flush()


@contextmanager
def redacted_streams():
    """``sys.stdout`` and ``sys.stderr`` redacted inside the block (a CLI command, a Train worker's
    loop; Ray's forwarding of worker lines looks the streams up at each write, so it is covered)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if s is None or isinstance(s, RedactingStream) else RedactingStream(s) for s in saved)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
        sys.stdout, sys.stderr = saved
