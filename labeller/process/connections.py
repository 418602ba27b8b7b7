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
that never authenticate cannot keep out one that does, nor push its idle keep-alive connections out.

The parts: ``_Acceptor`` (the listening socket), ``_Slots`` (the limit, and its warnings),
``idleconnections`` (handshakes and the waits for a request, with their deadlines), ``workers`` (the
threads) and ``_HandBack`` (connections given back by the workers); ``ConnectionServer`` runs the
selector over them."""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

from labeller.process.idleconnections import Connection, IdleConnections
from labeller.process.workers import Workers
from labeller.base.log import get_logger

log = get_logger(__name__)

_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class _Acceptor:
    """The listening socket, watched by ``selector``: a turn accepts the connections waiting, up to
    ``ACCEPTS_PER_TURN``. Out of file descriptors, it leaves the selector for ``ACCEPT_PAUSE_S``: the
    listening socket stays readable while connections wait, and must not be spun on."""

    ACCEPT_PAUSE_S = 0.1
    ACCEPTS_PER_TURN = 64

    def __init__(self, listener: socket.socket, selector: selectors.BaseSelector) -> None:
        listener.setblocking(False)
        self.listener, self._selector = listener, selector
        self.paused_until: float | None = None
        self._failing = False  # until every waiting connection is accepted again: said once

    def start(self) -> None:
        self._selector.register(self.listener, selectors.EVENT_READ)

    def accepted(self) -> Iterator[tuple[socket.socket, tuple[str, int]]]:
        for _ in range(self.ACCEPTS_PER_TURN):
            try:
                sock, address = self.listener.accept()
            except BlockingIOError:
                self._failing = False  # caught up: every connection waiting was accepted
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause(exc)
                    return
                continue  # that one connection failed (reset before it was accepted)
            yield sock, address

    def resume_when_due(self, now: float) -> None:
        if self.paused_until is not None and self.paused_until <= now:
            self.paused_until = None
            self._selector.register(self.listener, selectors.EVENT_READ)

    def _pause(self, exc: OSError) -> None:
        if not self._failing:
            log.warning("cannot accept connections; pausing between tries", reason="accept-failed",
                        error=exc.strerror)
        self._failing = True
        self._selector.unregister(self.listener)
        self.paused_until = time.monotonic() + self.ACCEPT_PAUSE_S


class _Slots:
    """Connections open (idle, or with a worker), at most ``most``; and the warnings when all are taken,
    at the first, the 100th and every 1,000th connection closed (an idle one to make room, or the new
    one), each count starting again when the other kind happens."""

    def __init__(self, most: int) -> None:
        self.most, self.open = most, 0
        self._made_room = self._refused = 0  # since each was last logged

    @property
    def full(self) -> bool:
        return self.open >= self.most

    def take(self) -> None:
        self.open += 1

    def free(self) -> None:
        self.open -= 1

    def made_room(self) -> None:
        self._made_room += 1
        if self._made_room in (1, 100) or self._made_room % 1000 == 0:
            log.warning("all connections taken; closing the longest idle for each new one", reason="connection-limit",
                        closed=self._made_room)
        self._refused = 0

    def refuse(self, sock: socket.socket) -> None:
        sock.close()
        self._refused += 1
        if self._refused in (1, 100) or self._refused % 1000 == 0:
            log.warning("too many requests in flight; closing new connections", reason="connection-limit",
                        refused=self._refused)
        self._made_room = 0


def _finish(sock: socket.socket) -> None:
    """Close a connection that was answered: the end of the answer (FIN) first, as socketserver does,
    so that a client still sending (a body refused unread) reads the whole answer, not a reset."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    sock.close()


class _HandBack:
    """Connections the workers give back to the selector thread, each with whether it stays open, and
    the socket pair that wakes the selector (``waker``, which it watches) to take them."""

    def __init__(self) -> None:
        self.waker, self._wake_w = socket.socketpair()
        for sock in (self.waker, self._wake_w):
            sock.setblocking(False)
        self._returned: collections.deque[tuple[Connection, bool]] = collections.deque()
        self._lock = threading.Lock()  # the returned connections and whether the selector still takes them
        self._stopped = False

    def give_back(self, connection: Connection, keep: bool) -> None:
        """On a worker thread: a connection closed here is closed now, not on the selector's next turn,
        as the client waits for it."""
        with self._lock:
            keep = keep and not self._stopped
            if not keep:
                _finish(connection.sock)
            if not self._stopped:
                self._returned.append((connection, keep))
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full: the selector wakes anyway
            self._wake_w.send(b"\0")

    def taken(self) -> Iterator[tuple[Connection, bool]]:
        with contextlib.suppress(OSError):
            while self.waker.recv(4096):
                pass
        while self._returned:
            yield self._returned.popleft()

    def stop(self) -> None:
        """No more connections are taken: those given back and kept are closed, and any given back later."""
        with self._lock:
            self._stopped = True
            returned, self._returned = self._returned, collections.deque()
        for connection, kept in returned:
            if kept:
                connection.sock.close()

    def close(self) -> None:
        self.waker.close()
        self._wake_w.close()


