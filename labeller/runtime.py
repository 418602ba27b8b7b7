"""Plumbing the long-running commands share, below every layer that knows GPUs or clusters:
signals taken on the main thread while the work runs on another, backoff with jitter, and the
HTTP server for ``/healthz``, ``/readyz``, ``/metrics`` (and the extender's API)."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import random
import select
import selectors
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from labeller.errors import InputError


log = structlog.get_logger(__name__)
T = TypeVar("T")


# --- signals -------------------------------------------------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNALS = (signal.SIGHUP,)


_deferred: list[int] = []  # SIGTERM and SIGHUP that came while a server was starting
_before_deferring: dict[int, Any] = {}  # their handlers before ``defer_signals``: put back when serving ends


def _defer(signum: int, frame: FrameType | None) -> None:
    _deferred.append(signum)  # list.append takes no lock a handler could wait on


def defer_signals() -> None:
    """For a server, from its command's start until ``run_until_signalled`` takes over: SIGTERM and
    SIGHUP are kept, not fatal, and acted on as soon as it serves (a stop during start-up is a clean
    stop, exit 0, not death by the signal)."""
    for signum in (signal.SIGTERM, *RELOAD_SIGNALS):
        _before_deferring.setdefault(signum, signal.signal(signum, _defer))


def _noted(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler does nothing: the signal's number reaches the wakeup pipe anyway."""


def run_until_signalled(body: Callable[[], T], stop: Callable[[], None], reload: Callable[[], None]) -> T:
    """``body()`` on a thread of its own, its result (or its exception) returned here; meanwhile the
    main thread takes the signals: SIGTERM and SIGINT call ``stop``, SIGHUP calls ``reload``.

    Python runs a signal handler on the main thread between two bytecodes, whatever that thread is
    doing, even inside ``Event.set`` or inside another handler: a handler that takes a lock (every
    ``Event`` has one) can wait forever for its own thread. So the handlers here do nothing; each
    signal's number reaches a pipe (``signal.set_wakeup_fd``) that the main thread waits on, and the
    main thread calls ``stop`` and ``reload`` as ordinary code, one signal after the other."""
    wakeup_r, wakeup_w = os.pipe()
    for fd in (wakeup_r, wakeup_w):
        os.set_blocking(fd, False)
    results: list[T] = []
    raised: list[BaseException] = []
    done = threading.Event()  # only read here, with is_set, which takes no lock

    def target() -> None:
        try:
            results.append(body())
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread as it is
            raised.append(exc)
        finally:
            done.set()
            os.write(wakeup_w, b"\0")  # not a signal number: wakes the main thread to see ``done``

    previous_fd = signal.set_wakeup_fd(wakeup_w, warn_on_full_buffer=False)
    previous = {signum: signal.signal(signum, _noted) for signum in (*STOP_SIGNALS, *RELOAD_SIGNALS)}
    deferred, _deferred[:] = bytes(_deferred), []
    if deferred:
        os.write(wakeup_w, deferred)  # as if they came now
    thread = threading.Thread(target=target, name="process-loop")
    try:
        thread.start()
        while not done.is_set():
            select.select([wakeup_r], [], [])
            with contextlib.suppress(BlockingIOError):
                for signum in os.read(wakeup_r, 512):
                    if signum:
                        (reload if signum in RELOAD_SIGNALS else stop)()  # before the log line, which may fail
                        log.info("signal received", reason="signal", signal=signal.Signals(signum).name)
        thread.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, _before_deferring.pop(signum, handler))
        signal.set_wakeup_fd(previous_fd)
        os.close(wakeup_r)
        os.close(wakeup_w)
    if raised:
        raise raised[0]
    return results[0]


# --- backoff -------------------------------------------------------------------------------------

