"""The DRA plugin's two gRPC services and the unix sockets they are served on.

``Registration`` (kubelet plugin registration, on ``<registry dir>/<driver>-reg.sock``) tells the
kubelet's plugin watcher what this socket is: a DRA plugin for the driver, whose ``v1.DRAPlugin``
service listens on ``<plugins dir>/<driver>/dra.sock``; the watcher then says whether it took it.
``DraService`` answers NodePrepareResources and NodeUnprepareResources there, claim by claim.
``DriverSockets`` holds both for one driver and re-creates a socket that disappeared: the kubelet
deletes the registration socket when it restarts, and registers it again once it is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from labeller.apps.draplugin.api import dra_pb2 as dra
from labeller.apps.draplugin.api import dra_pb2_grpc as dra_grpc
from labeller.apps.draplugin.api import registration_pb2 as reg
from labeller.apps.draplugin.aioserver import AioServer
from labeller.apps.draplugin.api import registration_pb2_grpc as reg_grpc
from labeller.apps.draplugin.metrics import DraMetrics
from labeller.apps.draplugin.prepare import ClaimError, ClaimRef, Preparer
from labeller.process.sockets import SocketRetry, SocketServer, SocketUnavailable
from labeller.base.log import get_logger

log = get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin",)  # what supported_versions lists: the kubelet picks the DRA API by these names
WORKERS = 8


class Registration(reg_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks on the registration socket."""

    def __init__(self, driver: str, endpoint: Path, on_status: Callable[[bool, str], None]) -> None:
        self.driver, self.endpoint, self.on_status = driver, endpoint, on_status

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint=str(self.endpoint),
                              supported_versions=list(SERVICES))

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,
                                 context: grpc.ServicerContext) -> reg.RegistrationStatusResponse:
        self.on_status(request.plugin_registered, request.error)
        return reg.RegistrationStatusResponse()


class DraService(dra_grpc.DRAPluginServicer):
    """``v1.DRAPlugin`` for one driver: every claim of a call gets its own answer."""

    def __init__(self, preparer: Preparer, metrics: DraMetrics) -> None:
        self.preparer, self.metrics = preparer, metrics

    @staticmethod
    def _claims(request: dra.NodePrepareResourcesRequest | dra.NodeUnprepareResourcesRequest) -> list[ClaimRef]:
        return [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]

    def NodePrepareResources(self, request: dra.NodePrepareResourcesRequest,
                             context: grpc.ServicerContext) -> dra.NodePrepareResourcesResponse:
        driver = self.preparer.driver
        answers = {}
        for claim in self._claims(request):
            started = time.perf_counter()
            try:
                prepared = self.preparer.prepare(claim)
            except ClaimError as exc:
                self.metrics.prepares.labels(driver=driver, outcome="failed").inc()
                log.warning("claim not prepared", reason="prepare-failed", driver=driver, claim=str(claim),
                            uid=claim.uid, error=str(exc))
                answers[claim.uid] = dra.NodePrepareResourceResponse(error=str(exc))
                continue
            except Exception as exc:  # a bug fails the claim, not the call: the kubelet retries it
                self.metrics.prepares.labels(driver=driver, outcome="failed").inc()
                log.exception("prepare failed", driver=driver, claim=str(claim), uid=claim.uid)
                answers[claim.uid] = dra.NodePrepareResourceResponse(error=f"{driver}: internal error: {exc}")
                continue
            self.metrics.prepares.labels(driver=driver, outcome="ok").inc()
            self.metrics.prepare_duration.labels(driver=driver).observe(time.perf_counter() - started)
            devices = [dra.Device(request_names=list(d.requests), pool_name=d.pool, device_name=d.device,
                                  cdi_device_ids=list(d.cdi_ids)) for d in prepared.devices]
            log.info("claim prepared", driver=driver, claim=str(claim), uid=claim.uid,
                     devices=[d.device for d in prepared.devices])
            answers[claim.uid] = dra.NodePrepareResourceResponse(devices=devices)
        return dra.NodePrepareResourcesResponse(claims=answers)

    def NodeUnprepareResources(self, request: dra.NodeUnprepareResourcesRequest,
                               context: grpc.ServicerContext) -> dra.NodeUnprepareResourcesResponse:
        driver = self.preparer.driver
        answers = {}
        for claim in self._claims(request):
            try:
                self.preparer.unprepare(claim)
            except Exception as exc:  # noqa: BLE001 - ClaimError, or a bug: that claim's answer says so
                self.metrics.unprepares.labels(driver=driver, outcome="failed").inc()
                log.warning("claim not unprepared", reason="unprepare-failed", driver=driver, claim=str(claim),
                            uid=claim.uid, error=str(exc))
                answers[claim.uid] = dra.NodeUnprepareResourceResponse(error=str(exc))
                continue
            self.metrics.unprepares.labels(driver=driver, outcome="ok").inc()
            log.info("claim unprepared", driver=driver, claim=str(claim), uid=claim.uid)
            answers[claim.uid] = dra.NodeUnprepareResourceResponse()
        return dra.NodeUnprepareResourcesResponse(claims=answers)


