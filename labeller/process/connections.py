"""The connections of a TCP (or TLS) server, admitted without a thread each.

One selector thread accepts connections, drives their TLS handshakes without blocking, and waits
for each one's first request bytes; only then is a connection handed to a worker thread, which
serves it and gives it back when it falls idle between requests. So a connection that has not sent
a request costs a socket, never a thread, and threads are bounded by the requests in flight.

Bounds: a handshake must finish within ``handshake_timeout_s``; an idle connection (handshake done,
or between keep-alive requests) is closed after ``idle_timeout_s``; at most ``max_connections`` are
open. When all are taken, an idle one is closed to make room for the new one: the one longest in
its handshake (whoever it is, it has shown no certificate yet), else the one longest without a
request; only when none is idle (every one has a request in flight) is the new one closed. Clients
that never authenticate cannot keep out one that does, nor push its idle keep-alive connections out."""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import queue
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
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


class _Idle:
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


class Workers:
    """Threads for the connections that have a request in flight: started as they are needed, at most
    ``most``; a thread idle for ``IDLE_S`` ends, so a burst's threads do not stay."""

    IDLE_S = 30.0
    _RETIRE = object()  # what an idle thread "gets" when its wait runs out

    def __init__(self, most: int, name: str) -> None:
        self._most, self._name = most, name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._alive = self._idle = self._queued = 0

    @property
    def alive(self) -> int:
        return self._alive

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._queued += 1
            if self._queued > self._idle and self._alive < self._most:
                self._alive += 1
                threading.Thread(target=self._run, name=f"{self._name}-worker", daemon=True).start()
        self._jobs.put(job)

    def close(self) -> None:
        with self._lock:
            for _ in range(self._alive):
                self._jobs.put(None)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                job = self._RETIRE
            with self._lock:
                self._idle -= 1
                if job is None or (job is self._RETIRE and self._queued <= self._idle):
                    self._alive -= 1
                    return
                if job is self._RETIRE:
                    continue  # a job came as the wait ran out, counting on this thread
                self._queued -= 1
            job()


