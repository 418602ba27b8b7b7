"""The HTTP server of every long-running process: ``/healthz``, ``/readyz``, ``/metrics``, and the
scheduler extender's API before them. HTTP/1.1 with keep-alive, over mutual TLS when asked, within
what ``HttpLimits`` lets a client take: a body's size, the time to send a request, the time to
finish a TLS handshake, and connections open at once. Connections are admitted by
``connections.ConnectionServer``: only one that has sent a request holds a thread."""

from __future__ import annotations

import contextlib
import functools
import io
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from labeller.base.errors import InputError
from labeller.process.connections import ConnectionServer
from labeller.process.idleconnections import Connection
from labeller.base.log import get_logger

log = get_logger(__name__)

class PortUnavailable(InputError, OSError):
    """The health/metrics port cannot be bound (in use, no permission); the message is one line."""


class TlsUnavailable(InputError):
    """A certificate, key or CA file cannot be read or used; the message is one line."""


@dataclass(frozen=True)
class HttpLimits:
    """What clients may take of an HTTP server: a request body's size; the time to send one request
    from its first byte (headers and body), also how long a connection may stay idle waiting for one;
    the time to finish a TLS handshake; and connections open at once (beyond: the one idle the
    longest is closed for the new one)."""

    max_body_bytes: int = 4 << 20
    request_timeout_s: float = 10.0
    max_connections: int = 256
    tls_handshake_timeout_s: float = 3.0


# A worker that answered a request waits this long for the next one on the same connection before it
# gives the connection back to the selector: back-to-back requests (filter, then prioritize) are read
# at once, as a thread per connection would, and an idle keep-alive connection soon holds no thread.
KEEP_ALIVE_LINGER_S = 0.25
LISTEN_BACKLOG = 128  # a scheduler's burst of extender calls must not be refused


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft limit of open files towards ``wanted`` (never above the hard limit,
    never lower than it is), as Go programs do at start; the soft limit in force after."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return int(soft)


def server_tls(cert_file: str, key_file: str, client_ca_file: str) -> ssl.SSLContext:
    """HTTPS that answers only clients whose certificate ``client_ca_file`` signed (TLS 1.2 or later)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsUnavailable(f"--tls-cert-file {cert_file}, --tls-key-file {key_file}: cannot be used: "
                             f"{_why(exc)}") from None
    try:
        context.load_verify_locations(client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsUnavailable(f"--client-ca-file {client_ca_file}: cannot be used: {_why(exc)}") from None
    return context


def _why(exc: OSError) -> str:
    return str(exc.strerror or exc) if not isinstance(exc, ssl.SSLError) else str(exc.reason or exc)


class _DeadlineReader(io.RawIOBase):
    """A connection's reads: first what the selector read already, then the socket, each read waiting
    only for what is left of one deadline per request, so a client that sends a byte now and then
    cannot hold a connection longer than the request timeout. While lingering (``linger``), a read
    that finds nothing in time returns None ("nothing yet") instead of failing."""

    def __init__(self, sock: socket.socket, timeout_s: float, first_bytes: bytes) -> None:
        self._sock, self._timeout_s, self._first = sock, timeout_s, memoryview(first_bytes)
        self.eof = False
        self.restart()

    def restart(self) -> None:
        self._deadline, self._lingering = time.monotonic() + self._timeout_s, False

    def linger(self, seconds: float) -> None:
        self._deadline, self._lingering = time.monotonic() + seconds, True

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        if self._first:
            count = min(len(buffer), len(self._first))
            buffer[:count], self._first = self._first[:count], self._first[count:]
            return count
        left = self._deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError("the request took longer than the request timeout")
            self._sock.settimeout(left)
            count = self._sock.recv_into(buffer)
        except TimeoutError:
            if self._lingering:
                return None
            raise
        self.eof = count == 0
        return count


Answer = tuple[int, bytes, str]  # HTTP code, body, content type
_TEXT = "text/plain; charset=utf-8"
# An application served beside the health endpoints: (method, path, body) -> its answer, None for 404.
App = Callable[[str, str, bytes], "Answer | None"]


@dataclass(frozen=True)
class _Site:
    """What a server answers: ``app`` first, then /healthz, /readyz and /metrics (with a ``registry``)."""

    ready: Callable[[], bool]
    healthy: Callable[[], bool]
    registry: CollectorRegistry | None
    app: App | None

    def call(self, method: str, path: str, body: bytes) -> Answer | None:
        """The app's answer; None when there is no app or it has none (404, or a health endpoint)."""
        if self.app is None:
            return None
        try:
            return self.app(method, path, body)
        except Exception:  # one line to the client, the traceback to the log
            log.exception("request failed", reason="request-failed", path=path)
            return 500, b"internal error\n", "text/plain; charset=utf-8"

    def health(self, path: str) -> Answer:
        """The answer to a GET the app has none for."""
        if path == "/healthz":
            return (200, b"ok\n", _TEXT) if self.healthy() else (503, b"loop stalled\n", _TEXT)
        if path == "/readyz":
            return (200, b"ready\n", _TEXT) if self.ready() else (503, b"not ready\n", _TEXT)
        if path == "/metrics" and self.registry is not None:
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        return 404, b"not found\n", _TEXT


