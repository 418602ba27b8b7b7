"""The connections of ``connections.ConnectionServer`` that have no request in flight, on its selector
thread: a new one in its TLS handshake, then (and again between keep-alive requests) waiting for the
first bytes of a request, which are read here and handed on with the connection.

Each wait has its own deadline, counted from when the connection fell idle: ``handshake_timeout_s``
for the handshake, ``idle_timeout_s`` for a request; past it, the connection is closed. A connection
that sends nothing costs a socket: no thread, and no TLS buffers until its first bytes come."""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from labeller.base.log import get_logger

log = get_logger(__name__)

_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


@dataclass(eq=False)
class Connection:
    """One client's connection: its socket (a TLS one from the client's first bytes on), its address,
    when it last fell idle, and what the selector read of its next request (the worker reads the rest).
    The selector watches it by its file descriptor, which stays when the socket is wrapped in TLS."""

    sock: socket.socket
    address: tuple[str, int]
    since: float
    first_bytes: bytes = b""
    fd: int = field(init=False)

    def __post_init__(self) -> None:
        self.fd = self.sock.fileno()


class _OldestFirst:
    """Connections idle in one state, oldest first: each is closed ``timeout_s`` after it fell idle,
    so their deadlines come in the same order."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._connections: collections.OrderedDict[Connection, None] = collections.OrderedDict()

    def __contains__(self, connection: Connection) -> bool:
        return connection in self._connections

    def __len__(self) -> int:
        return len(self._connections)

    def add(self, connection: Connection) -> None:
        self._connections[connection] = None

    def discard(self, connection: Connection) -> None:
        self._connections.pop(connection, None)

    def oldest(self) -> Connection | None:
        return next(iter(self._connections), None)

    def deadline(self) -> float | None:
        oldest = self.oldest()
        return None if oldest is None else oldest.since + self.timeout_s

    def expired(self, now: float) -> Iterator[Connection]:
        while (oldest := self.oldest()) is not None and oldest.since + self.timeout_s <= now:
            self.discard(oldest)
            yield oldest


class IdleConnections:
    """The connections open without a request in flight, watched by ``selector``: in their TLS handshake
    (when ``tls`` is given), then waiting for a request. ``on_request(connection)`` gets each one whose
    first bytes came: out of the selector, its socket blocking again; ``on_close()`` hears of each one
    closed here."""

    FIRST_READ = 65536

    def __init__(self, selector: selectors.BaseSelector, tls: ssl.SSLContext | None, *, handshake_timeout_s: float,
                 idle_timeout_s: float, on_request: Callable[[Connection], None],
                 on_close: Callable[[], None]) -> None:
        self._selector, self._tls = selector, tls
        self._handshaking, self._waiting = _OldestFirst(handshake_timeout_s), _OldestFirst(idle_timeout_s)
        self._on_request, self._on_close = on_request, on_close

    def __len__(self) -> int:
        return len(self._handshaking) + len(self._waiting)

    def __contains__(self, connection: Connection) -> bool:
        return connection in self._handshaking or connection in self._waiting

    def add(self, connection: Connection) -> None:
        """A connection just accepted: it waits for its handshake, or without TLS for its first request."""
        self._selector.register(connection.fd, selectors.EVENT_READ, connection)
        if self._tls is None:
            self._wait_for_request(connection)
        else:
            self._handshaking.add(connection)  # wrapped in TLS once its first bytes come (see _handshake)

    def add_back(self, connection: Connection) -> None:
        """A connection kept open after its requests: it waits for the next one."""
        connection.first_bytes = b""
        connection.sock.setblocking(False)
        self._selector.register(connection.fd, selectors.EVENT_READ, connection)
        self._wait_for_request(connection)

    def on_event(self, connection: Connection) -> None:
        """The selector found ``connection`` readable (or writable, mid-handshake)."""
        if connection in self._handshaking:  # still idle: not closed nor handed over in this turn
            self._handshake(connection)
        elif connection in self._waiting:
            self._read_first(connection)

    def oldest(self) -> Connection | None:
        """The one to close first to make room: the one longest in its TLS handshake (whoever it is, it
        has shown no certificate yet), else the one longest without a request."""
        return self._handshaking.oldest() or self._waiting.oldest()

    def deadlines(self) -> tuple[float | None, float | None]:
        """When the oldest handshake and the oldest wait for a request run out (None: there is none)."""
        return self._handshaking.deadline(), self._waiting.deadline()

    def expire(self, now: float) -> None:
        for connection in self._handshaking.expired(now):
            log.debug("TLS handshake not finished in time", reason="tls-refused", client=connection.address[0])
            self.close(connection)
        for connection in self._waiting.expired(now):
            self.close(connection)

    def close(self, connection: Connection) -> None:
        self._handshaking.discard(connection)
        self._waiting.discard(connection)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.fd)
        connection.sock.close()
        self._on_close()

    def close_all(self) -> None:
        while (oldest := self.oldest()) is not None:
            self.close(oldest)

    # --- the handshake, then the wait for a request ------------------------------------------------

    def _handshake(self, connection: Connection) -> None:
        try:
            self._tls_socket(connection).do_handshake()
        except ssl.SSLWantReadError:
            self._watch(connection, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(connection, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:
            log.info("TLS handshake refused", reason="tls-refused", client=connection.address[0],
                     error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self.close(connection)
            return
        self._handshaking.discard(connection)
        self._watch(connection, selectors.EVENT_READ)
        self._wait_for_request(connection)

    def _tls_socket(self, connection: Connection) -> ssl.SSLSocket:
        """The connection's TLS socket, made when the client's first bytes come: a connection that sends
        nothing costs a socket, not OpenSSL's buffers too (about 40 KiB each)."""
        if not isinstance(connection.sock, ssl.SSLSocket):
            assert self._tls is not None
            connection.sock = self._tls.wrap_socket(connection.sock, server_side=True, do_handshake_on_connect=False)
        return connection.sock

    def _watch(self, connection: Connection, events: int) -> None:
        if self._selector.get_key(connection.fd).events != events:
            self._selector.modify(connection.fd, events, connection)

    def _wait_for_request(self, connection: Connection) -> None:
        """Idle from now on; what arrived already (with the handshake, or as it was given back) is read now."""
        connection.since = time.monotonic()
        self._waiting.add(connection)
        self._read_first(connection)

    def _read_first(self, connection: Connection) -> None:
        try:
            data = connection.sock.recv(self.FIRST_READ)
        except _WOULD_BLOCK:
            return  # nothing yet (a TLS record not whole, or no application data in it)
        except (OSError, ValueError):
            data = b""
        if not data:
            self.close(connection)
            return
        self._waiting.discard(connection)
        self._selector.unregister(connection.fd)
        connection.first_bytes = data
        connection.sock.setblocking(True)  # the worker bounds each read and write itself
        self._on_request(connection)