class ConnectionServer:
    """Serves the connections of ``listener``: ``serve(connection)`` runs on a worker thread once the
    connection has sent its first bytes and returns whether to keep it open (keep-alive); a kept
    connection waits here, idle, for its next request. ``serve_forever`` runs the selector until
    ``shutdown``."""

    def __init__(self, listener: socket.socket, serve: Callable[[Connection], bool], *, max_connections: int,
                 handshake_timeout_s: float, idle_timeout_s: float, tls: ssl.SSLContext | None = None,
                 name: str = "http") -> None:
        self._serve = serve
        self._selector = selectors.DefaultSelector()
        self._acceptor = _Acceptor(listener, self._selector)
        self._slots = _Slots(max_connections)
        self._idle = IdleConnections(self._selector, tls, handshake_timeout_s=handshake_timeout_s,
                                     idle_timeout_s=idle_timeout_s, on_request=self._hand_over,
                                     on_close=self._slots.free)
        self._workers = Workers(max_connections, name)
        self._hand_back = _HandBack()
        self._stopping = False

    @property
    def open(self) -> int:
        """Connections open: idle here, or with a worker."""
        return self._slots.open

    @property
    def idle(self) -> int:
        """Connections open without a request in flight (handshaking, or waiting for one)."""
        return len(self._idle)

    @property
    def threads(self) -> int:
        return self._workers.alive

    def serve_forever(self) -> None:
        self._acceptor.start()
        self._selector.register(self._hand_back.waker, selectors.EVENT_READ)
        try:
            while not self._stopping:
                for key, _ in self._selector.select(self._timeout()):
                    self._on_event(key)
                now = time.monotonic()
                self._idle.expire(now)
                if not self._stopping:
                    self._acceptor.resume_when_due(now)
        finally:
            self._close_all()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (from another thread); every connection is closed as its request ends."""
        self._stopping = True
        self._hand_back.wake()

    def _timeout(self) -> float | None:
        deadlines = [d for d in (*self._idle.deadlines(), self._acceptor.paused_until) if d is not None]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _on_event(self, key: selectors.SelectorKey) -> None:
        try:
            if key.fileobj is self._acceptor.listener:
                self._accept()
            elif key.fileobj is self._hand_back.waker:
                self._take_back()
            else:
                self._idle.on_event(key.data)
        except Exception:  # a bug must not stop the server: that connection is closed, the others served
            log.exception("connection handling failed", reason="connection-failed")
            if isinstance(key.data, Connection) and key.data in self._idle:
                self._idle.close(key.data)

    def _accept(self) -> None:
        for sock, address in self._acceptor.accepted():
            if self._slots.full and not self._make_room():
                self._slots.refuse(sock)
                continue
            self._slots.take()
            sock.setblocking(False)
            self._idle.add(Connection(sock, address, time.monotonic()))

    def _make_room(self) -> bool:
        """Close an idle connection for a new one (see ``IdleConnections.oldest``); False when every one
        has a request in flight."""
        idle = self._idle.oldest()
        if idle is None:
            return False
        self._idle.close(idle)
        self._slots.made_room()
        return True

    # --- connections with a request in flight ------------------------------------------------------

    def _hand_over(self, connection: Connection) -> None:
        self._workers.submit(functools.partial(self._work, connection))

    def _work(self, connection: Connection) -> None:
        """On a worker thread: serve the connection, then give it back to the selector."""
        keep = False
        try:
            keep = self._serve(connection)
        except Exception:  # a failed connection is closed; the server serves on
            log.debug("connection failed", reason="connection-failed", client=connection.address[0], exc_info=True)
        self._hand_back.give_back(connection, keep)

    def _take_back(self) -> None:
        for connection, kept in self._hand_back.taken():
            if kept:
                self._idle.add_back(connection)
            else:
                self._slots.free()

    def _close_all(self) -> None:
        self._hand_back.stop()
        self._idle.close_all()
        self._workers.close()
        self._selector.close()
        self._acceptor.listener.close()
        self._hand_back.close()