class Backoff:
    """Retry delays with full jitter: ``next()`` in [base/2, ceiling], the ceiling doubling from
    ``base_s``. While failures have lasted less than ``quick_for_s`` the ceiling stops at
    ``quick_cap_s`` (retry fast through a short outage), then it doubles on up to ``cap_s``.
    ``attempts`` counts the failures since the last ``reset()``."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 30.0, rng: random.Random | None = None, *,
                 quick_cap_s: float = 1.0, quick_for_s: float = 0.0) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self.quick_cap_s, self.quick_for_s = quick_cap_s, quick_for_s
        self.attempts = 0
        self.failing_since: float | None = None
        self._doublings = 0  # stops growing at the ceiling, so leaving the quick phase doubles from there
        self._rng = rng or random.Random()

    def next(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        if self.failing_since is None:
            self.failing_since = now
        self.attempts += 1
        limit = self.quick_cap_s if now - self.failing_since < self.quick_for_s else self.cap_s
        ceiling = min(limit, self.base_s * 2.0 ** self._doublings)
        if ceiling < limit:
            self._doublings += 1
        return float(self._rng.uniform(min(self.base_s / 2, ceiling), ceiling))

    def reset(self) -> None:
        self.attempts = self._doublings = 0
        self.failing_since = None



# --- health and metrics over HTTP ----------------------------------------------------------------

class PortUnavailable(InputError, OSError):
    """The health/metrics port cannot be bound (in use, no permission); the message is one line."""


@dataclass(frozen=True)
class HttpLimits:
    """What clients may take of an HTTP server: a request body's size, the time to send one request
    (TLS handshake, headers and body; also how long an idle keep-alive connection stays open), and
    connections open at once (beyond: closed as soon as accepted)."""

    max_body_bytes: int = 4 << 20
    request_timeout_s: float = 10.0
    max_connections: int = 256


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


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each waiting only for what is left of one deadline per request: a client that
    sends a byte now and then cannot hold a connection longer than the request timeout."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self._sock, self._timeout_s = sock, timeout_s
        self.restart()

    def restart(self) -> None:
        self._deadline = time.monotonic() + self._timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took longer than the request timeout")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class TlsUnavailable(InputError):
    """A certificate, key or CA file cannot be read or used; the message is one line."""


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


class HealthServer:
    """A running health/metrics server; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._server, self._thread = server, thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


Answer = tuple[int, bytes, str]  # HTTP code, body, content type
# An application served beside the health endpoints: (method, path, body) -> its answer, None for 404.
App = Callable[[str, str, bytes], "Answer | None"]