def grpc_server(name: str, add: Callable[[Any], None]) -> Callable[[], AioServer]:
    """What makes one socket's gRPC server, its service added by ``add`` (an asyncio server: idle,
    it does not wake; ``labeller.apps.draplugin.aioserver``)."""
    return lambda: AioServer(name, add, WORKERS)


class DriverSockets:
    """The registration socket and the DRA service socket of one driver, kept in place by ``tick``."""

    def __init__(self, driver: str, registry_dir: Path, plugins_dir: Path, service: DraService,
                 metrics: DraMetrics) -> None:
        self.driver, self.metrics = driver, metrics
        self.registered = False
        self.endpoint = plugins_dir / driver / "dra.sock"
        registration = Registration(driver, self.endpoint, self._on_status)
        add_dra: Callable[[Any, Any], None] = dra_grpc.add_DRAPluginServicer_to_server
        add_registration: Callable[[Any, Any], None] = reg_grpc.add_RegistrationServicer_to_server
        self.dra = SocketServer(self.endpoint, grpc_server(f"dra-{driver}", lambda s: add_dra(service, s)))
        self.registration = SocketServer(registry_dir / f"{driver}-reg.sock",
                                         grpc_server(f"reg-{driver}", lambda s: add_registration(registration, s)))
        self._dra_retry = SocketRetry(driver=driver, socket=str(self.endpoint))
        self._registration_retry = SocketRetry(driver=driver, socket=str(self.registration.path))
        self._set_registered(False)  # exported from the start: a kubelet that never registers it is seen

    def start(self) -> None:
        # the DRA socket first: the kubelet calls it as soon as it has registered the plugin
        if self._start(self.dra, self._dra_retry) and self._start(self.registration, self._registration_retry):
            log.info("serving", driver=self.driver, endpoint=str(self.endpoint),
                     registration=str(self.registration.path))

    @staticmethod
    def _start(server: SocketServer, retry: SocketRetry) -> bool:
        """(Re-)create one socket; False (logged once per problem, tried again with backoff) when it cannot be."""
        server.stop()
        try:
            _make_parent(server.path)
            server.start()
        except SocketUnavailable as exc:
            retry.failed(exc)
            return False
        retry.succeeded()
        return True

    def tick(self) -> None:
        """Re-create a socket that is gone; a new registration socket makes the kubelet register again."""
        if not self.dra.socket_ok():
            if not self._dra_retry.due():
                return
            if self._dra_retry.problem is None:
                log.warning("DRA socket missing; re-creating it", driver=self.driver, socket=str(self.endpoint))
            if not self._start(self.dra, self._dra_retry):
                return
        if not self.registration.socket_ok() and self._registration_retry.due():
            if self._registration_retry.problem is None:
                log.info("registration socket gone (kubelet restarted?); registering again", driver=self.driver,
                         socket=str(self.registration.path))
            self._set_registered(False)
            self._start(self.registration, self._registration_retry)

    def next_try(self) -> float:
        """When a socket that could not be created is tried again (``time.monotonic``); infinite when none."""
        return min(self._dra_retry.next_try(), self._registration_retry.next_try())

    def _on_status(self, registered: bool, error: str) -> None:
        self._set_registered(registered)
        self.metrics.registrations.labels(driver=self.driver, outcome="ok" if registered else "rejected").inc()
        if registered:
            log.info("registered with the kubelet", driver=self.driver, endpoint=str(self.endpoint),
                     services=list(SERVICES))
        else:
            log.error("the kubelet rejected the registration", reason="registration-rejected", driver=self.driver,
                      error=error)

    def _set_registered(self, registered: bool) -> None:
        self.registered = registered
        self.metrics.registered.labels(driver=self.driver).set(1 if registered else 0)

    def stop(self) -> None:
        self.registration.stop()  # first: the kubelet stops calling a plugin that is going
        self.dra.stop()
        self._set_registered(False)


def _make_parent(path: Path) -> None:
    """The command line checked the parent's parent; the driver's own directory is made here."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SocketUnavailable(f"{path.parent}: {exc.strerror or exc}") from None
