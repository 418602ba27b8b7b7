"""The unix sockets the plugins serve on: making room for one, serving on it, seeing it go, and
trying again when it cannot be made.

A plugin's socket path is in a directory the kubelet owns, where anything may be found: a stale
socket (removed), a file (removed), or a directory (never removed: it is not ours). A restarting
kubelet deletes the sockets there, so ``SocketServer.socket_ok`` tells whether the file it serves
on is still the one it made. A socket that cannot be created is one error line and is tried again
with backoff (``SocketRetry``), not a traceback on every supervisor tick.

The gRPC server itself is made by the plugin that serves it (only the plugins speak gRPC).
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from labeller.base.log import get_logger

log = get_logger(__name__)

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


def socket_identity(path: Path) -> tuple[int, int] | None:
    """What tells one socket file from the next at ``path`` (a new file may reuse the inode, not the
    ctime); None when nothing is there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


class GrpcServer(Protocol):
    """The part of ``grpc.Server`` a socket server uses."""

    def add_insecure_port(self, address: str) -> int: ...

    def start(self) -> None: ...

    def stop(self, grace: float | None) -> Any: ...


class SocketServer:
    """One gRPC server on one unix socket; ``stop`` then ``start`` re-creates it. ``build`` makes
    the server with its services added, not yet listening."""

    def __init__(self, path: Path, build: Callable[[], GrpcServer]) -> None:
        self.path, self._build = path, build
        self._server: GrpcServer | None = None
        self._identity: tuple[int, int] | None = None

    def start(self) -> None:
        """Serve on the socket; SocketUnavailable when it cannot be created."""
        clear_socket_path(self.path)
        server = self._build()
        try:
            server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError as exc:  # gRPC could not bind: the directory is gone or not writable
            server.stop(grace=None)
            raise SocketUnavailable(f"{self.path}: cannot listen there ({exc})") from None
        server.start()
        self._server = server
        # None: removed at once (a restarting kubelet): socket_ok() is False and the next tick re-creates it
        self._identity = socket_identity(self.path)

    def socket_ok(self) -> bool:
        """False when the socket file is gone or replaced."""
        return self._identity is not None and socket_identity(self.path) == self._identity

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(2)
            self._server = None
        if self.socket_ok():
            self.path.unlink(missing_ok=True)
        self._identity = None


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

    def next_try(self) -> float:
        """When to try again (``time.monotonic``); infinite while there is no problem."""
        return self._retry_at if self.problem is not None else math.inf

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
