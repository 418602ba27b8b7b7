"""Keeps every resource served and registered: registration with backoff, kubelet restarts, lost sockets.

A supervisor loop polls the socket directory every ``tick_seconds`` (0.1 s: a few ``stat`` calls):

- ``kubelet.sock`` appears or is replaced (a kubelet (re)start): register every resource again,
  at once, after re-creating any plugin socket the kubelet deleted;
- a plugin socket is missing or replaced: re-create it and register again;
- a registration that fails is retried with exponential backoff (0.1 s doubling to 5 s), so
  starting before the kubelet is fine.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from labeller.plugin.api import api_pb2 as pb
from labeller.plugin.api import api_pb2_grpc as pb_grpc
from labeller.plugin.metrics import PluginMetrics
from labeller.plugin.server import OPTIONS, SocketServer

log = structlog.get_logger(__name__)

VERSION = "v1beta1"
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0
REGISTER_TIMEOUT = 5.0


@dataclass
class _State:
    registered: bool = False
    next_attempt: float = 0.0
    backoff: float = FIRST_BACKOFF


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


class PluginManager:
    def __init__(self, servers: list[SocketServer], kubelet_socket: Path, metrics: PluginMetrics,
                 tick_seconds: float = 0.1):
        self.servers = servers
        self.kubelet_socket = kubelet_socket
        self._metrics = metrics
        self._tick_seconds = tick_seconds
        self._states = {id(s): _State() for s in servers}
        self._kubelet: tuple[int, int] | None = None
        self.last_tick = time.monotonic()

    @property
    def all_registered(self) -> bool:
        return all(state.registered for state in self._states.values())

    def start(self) -> None:
        for server in self.servers:
            server.start()
            log.info("serving", resource=server.service.resource.name, socket=str(server.path),
                     devices=len(server.service.resource.devices))

    def run(self, stop: threading.Event) -> None:
        """Supervise until ``stop`` is set."""
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # one bad tick must not end supervision: the next tick retries
                log.exception("supervisor tick failed; retrying")
            stop.wait(self._tick_seconds)

    def tick(self) -> None:
        self.last_tick = time.monotonic()
        kubelet = _identity(self.kubelet_socket)
        if kubelet is not None and kubelet != self._kubelet:
            log.info("kubelet socket (re)created; registering again", socket=str(self.kubelet_socket))
            for state in self._states.values():
                self._unregister(state, immediately=True)
        self._kubelet = kubelet
        for server in self.servers:
            state = self._states[id(server)]
            if not server.socket_ok():
                log.warning("plugin socket missing; re-creating it", resource=server.service.resource.name,
                            socket=str(server.path))
                server.restart()
                self._unregister(state, immediately=True)
            if kubelet is not None and not state.registered and time.monotonic() >= state.next_attempt:
                self._register(server, state)
        for server in self.servers:
            self._metrics.registered.labels(resource=server.service.resource.name).set(
                1 if self._states[id(server)].registered else 0)

    def _unregister(self, state: _State, immediately: bool) -> None:
        state.registered = False
        if immediately:
            state.next_attempt, state.backoff = 0.0, FIRST_BACKOFF

    def _register(self, server: SocketServer, state: _State) -> None:
        name = server.service.resource.name
        request = pb.RegisterRequest(version=VERSION, endpoint=server.endpoint, resource_name=name, options=OPTIONS)
        try:
            with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                stub.Register(request, timeout=REGISTER_TIMEOUT)
        except grpc.RpcError as exc:
            self._metrics.registrations.labels(resource=name, outcome="failed").inc()
            log.warning("registration failed; will retry", resource=name, retry_in_s=state.backoff,
                        error=f"{exc.code().name}: {exc.details()}")
            state.next_attempt = time.monotonic() + state.backoff
            state.backoff = min(state.backoff * 2, MAX_BACKOFF)
            return
        state.registered, state.backoff = True, FIRST_BACKOFF
        self._metrics.registrations.labels(resource=name, outcome="ok").inc()
        log.info("registered with the kubelet", resource=name, endpoint=server.endpoint, version=VERSION)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
            log.info("stopped", resource=server.service.resource.name, socket=str(server.path))
