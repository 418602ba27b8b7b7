"""The one way a long-running process on a node runs (``run``, ``device-plugin``, ``dra-plugin``,
``mps-control-daemon``): its command declares a ``Process`` (its node options, endpoint, metrics and
the service it serves on the host) and calls ``serve``, which does the rest, the same for each:

- SIGTERM and SIGHUP that come while it starts are kept and acted on once it serves (``signals``);
- the node's name (--node-name), where given, is on the log lines of its start, config and stop;
- with --config-dir, the named configs and the node's config label are followed (``follow``);
- the host is opened with the config in force, the service built on it, and the config reported;
- the service runs on the one loop (``loop``), reloaded by SIGHUP and by a changed config, and
  stopped by SIGTERM or SIGINT;
- ``/healthz``, ``/readyz`` and ``/metrics`` answer on its port meanwhile;
- the exit code: 0 after a clean stop (logged), else the service's (``flags.failOnInitError``).

Bad input (a config, a flag's value, a port in use) is an ``InputError``, which the command line
prints as one line with exit code 2."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import structlog
from prometheus_client import CollectorRegistry

from labeller.host.machine import Host, NodeOptions, open_host
from labeller.model.namedconfigs import Selection
from labeller.process.configsource import ConfigSource
from labeller.process.follow import ConfigFollower, ConfigMetrics, follow_own_node
from labeller.process.httpserver import start_http_server
from labeller.process.loop import LoopOptions, ProcessLoop, Service
from labeller.process.signals import restore_signals, run_until_signalled, signals_deferred
from labeller.base.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Endpoint:
    """Where a process's /healthz, /readyz and /metrics listen (--metrics-port, --metrics-bind)."""

    port: int
    bind: str = "0.0.0.0"


@dataclass
class Served:
    """What a process serves once its host is open: its service on the loop, and how the loop and the
    endpoints see it. /readyz is the service's ``ready``."""

    service: Service
    options: LoopOptions = field(default_factory=LoopOptions)
    inputs: Callable[[], object] | None = None  # what the offer reads besides the hardware (ProcessLoop)
    inputs_polled: Callable[[], bool] = lambda: True  # some of them can change with no one waking the loop
    healthy: Callable[[], bool] = lambda: True  # /healthz, besides the loop's own heartbeat
    fields: Mapping[str, object] = field(default_factory=dict)  # on the started line
    follow: Callable[[threading.Event], None] | None = None  # started once the loop exists, until the event
    once: Callable[[], int] | None = None  # instead of serving: do this, and exit with its code


# (the followed config metrics, the event set when serving ends) -> the follower and the config in force
Follow = Callable[[ConfigMetrics, threading.Event], tuple[ConfigFollower | None, Selection | None]]
# (the open host, the follower) -> the service, held (and closed) while it is served
ServiceOn = Callable[[Host, ConfigFollower | None], AbstractContextManager[Served]]


@dataclass(frozen=True)
class Process:
    """A long-running command, declared: see the module docstring. ``metrics_prefix`` names the
    followed config's metrics in ``registry`` (``<prefix>_config_*``); ``follow``, where given,
    replaces the default following of the own Node (``follow_own_node``)."""

    node: NodeOptions
    endpoint: Endpoint
    registry: CollectorRegistry
    metrics_prefix: str
    service: ServiceOn
    started: str = "started"
    stopped: str = "stopped"
    follow: Follow | None = None


def serve(process: Process) -> int:
    """Run ``process`` until it is stopped; its exit code (see the module docstring)."""
    name = process.node.node_name
    with structlog.contextvars.bound_contextvars(node=name) if name else contextlib.nullcontext():
        code, stopped = _serve(process)
        if stopped and code == 0:
            log.info(process.stopped, reason="stop")  # once everything it held is closed
        return code


def _serve(process: Process) -> tuple[int, bool]:
    """The exit code, and whether the process served until it stopped (else it ran once)."""
    stop = threading.Event()  # ends what follows the cluster beside the loop
    with contextlib.ExitStack() as held:  # closed in reverse: stop, the service, the host, the signals
        held.enter_context(signals_deferred())
        held.callback(stop.set)
        follower, selection = _follow(process, stop)
        host = held.enter_context(open_host(process.node, selection))
        served = held.enter_context(process.service(host, follower))
        held.callback(stop.set)  # before the service is closed
        if follower is not None:
            follower.apply(host)
        if served.once is not None:
            restore_signals(deliver_kept=True)
            return served.once(), False
        loop = ProcessLoop(served.service, served.options, inputs=served.inputs, inputs_polled=served.inputs_polled,
                           config=ConfigSource(host, process.node.config_path, follower))
        if served.follow is not None:
            served.follow(stop)
        return _serve_loop(loop, process, served), True


def _follow(process: Process, stop: threading.Event) -> tuple[ConfigFollower | None, Selection | None]:
    metrics = ConfigMetrics(process.registry, process.metrics_prefix)
    if process.follow is not None:
        return process.follow(metrics, stop)
    return follow_own_node(process.node, metrics, stop)


def readiness(loop: ProcessLoop, ready: Callable[[], bool]) -> Callable[[], bool]:
    """``/readyz``: the service is ready and its loop is not stuck in a turn (``ProcessLoop.responsive``)."""
    return lambda: loop.responsive() and ready()


def _serve_loop(loop: ProcessLoop, process: Process, served: Served) -> int:
    """Start the endpoints, log the started line (with the port), run the loop until a signal stops
    it; its exit code. PortUnavailable (one line naming the port) when the port cannot be bound."""
    http = start_http_server(process.endpoint.port, process.endpoint.bind,
                             ready=readiness(loop, lambda: served.service.ready),
                             healthy=lambda: loop.healthy() and served.healthy(), registry=process.registry)
    log.info(process.started, reason="start", port=http.port, **served.fields)
    try:
        return run_until_signalled(loop.run, loop.stop, loop.request_reload)
    finally:
        http.close()