def _handler(ready: Callable[[], bool], healthy: Callable[[], bool], registry: CollectorRegistry | None,
             app: App | None, limits: HttpLimits, tls: ssl.SSLContext | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length
        disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall
        refused = False  # the TLS handshake failed: nothing is read or answered

        def log_message(self, format: str, *args: Any) -> None:
            return

        def setup(self) -> None:
            self.request.settimeout(limits.request_timeout_s)  # CPython bounds the whole handshake by it
            if tls is not None:
                try:
                    self.request = tls.wrap_socket(self.request, server_side=True)
                except (OSError, ValueError) as exc:
                    self.refused = True
                    log.info("TLS handshake refused", reason="tls-refused", client=self.client_address[0],
                             error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                    return  # the socket is closed: no files to make on it
            super().setup()
            self._reader = _DeadlineReader(self.connection, limits.request_timeout_s)
            self.rfile = io.BufferedReader(self._reader)

        def handle(self) -> None:
            if not self.refused:
                super().handle()

        def finish(self) -> None:
            if self.refused:
                return
            try:
                super().finish()
            finally:
                if tls is not None:
                    self.connection.close()

        def handle_one_request(self) -> None:
            self._reader.restart()
            super().handle_one_request()

        def _body(self) -> bytes | None:
            """The request's body, or None once it was refused: no usable Content-Length, or over the cap."""
            length = self.headers.get("Content-Length")
            refusal = (411, "a Content-Length is required\n") if length is None else (
                (400, f"Content-Length {length!r} is not a length\n") if not length.strip().isdigit() else
                (413, f"body of {int(length)} bytes is over the limit of {limits.max_body_bytes} (--max-body-bytes)\n")
                if int(length) > limits.max_body_bytes else None)
            if refusal is not None:
                self.close_connection = True  # the body is not read: nothing more on this connection is
                self._answer(refusal[0], refusal[1].encode())
                return None
            body = self.rfile.read(int(length or 0))
            if len(body) < int(length or 0):
                self.close_connection = True
                return None
            return body

        def do_POST(self) -> None:
            body = self._body()
            if body is None:
                return
            answer = self._call("POST", body)
            self._answer(*answer if answer is not None else (404, b"not found\n"))

        def _call(self, method: str, body: bytes) -> Answer | None:
            if app is None:
                return None
            try:
                return app(method, self.path.split("?", 1)[0], body)
            except Exception:  # one line to the client, the traceback to the log
                log.exception("request failed", reason="request-failed", path=self.path.split("?", 1)[0])
                return 500, b"internal error\n", "text/plain; charset=utf-8"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            answer = self._call("GET", b"")
            if answer is not None:
                self._answer(*answer)
            elif path == "/healthz":
                self._answer(*(200, b"ok\n") if healthy() else (503, b"loop stalled\n"))
            elif path == "/readyz":
                self._answer(*(200, b"ready\n") if ready() else (503, b"not ready\n"))
            elif path == "/metrics" and registry is not None:
                self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._answer(404, b"not found\n")

        def _answer(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.connection.settimeout(limits.request_timeout_s)
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    return Handler


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once: one more is closed as soon as it
    is accepted. Out of file descriptors, the accept loop pauses instead of spinning. Idle, it sleeps
    until a connection comes or ``shutdown`` writes to its wake-up pipe (the standard loop wakes every
    half second to see whether it should stop)."""

    daemon_threads = True
    request_queue_size = 128  # a scheduler's burst of extender calls must not be refused
    ACCEPT_PAUSE_S = 0.1

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._refused_since_log = 0
        self._accept_failing = False
        self._stopping = False
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        try:
            super().__init__(address, handler)
        except BaseException:
            self._close_pipe()
            raise

    def serve_forever(self, poll_interval: float = 0.5) -> None:  # the interval is not used: see the class
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._stopping:
                    ready = {key.fileobj for key, _ in selector.select()}
                    if self in ready and not self._stopping:
                        self.handle_request()  # a connection is waiting: it does not block
                    self.service_actions()
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        self._stopping = True
        if self._wake_w >= 0:  # else closed already (a second close): the loop has ended
            os.write(self._wake_w, b"\0")
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._close_pipe()

    def _close_pipe(self) -> None:
        fds, (self._wake_r, self._wake_w) = (self._wake_r, self._wake_w), (-1, -1)
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def get_request(self) -> tuple[Any, Any]:
        try:
            accepted = super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                if not self._accept_failing:
                    log.warning("cannot accept connections; pausing between tries", reason="accept-failed",
                                error=exc.strerror)
                self._accept_failing = True
                time.sleep(self.ACCEPT_PAUSE_S)  # the listening socket stays readable: do not spin on it
            raise
        self._accept_failing = False
        return accepted

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refused_since_log += 1
            if self._refused_since_log in (1, 100) or self._refused_since_log % 1000 == 0:
                log.warning("too many connections; closing new ones", reason="connection-limit",
                            refused=self._refused_since_log)
            self.shutdown_request(request)
            return
        self._refused_since_log = 0
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection failed", reason="connection-failed", client=str(client_address), exc_info=True)


def start_http_server(port: int, bind: str = "0.0.0.0", ready: Callable[[], bool] = lambda: True,
                      healthy: Callable[[], bool] = lambda: True,
                      registry: CollectorRegistry | None = None, app: App | None = None,
                      flag: str = "--metrics-port", limits: HttpLimits = HttpLimits(),
                      tls: ssl.SSLContext | None = None) -> HealthServer:
    """Serve /healthz, /readyz and /metrics (when ``registry`` is given), and ``app`` before them, on
    a daemon thread; over TLS when ``tls`` is given (the handshake happens on the connection's thread).

    Raises PortUnavailable naming the address (and the ``flag`` that chose it) when it cannot be bound."""
    try:
        server = _Server((bind, port), _handler(ready, healthy, registry, app, limits, tls), limits.max_connections)
    except OSError as exc:
        raise PortUnavailable(f"{flag} {port}: cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    thread = threading.Thread(target=server.serve_forever, name=f"http-{server.server_address[1]}", daemon=True)
    thread.start()
    return HealthServer(server, thread)