def _finish(sock: socket.socket) -> None:
    """Close a connection that was answered: the end of the answer (FIN) first, as socketserver does,
    so that a client still sending (a body refused unread) reads the whole answer, not a reset."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    sock.close()


class ConnectionServer:
    """Serves the connections of ``listener``: ``serve(connection)`` runs on a worker thread once the
    connection has sent its first bytes and returns whether to keep it open (keep-alive); a kept
    connection waits here, idle, for its next request. ``serve_forever`` runs the selector until
    ``shutdown``."""

    ACCEPT_PAUSE_S = 0.1  # out of file descriptors: accepting waits this long before trying again
    ACCEPTS_PER_TURN = 64
    FIRST_READ = 65536

    def __init__(self, listener: socket.socket, serve: Callable[[Connection], bool], *, max_connections: int,
                 handshake_timeout_s: float, idle_timeout_s: float, tls: ssl.SSLContext | None = None,
                 name: str = "http") -> None:
        listener.setblocking(False)
        self._listener, self._serve, self._tls, self._max = listener, serve, tls, max_connections
        self._handshaking, self._waiting = _Idle(handshake_timeout_s), _Idle(idle_timeout_s)
        self.open = 0  # connections open: idle here, or with a worker
        self._workers = Workers(max_connections, name)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._returned: collections.deque[tuple[Connection, bool]] = collections.deque()  # from workers: still open?
        self._lock = threading.Lock()  # the returned connections and whether the selector still runs
        self._stopping = self._stopped = False
        self._accepting_again: float | None = None  # paused, out of file descriptors, until then
        self._accept_failing = False  # until every waiting connection is accepted again: said once
        self._made_room = self._refused = 0  # since each was last logged

    @property
    def idle(self) -> int:
        """Connections open without a request in flight (handshaking, or waiting for one)."""
        return len(self._handshaking) + len(self._waiting)

    @property
    def threads(self) -> int:
        return self._workers.alive

    def serve_forever(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping:
                for key, _ in self._selector.select(self._timeout()):
                    self._on_event(key)
                self._expire(time.monotonic())
        finally:
            self._close_all()

    def _on_event(self, key: selectors.SelectorKey) -> None:
        try:
            if key.fileobj is self._listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._take_back()
            elif key.data in self._handshaking:  # still idle: not closed nor handed over in this turn
                self._handshake(key.data)
            elif key.data in self._waiting:
                self._read_first(key.data)
        except Exception:  # a bug must not stop the server: that connection is closed, the others served
            log.exception("connection handling failed", reason="connection-failed")
            if isinstance(key.data, Connection) and (key.data in self._handshaking or key.data in self._waiting):
                self._close(key.data)

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (from another thread); every connection is closed as its request ends."""
        self._stopping = True
        self._wake()

    def _timeout(self) -> float | None:
        deadlines = [d for d in (self._handshaking.deadline(), self._waiting.deadline(), self._accepting_again)
                     if d is not None]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    # --- accepting ---------------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(self.ACCEPTS_PER_TURN):
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                self._accept_failing = False  # caught up: every connection waiting was accepted
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause_accepting(exc)
                    return
                continue  # that one connection failed (reset before it was accepted)
            if self.open >= self._max and not self._make_room():
                self._refuse(sock)
                continue
            self._admit(sock, address)

    def _pause_accepting(self, exc: OSError) -> None:
        """The listening socket stays readable while connections wait: do not spin on it."""
        if not self._accept_failing:
            log.warning("cannot accept connections; pausing between tries", reason="accept-failed",
                        error=exc.strerror)
        self._accept_failing = True
        self._selector.unregister(self._listener)
        self._accepting_again = time.monotonic() + self.ACCEPT_PAUSE_S

    def _admit(self, sock: socket.socket, address: tuple[str, int]) -> None:
        self.open += 1
        sock.setblocking(False)
        connection = Connection(sock, address, time.monotonic())
        self._selector.register(connection.fd, selectors.EVENT_READ, connection)
        if self._tls is None:
            self._wait_for_request(connection)
        else:
            self._handshaking.add(connection)  # wrapped in TLS once its first bytes come (see _handshake)

    def _make_room(self) -> bool:
        """Close an idle connection for a new one: the one longest in its TLS handshake (nobody yet), else
        the one longest without a request; False when every one has a request in flight."""
        idle = self._handshaking.oldest() or self._waiting.oldest()
        if idle is None:
            return False
        self._close(idle)
        self._made_room += 1
        if self._made_room in (1, 100) or self._made_room % 1000 == 0:
            log.warning("all connections taken; closing the longest idle for each new one", reason="connection-limit",
                        closed=self._made_room)
        self._refused = 0
        return True

    def _refuse(self, sock: socket.socket) -> None:
        sock.close()
        self._refused += 1
        if self._refused in (1, 100) or self._refused % 1000 == 0:
            log.warning("too many requests in flight; closing new connections", reason="connection-limit",
                        refused=self._refused)
        self._made_room = 0

    # --- idle connections: the handshake, then the wait for a request ------------------------------

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
            self._close(connection)
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
            self._close(connection)
            return
        self._waiting.discard(connection)
        self._selector.unregister(connection.fd)
        connection.first_bytes = data
        connection.sock.setblocking(True)  # the worker bounds each read and write itself
        self._workers.submit(functools.partial(self._work, connection))

    def _expire(self, now: float) -> None:
        for connection in self._handshaking.expired(now):
            log.debug("TLS handshake not finished in time", reason="tls-refused", client=connection.address[0])
            self._close(connection)
        for connection in self._waiting.expired(now):
            self._close(connection)
        if self._accepting_again is not None and self._accepting_again <= now and not self._stopping:
            self._accepting_again = None
            self._selector.register(self._listener, selectors.EVENT_READ)

    def _close(self, connection: Connection) -> None:
        self._handshaking.discard(connection)
        self._waiting.discard(connection)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.fd)
        connection.sock.close()
        self.open -= 1

    # --- connections with a request in flight ------------------------------------------------------

    def _work(self, connection: Connection) -> None:
        """On a worker thread: serve the connection, then give it back to the selector."""
        keep = False
        try:
            keep = self._serve(connection)
        except Exception:  # a failed connection is closed; the server serves on
            log.debug("connection failed", reason="connection-failed", client=connection.address[0], exc_info=True)
        with self._lock:
            keep = keep and not self._stopped
            if not keep:
                _finish(connection.sock)  # now, not on the selector's next turn: the client waits for it
            if not self._stopped:
                self._returned.append((connection, keep))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: the selector wakes anyway
            self._wake_w.send(b"\0")

    def _take_back(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        while self._returned:
            connection, kept = self._returned.popleft()
            if not kept:
                self.open -= 1
                continue
            connection.first_bytes = b""
            connection.sock.setblocking(False)
            self._selector.register(connection.fd, selectors.EVENT_READ, connection)
            self._wait_for_request(connection)

    def _close_all(self) -> None:
        with self._lock:
            self._stopped = True
            returned, self._returned = self._returned, collections.deque()
        for connection, kept in returned:
            if kept:
                connection.sock.close()
        for idle in (self._handshaking, self._waiting):
            while (oldest := idle.oldest()) is not None:
                self._close(oldest)
        self._workers.close()
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
