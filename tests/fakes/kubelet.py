"""A kubelet device manager emulator over real gRPC on unix sockets.

It behaves as ``shared/reference/real-kubernetes-behaviour.md`` records for the v1.24 kubelet:

- serves ``Registration`` on ``<dir>/kubelet.sock``; ``start`` and ``restart`` first delete every
  file in the directory (plugin sockets included), as a starting kubelet does;
- ``Register``: rejects an unsupported version and a resource name without a domain prefix
  (``the ResourceName "gpu" is invalid``), takes the options from the request (never calls
  ``GetDevicePluginOptions``), then dials ``<dir>/<endpoint>`` and keeps ``ListAndWatch`` open;
  a second registration of a resource replaces the first endpoint. Each registration dials afresh
  and waits for the endpoint to answer, as the kubelet's blocking dial does (grpc-python would
  otherwise share one connection, and its failure backoff, between channels to the same socket);
- a restart ends the old kubelet's part: a ``Register`` the stopped server was still handling is
  refused (UNAVAILABLE) and changes nothing in the new one, as a kubelet process that exited does;
- capacity = all devices, allocatable = healthy devices; when the stream of the registered
  endpoint ends every device turns Unhealthy (allocatable 0) and capacity stays (the 5-minute
  grace period); a re-registration keeps the devices until the new stream's first list, and the
  stream end of a replaced endpoint changes nothing (the kubelet checks that the ending endpoint is
  still the registered one);
- ``observations`` records, for every registration, ListAndWatch update and stream end, what
  the Node would report for that resource at that moment (allocatable, capacity), so a test can
  check that a reload never showed allocatable 0;
- ``admit``: fails with ``requested number of devices unavailable for <resource>. Requested: N,
  Available: M`` like admission; otherwise calls ``GetPreferredAllocation`` (when the plugin said
  so), honours a valid answer, calls ``Allocate`` with one container request per container and
  rejects a response without one container response per request; ``PreStartContainer`` only
  when ``pre_start_required``. ``admit_each`` calls them once per container, as a real kubelet does.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import grpc

from labeller.apps.plugin.api import api_pb2 as pb
from labeller.apps.plugin.api import api_pb2_grpc as pb_grpc
from tests.builders import PATIENCE_S

KUBELET_SOCKET = "kubelet.sock"
STOPPED = "kubelet stopped"
# A channel of its own for each registration: no connection (nor its reconnect backoff) shared.
_OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
SUPPORTED_VERSIONS = ("v1beta1",)
# A qualified name with a domain prefix, as IsQualifiedName + the extended-resource rule.
_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class AdmissionError(RuntimeError):
    """The pod would fail admission (UnexpectedAdmissionError in a real kubelet)."""


@dataclass
class Endpoint:
    resource: str
    endpoint: str
    options: pb.DevicePluginOptions
    channel: grpc.Channel
    stub: pb_grpc.DevicePluginStub
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    updates: int = 0
    last_update: float = 0.0
    streaming: bool = False
    call: Any = None


@dataclass
class Registration:
    resource: str
    endpoint: str
    version: str
    at: float


@dataclass(frozen=True)
class Observation:
    """What the Node reported for ``resource`` right after ``event``."""

    at: float
    resource: str
    event: str  # "registered", "devices" (a ListAndWatch update), "stream-ended"
    allocatable: int
    capacity: int


class FakeKubelet:
    def __init__(self, directory: Path):
        self.dir = directory
        self.registrations: list[Registration] = []
        self.rejected: list[str] = []
        self.endpoints: dict[str, Endpoint] = {}
        self.observations: list[Observation] = []
        self.allocated: dict[str, set[str]] = {}
        self.capacity_seen: dict[str, set[str]] = {}  # capacity survives a stream end (grace period)
        self._devices: dict[str, dict[str, str]] = {}  # resource -> ID -> health, as the Node reports it
        self._lock = threading.Condition()
        self._server: Any = None
        self._epoch = 0  # bumped by stop: a stopped server's late Register belongs to no kubelet

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.dir / KUBELET_SOCKET

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in self.dir.iterdir():
            if not path.is_dir():
                path.unlink(missing_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self, self._epoch), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(2)
            self._server = None
        with self._lock:
            self._epoch += 1  # what the stopped server is still handling is refused from now on
            endpoints = list(self.endpoints.values())
            self.endpoints.clear()
            for devices in self._devices.values():  # a restarted kubelet knows no healthy device yet
                devices.update(dict.fromkeys(devices, "Unhealthy"))
        for endpoint in endpoints:
            self._close(endpoint)
        self.socket.unlink(missing_ok=True)

    def restart(self) -> float:
        """Stop, delete every file in the directory, serve a new kubelet.sock; returns the time it did."""
        self.stop()
        self.start()
        return time.monotonic()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- registration -------------------------------------------------------------------------

    def register(self, request: pb.RegisterRequest, epoch: int | None = None) -> str | None:
        """Handle a RegisterRequest; an error message when rejected (``STOPPED`` when the kubelet
        that received it, started as ``epoch``, has stopped since)."""
        if request.version not in SUPPORTED_VERSIONS:
            return f"requested device plugin version {request.version!r} is not supported"
        if not _RESOURCE_RE.match(request.resource_name):
            return f'the ResourceName "{request.resource_name}" is invalid'
        if "/" in request.endpoint or not (self.dir / request.endpoint).exists():
            return f"endpoint {request.endpoint!r} is not a socket in {self.dir}"
        channel = grpc.insecure_channel(f"unix://{self.dir / request.endpoint}", options=_OWN_CONNECTION)
        endpoint = Endpoint(request.resource_name, request.endpoint, request.options, channel,
                            pb_grpc.DevicePluginStub(channel))  # type: ignore[no-untyped-call]
        with self._lock:
            if epoch is not None and epoch != self._epoch:
                channel.close()
                return STOPPED
            old = self.endpoints.get(request.resource_name)
            self.endpoints[request.resource_name] = endpoint
            self.registrations.append(Registration(request.resource_name, request.endpoint, request.version,
                                                   time.monotonic()))
            self._observe(request.resource_name, "registered")
        if old is not None:
            self._close(old)
        threading.Thread(target=self._watch, args=(endpoint,), daemon=True).start()
        return None

    def _watch(self, endpoint: Endpoint) -> None:
        try:
            endpoint.call = endpoint.stub.ListAndWatch(pb.Empty(), wait_for_ready=True)
            with self._lock:
                endpoint.streaming = True
            for response in endpoint.call:
                with self._lock:
                    endpoint.devices = {d.ID: d.health for d in response.devices}
                    endpoint.updates += 1
                    endpoint.last_update = time.monotonic()
                    if self.endpoints.get(endpoint.resource) is endpoint:
                        self._devices[endpoint.resource] = dict(endpoint.devices)
                        self.capacity_seen[endpoint.resource] = set(endpoint.devices)
                        self._observe(endpoint.resource, "devices")
        except (grpc.RpcError, ValueError):  # ValueError: the channel was closed before the call
            pass
        finally:
            with self._lock:
                endpoint.streaming = False
                if self.endpoints.get(endpoint.resource) is endpoint:
                    devices = self._devices.get(endpoint.resource, {})
                    devices.update(dict.fromkeys(devices, "Unhealthy"))
                    self._observe(endpoint.resource, "stream-ended")
                self._lock.notify_all()

    def _observe(self, resource: str, event: str) -> None:
        """Record what the Node reports for ``resource`` now; call with the lock held."""
        self.observations.append(Observation(time.monotonic(), resource, event, self._allocatable(resource),
                                             len(self.capacity_seen.get(resource, ()))))
        self._lock.notify_all()

    def _close(self, endpoint: Endpoint) -> None:
        if endpoint.call is not None:
            endpoint.call.cancel()
        endpoint.channel.close()

    # --- what the node reports ----------------------------------------------------------------

    def capacity(self, resource: str) -> int:
        with self._lock:
            return len(self.capacity_seen.get(resource, ()))

    def allocatable(self, resource: str) -> int:
        with self._lock:
            return self._allocatable(resource)

    def _allocatable(self, resource: str) -> int:
        return sum(1 for health in self._devices.get(resource, {}).values() if health == "Healthy")

    def devices(self, resource: str) -> dict[str, str]:
        with self._lock:
            return dict(self._devices.get(resource, {}))

    def registration_count(self, resource: str) -> int:
        with self._lock:
            return sum(1 for r in self.registrations if r.resource == resource)

    def seen(self, resource: str, since: float = 0.0) -> list[Observation]:
        """Every observation of ``resource`` at or after ``since`` (a ``time.monotonic()`` value)."""
        with self._lock:
            return [o for o in self.observations if o.resource == resource and o.at >= since]

    def endpoint(self, resource: str) -> Endpoint | None:
        with self._lock:
            return self.endpoints.get(resource)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = PATIENCE_S) -> bool:
        """Whether ``predicate()`` (called with the kubelet's state locked) held within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.05))
        return True

    # --- pods ---------------------------------------------------------------------------------

    def admit_each(self, resource: str,
                   containers: list[int]) -> tuple[list[pb.ContainerAllocateResponse], list[list[str]]]:
        """Admit a pod as a real kubelet's device manager does (``allocateContainerResources``): one
        GetPreferredAllocation and one Allocate call per container that asks for ``resource``, in
        order; the first failure fails the pod (AdmissionError) and frees what it took."""
        responses: list[pb.ContainerAllocateResponse] = []
        chosen: list[list[str]] = []
        try:
            for count in containers:
                response, (ids,) = self.admit(resource, [count])
                responses.append(response.container_responses[0])
                chosen.append(ids)
        except AdmissionError:
            for ids in chosen:
                self.release(resource, ids)
            raise
        return responses, chosen

    def admit(self, resource: str, containers: list[int]) -> tuple[pb.AllocateResponse, list[list[str]]]:
        """Admit a pod whose containers ask for these counts of ``resource``; returns the plugin's
        response and the IDs given to each container."""
        with self._lock:
            endpoint = self.endpoints.get(resource)
            taken = self.allocated.setdefault(resource, set())
            free = [] if endpoint is None else \
                [i for i, h in self._devices.get(resource, {}).items() if h == "Healthy" and i not in taken]
        if endpoint is None or sum(containers) > len(free):
            raise AdmissionError(f"requested number of devices unavailable for {resource}. "
                                 f"Requested: {sum(containers)}, Available: {len(free)}")
        chosen: list[list[str]] = []
        for count in containers:
            ids = self._preferred(endpoint, free, count) or free[:count]
            chosen.append(ids)
            free = [i for i in free if i not in ids]
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)
                                                         for ids in chosen])
        try:
            response = endpoint.stub.Allocate(request, timeout=PATIENCE_S)
        except grpc.RpcError as exc:  # the pod fails with UnexpectedAdmissionError
            raise AdmissionError(f"{resource}: Allocate failed: {exc.code().name}: {exc.details()}") from None
        if len(response.container_responses) != len(chosen):
            raise AdmissionError(f"{resource}: Allocate returned {len(response.container_responses)} container "
                                 f"responses for {len(chosen)} container requests")
        if endpoint.options.pre_start_required:
            for ids in chosen:
                endpoint.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=PATIENCE_S)
        with self._lock:
            taken.update(i for ids in chosen for i in ids)
        return response, chosen

    def release(self, resource: str, ids: list[str]) -> None:
        with self._lock:
            self.allocated.get(resource, set()).difference_update(ids)

    def _preferred(self, endpoint: Endpoint, free: list[str], count: int) -> list[str] | None:
        if not endpoint.options.get_preferred_allocation_available:
            return None
        request = pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=free, allocation_size=count)])
        answer = endpoint.stub.GetPreferredAllocation(request, timeout=PATIENCE_S).container_responses
        ids = list(answer[0].deviceIDs) if answer else []
        valid = len(ids) == count and len(set(ids)) == count and set(ids) <= set(free)
        return ids if valid else None


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet, epoch: int):
        self._kubelet, self._epoch = kubelet, epoch

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        problem = self._kubelet.register(request, self._epoch)
        if problem == STOPPED:
            context.abort(grpc.StatusCode.UNAVAILABLE, problem)
        if problem is not None:
            self._kubelet.rejected.append(problem)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return pb.Empty()