def _body_refusal(length: str | None, most: int) -> tuple[int, str] | None:
    """Why a request's body is not read, from its Content-Length: none, not a length, or over ``most``."""
    if length is None:
        return 411, "a Content-Length is required\n"
    if not length.strip().isdigit():
        return 400, f"Content-Length {length!r} is not a length\n"
    if int(length) > most:
        return 413, f"body of {int(length)} bytes is over the limit of {most} (--max-body-bytes)\n"
    return None


class _Handler(BaseHTTPRequestHandler):
    """The requests of one connection that has sent its first bytes, answered from ``site`` within
    ``limits``, for as long as they come back to back (see ``KEEP_ALIVE_LINGER_S``); afterwards
    ``close_connection`` says whether the connection must be closed."""

    protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall

    def __init__(self, connection: Connection, site: _Site, limits: HttpLimits) -> None:
        # BaseRequestHandler.__init__ without the socketserver it would keep: there is none here
        self._site, self._limits, self._first_bytes = site, limits, connection.first_bytes
        self.request, self.client_address = connection.sock, connection.address
        self.setup()
        try:
            self.handle()
        finally:
            self.finish()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own file: reads go through the deadline instead
        self._reader = _DeadlineReader(self.connection, self._limits.request_timeout_s, self._first_bytes)
        self.rfile = self._buffered = io.BufferedReader(self._reader)

    def handle(self) -> None:
        self.close_connection = True  # until a request says otherwise
        self.handle_one_request()
        while not self.close_connection and self._next_request_comes():
            self.handle_one_request()

    def _next_request_comes(self) -> bool:
        """Whether the next request's bytes come within the linger (or are here already)."""
        self._reader.linger(KEEP_ALIVE_LINGER_S)
        if self._buffered.peek(1):
            return True
        self.close_connection = self._reader.eof
        return False

    def handle_one_request(self) -> None:
        self._reader.restart()
        super().handle_one_request()

    def do_POST(self) -> None:
        body = self._body()
        if body is None:
            return
        answer = self._site.call("POST", self.path.split("?", 1)[0], body)
        self._answer(*answer if answer is not None else (404, b"not found\n", _TEXT))

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        answer = self._site.call("GET", path, b"")
        self._answer(*answer if answer is not None else self._site.health(path))

    def _body(self) -> bytes | None:
        """The request's body, or None once it was refused: no usable Content-Length, or over the cap."""
        length = self.headers.get("Content-Length")
        refusal = _body_refusal(length, self._limits.max_body_bytes)
        if refusal is not None:
            self.close_connection = True  # the body is not read: nothing more on this connection is
            self._answer(refusal[0], refusal[1].encode(), _TEXT)
            return None
        body = self.rfile.read(int(length or 0))
        if len(body) < int(length or 0):
            self.close_connection = True
            return None
        return body

    def _answer(self, code: int, body: bytes, content_type: str) -> None:
        self.connection.settimeout(self._limits.request_timeout_s)
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def _serve(connection: Connection, site: _Site, limits: HttpLimits) -> bool:
    """``ConnectionServer``'s ``serve``: answer a connection's requests; whether to keep it open."""
    return not _Handler(connection, site, limits).close_connection


class HealthServer:
    """A running HTTP server; ``port`` is the bound port (useful with port 0), ``connections`` its
    connection admission (connections open, idle, threads)."""

    def __init__(self, connections: ConnectionServer, port: int, thread: threading.Thread) -> None:
        self.connections, self.port, self._thread = connections, port, thread

    def close(self) -> None:
        self.connections.shutdown()
        self._thread.join()


def start_http_server(port: int, bind: str = "0.0.0.0", ready: Callable[[], bool] = lambda: True,
                      healthy: Callable[[], bool] = lambda: True,
                      registry: CollectorRegistry | None = None, app: App | None = None,
                      flag: str = "--metrics-port", limits: HttpLimits = HttpLimits(),
                      tls: ssl.SSLContext | None = None) -> HealthServer:
    """Serve /healthz, /readyz and /metrics (when ``registry`` is given), and ``app`` before them, on
    a daemon thread; over TLS when ``tls`` is given.

    Raises PortUnavailable naming the address (and the ``flag`` that chose it) when it cannot be bound."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(LISTEN_BACKLOG)
    except OSError as exc:
        listener.close()
        raise PortUnavailable(f"{flag} {port}: cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    bound = int(listener.getsockname()[1])
    serve = functools.partial(_serve, site=_Site(ready, healthy, registry, app), limits=limits)
    connections = ConnectionServer(listener, serve,
                                   max_connections=limits.max_connections,
                                   handshake_timeout_s=limits.tls_handshake_timeout_s,
                                   idle_timeout_s=limits.request_timeout_s, tls=tls, name=f"http-{bound}")
    thread = threading.Thread(target=connections.serve_forever, name=f"http-{bound}", daemon=True)
    thread.start()
    return HealthServer(connections, bound, thread)
