"""Prometheus metrics of the labelling daemon, and a small reusable health/metrics HTTP server.

``start_http_server(port, ready=..., healthy=..., registry=...)`` serves ``/healthz``, ``/readyz``
and ``/metrics`` from a daemon thread; the device plugin can reuse it with its own callables.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

if TYPE_CHECKING:
    from labeller.reconcile import ProbeResult

PROBE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The daemon's metrics, in their own registry (several daemons can live in one process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.probe_duration = Histogram("gpu_labeller_probe_duration_seconds", "Time to probe the hardware.",
                                        buckets=PROBE_BUCKETS, registry=r)
        self.probes = Counter("gpu_labeller_probes_total", "Hardware probes by outcome (ok, partial, failed).",
                              ["outcome"], registry=r)
        self.reconciles = Counter("gpu_labeller_reconciles_total", "Reconciles by outcome (unchanged, applied, "
                                  "dry-run, held, node-missing, not-ours, failed).", ["outcome"], registry=r)
        self.api_requests = Counter("gpu_labeller_api_requests_total", "Kubernetes API requests by verb and HTTP "
                                    "code (0: no answer).", ["verb", "code"], registry=r)
        self.writes = Counter("gpu_labeller_writes_total", "Label writes by outcome (success, error).",
                              ["outcome"], registry=r)
        self.labels_owned = Gauge("gpu_labeller_labels_owned", "Labels gpu-labeller manages on its node (it set them).",
                                  registry=r)
        self.foreign_labels = Gauge("gpu_labeller_foreign_labels", "Labels under gpu-labeller's prefixes that other "
                                    "managers set and gpu-labeller leaves alone.", registry=r)
        self.last_success = Gauge("gpu_labeller_last_success_timestamp_seconds",
                                  "Unix time of the last successful reconcile.", registry=r)
        self.fights = Counter("gpu_labeller_label_fights_total", "Times another writer was caught undoing an "
                              "owned label again and again (gpu-labeller then repairs it at a slowing pace).", registry=r)

    def observe_probe(self, result: ProbeResult) -> None:
        self.probe_duration.observe(result.duration_s)
        outcome = "failed" if result.error else "partial" if result.partial else "ok"
        self.probes.labels(outcome=outcome).inc()

    def observe_request(self, verb: str, code: int) -> None:
        self.api_requests.labels(verb=verb, code=str(code)).inc()


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


def _handler(ready: Callable[[], bool], healthy: Callable[[], bool],
             registry: CollectorRegistry | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
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


class PortUnavailable(OSError):
    """The health/metrics port cannot be bound (in use, no permission); the message is one line."""


def start_http_server(port: int, bind: str = "0.0.0.0", ready: Callable[[], bool] = lambda: True,
                      healthy: Callable[[], bool] = lambda: True,
                      registry: CollectorRegistry | None = None) -> HealthServer:
    """Serve /healthz, /readyz and /metrics (when ``registry`` is given) on a daemon thread.

    Raises PortUnavailable naming the address when it cannot be bound."""
    try:
        server = ThreadingHTTPServer((bind, port), _handler(ready, healthy, registry))
    except OSError as exc:
        raise PortUnavailable(f"--metrics-port {port}: cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name=f"http-{port}", daemon=True)
    thread.start()
    return HealthServer(server, thread)
