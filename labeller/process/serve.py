"""How a long-running process is served: SIGTERM and SIGINT stop its loop, SIGHUP reloads it, and
``/healthz``, ``/readyz`` and ``/metrics`` answer on its port while it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry

from labeller.process.loop import ProcessLoop
from labeller.process.httpserver import start_http_server
from labeller.process.signals import run_until_signalled

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Endpoints:
    """Where the health and metrics server listens, and what it reports."""

    port: int
    bind: str
    registry: CollectorRegistry
    ready: Callable[[], bool]
    healthy: Callable[[], bool] = lambda: True


def readiness(loop: ProcessLoop, endpoints: Endpoints) -> Callable[[], bool]:
    """``/readyz``: the service is ready and its loop is not stuck in a turn (``ProcessLoop.responsive``)."""
    return lambda: loop.responsive() and endpoints.ready()


def serve(loop: ProcessLoop, endpoints: Endpoints, started: str = "started", **fields: object) -> int:
    """Install the signals, start the endpoints, log ``started`` (with the port and ``fields``), run
    the loop until it stops; its exit code.

    PortUnavailable (one line naming the port) when the port cannot be bound."""
    http = start_http_server(endpoints.port, endpoints.bind, ready=readiness(loop, endpoints),
                             healthy=lambda: loop.healthy() and endpoints.healthy(), registry=endpoints.registry)
    log.info(started, reason="start", port=http.port, **fields)
    try:
        return run_until_signalled(loop.run, loop.stop, loop.request_reload)
    finally:
        http.close()
