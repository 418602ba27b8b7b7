"""Plumbing the long-running commands share, below every layer that knows GPUs or clusters:
signals taken on the main thread while the work runs on another, backoff with jitter, and the
HTTP server for ``/healthz``, ``/readyz``, ``/metrics`` (and the extender's API)."""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    thread = threading.Thread(target=target, name="process-loop")
    try:
        thread.start()
        while not done.is_set():
            select.select([wakeup_r], [], [])
            with contextlib.suppress(BlockingIOError):
                for signum in os.read(wakeup_r, 512):
                    if signum:
                        log.info("signal received", reason="signal", signal=signal.Signals(signum).name)
                        (reload if signum in RELOAD_SIGNALS else stop)()
        thread.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
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


def _handler(ready: Callable[[], bool], healthy: Callable[[], bool],
             registry: CollectorRegistry | None, app: App | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length
        disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answer = app("POST", self.path.split("?", 1)[0], body) if app is not None else None
            self._answer(*answer if answer is not None else (404, b"not found\n"))

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            answer = app("GET", path, b"") if app is not None else None
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
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a scheduler's burst of extender calls must not be refused


def start_http_server(port: int, bind: str = "0.0.0.0", ready: Callable[[], bool] = lambda: True,
                      healthy: Callable[[], bool] = lambda: True,
                      registry: CollectorRegistry | None = None, app: App | None = None,
                      flag: str = "--metrics-port") -> HealthServer:
    """Serve /healthz, /readyz and /metrics (when ``registry`` is given), and ``app`` before them, on
    a daemon thread.

    Raises PortUnavailable naming the address (and the ``flag`` that chose it) when it cannot be bound."""
    try:
        server = _Server((bind, port), _handler(ready, healthy, registry, app))
    except OSError as exc:
        raise PortUnavailable(f"{flag} {port}: cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    thread = threading.Thread(target=server.serve_forever, name=f"http-{port}", daemon=True)
    thread.start()
    return HealthServer(server, thread)
