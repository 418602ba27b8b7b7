"""Keeps every served resource registered: registration with backoff, kubelet restarts, lost sockets.

``tick()`` runs on the plugin's supervisor thread every ``tick_seconds`` (0.1 s: a few ``stat``
calls), together with ``add`` and ``remove``, so none of them needs a lock:

- ``kubelet.sock`` appears or is replaced (a kubelet (re)start): register every resource again,
  at once, after re-creating any plugin socket the kubelet deleted;
- ``kubelet.sock`` missing: logged with its path after 1 s, then every ``missing_log_seconds``
  (60 s), so a plugin waiting for a kubelet that never comes says so;
- a plugin socket is missing or replaced: re-create it and register again;
- a registration that fails is retried with exponential backoff (0.1 s doubling to 5 s), so
  starting before the kubelet is fine;
- a plugin socket that cannot be created (a directory took its path) is one error line, and is
  tried again with the same backoff until it can.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from labeller.apps.plugin.api import api_pb2 as pb
from labeller.apps.plugin.api import api_pb2_grpc as pb_grpc
from labeller.apps.plugin.metrics import PluginMetrics
from labeller.apps.plugin.server import OPTIONS, ResourceSocket
from labeller.process.sockets import SocketRetry, SocketUnavailable, socket_identity
from labeller.base.log import get_logger

log = get_logger(__name__)

VERSION = "v1beta1"
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0
REGISTER_TIMEOUT = 5.0
KUBELET_MISSING_GRACE = 1.0  # a restarting kubelet re-creates its socket within this; no need to log it


@dataclass
class _State:
    registered: bool = False
    next_attempt: float = 0.0
    backoff: float = FIRST_BACKOFF
    socket: SocketRetry = field(default_factory=SocketRetry)  # while the socket cannot be created


class PluginManager:
    def __init__(self, kubelet_socket: Path, metrics: PluginMetrics, missing_log_seconds: float = 60.0):
        self.kubelet_socket = kubelet_socket
        self._metrics = metrics
        self._missing_log_seconds = missing_log_seconds
        # Replaced, never mutated, so that readers on other threads (``all_registered``) see a whole dict.
        self._servers: dict[str, ResourceSocket] = {}
        self._states: dict[str, _State] = {}
        self._kubelet: tuple[int, int] | None = None
        self._kubelet_missing_since: float | None = None
        self._kubelet_missing_logged: float | None = None

    @property
    def servers(self) -> list[ResourceSocket]:
        return list(self._servers.values())

    @property
    def all_registered(self) -> bool:
        return all(state.registered for state in self._states.values())

    def add(self, server: ResourceSocket) -> None:
        """Serve a new resource; the next tick registers it."""
        name = server.service.resource.name
        state = _State(socket=SocketRetry(resource=name, socket=str(server.path)))
        self._servers = {**self._servers, name: server}
        self._states = {**self._states, name: state}
        if self._start(server, state):
            log.info("serving", resource=name, vendor=server.service.resource.vendor, socket=str(server.path),
                     devices=len(server.service.resource.devices))

    @staticmethod
    def _start(server: ResourceSocket, state: _State) -> bool:
        """Create the socket; False (logged once per problem, tried again with backoff) when it cannot be."""
        try:
            server.start()
        except SocketUnavailable as exc:
            state.socket.failed(exc)
            return False
        state.socket.succeeded()
        return True

    def remove(self, name: str) -> None:
        """Stop serving a resource: its ListAndWatch streams end and its socket is removed."""
        server = self._servers[name]
        self._servers = {n: s for n, s in self._servers.items() if n != name}
        self._states = {n: s for n, s in self._states.items() if n != name}
        server.stop()
        log.info("stopped", resource=name, socket=str(server.path))
        try:
            self._metrics.registered.remove(name)
        except KeyError:
            pass

    def tick(self) -> None:
        now = time.monotonic()
        kubelet = socket_identity(self.kubelet_socket)
        self._note_kubelet_presence(kubelet is not None, now)
        if kubelet is not None and kubelet != self._kubelet:
            log.info("kubelet socket (re)created; registering again", socket=str(self.kubelet_socket))
            for state in self._states.values():
                self._unregister(state, immediately=True)
        self._kubelet = kubelet
        for name, server in self._servers.items():
            state = self._states[name]
            if not server.socket_ok():
                if not state.socket.due():
                    continue
                if state.socket.problem is None:
                    log.warning("plugin socket missing; re-creating it", resource=name, socket=str(server.path))
                self._unregister(state, immediately=True)
                server.stop()
                if not self._start(server, state):
                    continue
            if kubelet is not None and not state.registered and time.monotonic() >= state.next_attempt:
                self._register(server, state)
        for name, state in self._states.items():
            self._metrics.registered.labels(resource=name).set(1 if state.registered else 0)

    def _note_kubelet_presence(self, present: bool, now: float) -> None:
        """Log a missing kubelet socket after a short grace, then every ``missing_log_seconds``."""
        since, last = self._kubelet_missing_since, self._kubelet_missing_logged
        if present:
            if since is not None and last is not None:
                log.info("kubelet socket found", socket=str(self.kubelet_socket), waited_s=round(now - since, 1))
            self._kubelet_missing_since = self._kubelet_missing_logged = None
            return
        if since is None:
            since = self._kubelet_missing_since = now
        waited = now - since
        if (waited >= KUBELET_MISSING_GRACE and last is None) or (last is not None and
                                                                  now - last >= self._missing_log_seconds):
            log.warning("kubelet socket not found; waiting for the kubelet to create it", reason="kubelet-missing",
                        socket=str(self.kubelet_socket), waited_s=round(waited, 2))
            self._kubelet_missing_logged = now

    def _unregister(self, state: _State, immediately: bool) -> None:
        state.registered = False
        if immediately:
            state.next_attempt, state.backoff = 0.0, FIRST_BACKOFF

    def _register(self, server: ResourceSocket, state: _State) -> None:
        name = server.service.resource.name
        request = pb.RegisterRequest(version=VERSION, endpoint=server.endpoint, resource_name=name, options=OPTIONS)
        try:
            with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                stub.Register(request, timeout=REGISTER_TIMEOUT)
        except grpc.RpcError as exc:
            self._metrics.registrations.labels(resource=name, outcome="failed").inc()
            log.warning("registration failed; will retry", resource=name, retry_in_s=state.backoff,
                        reason="registration-failed", error=f"{exc.code().name}: {exc.details()}")
            state.next_attempt = time.monotonic() + state.backoff
            state.backoff = min(state.backoff * 2, MAX_BACKOFF)
            return
        self._metrics.registrations.labels(resource=name, outcome="ok").inc()  # counted by the time /readyz says so
        state.registered, state.backoff = True, FIRST_BACKOFF
        log.info("registered with the kubelet", resource=name, endpoint=server.endpoint, version=VERSION)

    def stop(self) -> None:
        for name in list(self._servers):
            self.remove(name)
