"""One resource's DevicePlugin gRPC service and the unix socket it is served on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from labeller.apps.plugin.allocate import RequestError, ResourceAllocator, Unmatched
from labeller.apps.plugin.api import api_pb2 as pb
from labeller.apps.plugin.api import api_pb2_grpc as pb_grpc
from labeller.process.health import HEALTHY, UNHEALTHY, HealthBoard
from labeller.process.sockets import SocketServer
from labeller.apps.plugin.metrics import PluginMetrics
from labeller.model.offer import Resource
from labeller.base.log import get_logger

log = get_logger(__name__)

OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
WORKERS = 8  # threads are started on demand; each open ListAndWatch stream holds one
STREAM_RECHECK_SECONDS = 1.0


class DevicePluginService(pb_grpc.DevicePluginServicer):
    """The five DevicePlugin methods for one resource name; its devices can be replaced while served."""

    def __init__(self, allocator: ResourceAllocator, board: HealthBoard, metrics: PluginMetrics, policy: str):
        self._allocator, self._board, self._metrics, self._policy = allocator, board, metrics, policy
        self._stopped = threading.Event()
        self._cached: tuple[int, ResourceAllocator, pb.ListAndWatchResponse] | None = None

    @property
    def resource(self) -> Resource:
        return self._allocator.resource

    def update(self, allocator: ResourceAllocator, policy: str) -> None:
        """Serve ``allocator.resource`` (same name) from now on. Open ListAndWatch streams send the
        new list when the board next changes (``HealthBoard.track`` does that)."""
        if allocator.resource.name != self.resource.name:
            raise ValueError(f"{self.resource.name}: cannot become {allocator.resource.name}")
        self._allocator, self._policy = allocator, policy

    def stop(self) -> None:
        """End every open ListAndWatch stream."""
        self._stopped.set()
        self._board.wake()

    def resume(self) -> None:
        self._stopped.clear()

    def list_response(self) -> pb.ListAndWatchResponse:
        generation, allocator, cached = self._board.generation, self._allocator, self._cached
        if cached is not None and cached[0] == generation and cached[1] is allocator:
            return cached[2]
        devices = []
        for device in allocator.resource.devices:
            numa = device.physical.numa_node
            devices.append(pb.Device(
                ID=device.id, health=HEALTHY if self._board.healthy(device.physical.health_key) else UNHEALTHY,
                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None and numa >= 0 else None,
            ))
        response = pb.ListAndWatchResponse(devices=devices)
        self._cached = (generation, allocator, response)
        return response

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        context.add_callback(self._board.wake)
        last: pb.ListAndWatchResponse | None = None
        while not self._stopped.is_set() and context.is_active():
            generation = self._board.generation
            response = self.list_response()
            if response != last:
                yield response
                last = response
            self._board.wait(generation, STREAM_RECHECK_SECONDS,
                             stop=lambda: self._stopped.is_set() or not context.is_active())

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        responses = []
        allocator, policy = self._allocator, self._policy
        for container in request.container_requests:
            try:
                ids = allocator.preferred(list(container.available_deviceIDs), list(container.must_include_deviceIDs),
                                          int(container.allocation_size), policy)
            except Exception:  # only a hint: a bug here must not fail the pod
                log.exception("preferred allocation failed; answering with no preference", resource=self.resource.name)
                ids = []
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        started = time.perf_counter()
        allocator = self._allocator  # one resource for the whole call, even across an update
        name = allocator.resource.name
        try:
            response = allocator.allocate(request)
        except RequestError as exc:
            self._metrics.allocations.labels(resource=name, outcome="rejected").inc()
            log.warning("allocate rejected", resource=name, reason=str(exc))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION if isinstance(exc, Unmatched)
                          else grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # context.abort raises; this line only satisfies type checkers
        for container in request.container_requests:
            self._metrics.allocations.labels(resource=name, outcome="ok").inc()
            log.info("allocated", resource=name, device=",".join(container.devices_ids))
        self._metrics.allocate_duration.labels(resource=name).observe(time.perf_counter() - started)
        return response

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class ResourceSocket(SocketServer):
    """Serves a DevicePluginService on ``<socket_dir>/<resource socket name>``; can be re-created.
    ``start`` raises SocketUnavailable when the socket cannot be created."""

    def __init__(self, service: DevicePluginService, socket_dir: Path):
        self.service = service
        super().__init__(socket_dir / service.resource.socket_name, self._grpc_server)

    @property
    def endpoint(self) -> str:
        return self.path.name

    def _grpc_server(self) -> grpc.Server:
        server = grpc.server(ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=self.endpoint))
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)  # type: ignore[no-untyped-call]
        return server

    def start(self) -> None:
        self.service.resume()
        super().start()

    def stop(self) -> None:
        self.service.stop()  # its ListAndWatch streams end
        super().stop()
