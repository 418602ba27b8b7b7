"""The unix sockets the plugins serve on: making room for one, and trying again when it cannot be made.

A plugin's socket path is in a directory the kubelet owns, where anything may be found: a stale
socket (removed), a file (removed), or a directory (never removed: it is not ours). A socket that
cannot be created is one error line and is tried again with backoff (``SocketRetry``), not a
traceback on every supervisor tick.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

FIRST_RETRY_S = 0.1
MAX_RETRY_S = 5.0


class SocketUnavailable(Exception):
    """The socket cannot be created at its path (a directory is there, no permission); ``str()`` is one line."""


def clear_socket_path(path: Path) -> None:
    """Make room for a socket at ``path``: a stale socket or file there is removed, a directory never."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise SocketUnavailable(f"{path}: a directory, not a socket; remove it")
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SocketUnavailable(f"{path}: {exc.strerror or exc}") from None


class SocketRetry:
    """One socket's creation while it fails: each distinct problem is logged once, and the next try
    waits 0.1 s doubling to 5 s. ``fields`` name the socket in the log lines."""

    def __init__(self, **fields: object) -> None:
        self.fields = fields
        self.problem: str | None = None
        self._retry_at = 0.0
        self._backoff = FIRST_RETRY_S

    def due(self) -> bool:
        """No problem, or time to try again."""
        return self.problem is None or time.monotonic() >= self._retry_at

    def failed(self, exc: SocketUnavailable) -> None:
        if self.problem != str(exc):
            log.error("cannot create the plugin socket; retrying", reason="socket-unavailable", error=str(exc),
                      **self.fields)
        self.problem = str(exc)
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, MAX_RETRY_S)

    def succeeded(self) -> None:
        if self.problem is not None:
            log.info("plugin socket created", reason="socket-available", **self.fields)
        self.problem, self._backoff = None, FIRST_RETRY_S
