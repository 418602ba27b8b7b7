"""The scheduler extender, running (``serve``): its cache fed by reflectors of the cluster's Nodes and
Pods, the binder, and the HTTP server of the extender API (``/gpushare-scheduler/...``) with
``/healthz``, ``/readyz`` and ``/metrics``, until SIGTERM or SIGINT."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from labeller.cluster.kube import Kube
from labeller.apps.extender.binder import Binder, BindOptions
from labeller.apps.extender.cache import ShareCache
from labeller.apps.extender.feed import Feed
from labeller.apps.extender.metrics import Metrics
from labeller.apps.extender.server import Extender
from labeller.process.httpserver import HealthServer, HttpLimits, start_http_server
from labeller.process.signals import run_until_signalled, signals_deferred
from labeller.base.log import get_logger

log = get_logger("gpu_labeller.extender")


@dataclass(frozen=True)
class Listen:
    """Where the extender listens: its API (and health and metrics) on ``port``, over mutual TLS when
    ``tls`` is given; health and metrics alone over plain HTTP on ``metrics_port``, when given."""

    port: int
    bind: str
    tls: ssl.SSLContext | None = None
    metrics_port: int | None = None
    limits: HttpLimits = HttpLimits()


def serve(make_kube: Callable[[Metrics], Kube], listen: Listen, options: BindOptions, watch_timeout_s: int) -> int:
    """Serve the extender until SIGTERM or SIGINT (a SIGTERM while it starts is acted on once it
    serves); exit code 0. PortUnavailable, or the cluster's error, when it cannot start."""
    with signals_deferred():
        running = start(make_kube, listen.port, listen.bind, options, watch_timeout_s, limits=listen.limits,
                        tls=listen.tls)
        try:
            if listen.metrics_port is not None:
                running.extra.append(start_http_server(listen.metrics_port, listen.bind, ready=running.http_ready,
                                                       registry=running.metrics.registry, flag="--metrics-port",
                                                       limits=listen.limits))
            if listen.tls is None:
                log.warning("serving without authentication: whoever reaches the port can bind pods; give "
                            "--tls-cert-file, --tls-key-file and --client-ca-file", reason="unauthenticated",
                            bind=listen.bind, port=running.http.port)
            log.info("started", reason="start", port=running.http.port, policy=options.policy,
                     tls=listen.tls is not None, metrics_port=listen.metrics_port)
            run_until_signalled(running.stop.wait, running.stop.set, lambda: None)
        finally:
            running.close()
    log.info("stopped", reason="stop")
    return 0


@dataclass
class Running:
    """A started extender: its cache, HTTP server (``http.port``) and the event that stops it."""

    cache: ShareCache
    metrics: Metrics
    binder: Binder
    feed: Feed
    http: HealthServer
    stop: threading.Event
    kube: Kube
    extra: list[HealthServer] = field(default_factory=list)  # the plain health and metrics port, when asked for

    def http_ready(self) -> bool:
        return len(self.cache.synced) == len(self.feed.sources)

    def close(self) -> None:
        self.stop.set()
        for server in (self.http, *self.extra):
            server.close()
        self.kube.close()


def start(make_kube: Callable[[Metrics], Kube], port: int, bind_address: str = "0.0.0.0",
          options: BindOptions = BindOptions(), watch_timeout_s: int = 300, limits: HttpLimits = HttpLimits(),
          tls: ssl.SSLContext | None = None) -> Running:
    """Serve the extender on ``port`` and follow the cluster; ready once every first list is in."""
    cache = ShareCache()
    metrics = Metrics(cache)
    kube = make_kube(metrics)
    binder = Binder(kube, cache, options, observe_wait=metrics.bind_wait.observe)
    stop = threading.Event()
    feed = Feed(kube, cache, stop, watch_timeout_s=watch_timeout_s)
    http = start_http_server(port, bind_address, ready=lambda: len(cache.synced) == len(feed.sources),
                             registry=metrics.registry, app=Extender(cache, binder, metrics), flag="--port",
                             limits=limits, tls=tls)
    feed.start()
    return Running(cache, metrics, binder, feed, http, stop, kube)
