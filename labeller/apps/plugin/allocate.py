"""Allocate, vendor-neutral: check one container's device IDs, hand the physical devices behind
them to the vendor's allocator (vendors/<vendor>/allocate.py), and turn its answer into the
kubelet's ContainerAllocateResponse."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from labeller.model.config import Sharing
from labeller.model.offer import PhysicalDevice, Resource
from labeller.apps.plugin.api import api_pb2 as pb
from labeller.apps.plugin.preferred import preferred
from labeller.model.vendor.plugin import Allocate, ContainerEdits


class RequestError(ValueError):
    """A request the kubelet should not have sent; becomes gRPC INVALID_ARGUMENT."""


class Unmatched(RequestError):
    """A valid request this node cannot serve now (no pod waits for it); becomes FAILED_PRECONDITION,
    and the kubelet fails the pod with the message."""


def unique_physical(resource: Resource, ids: Sequence[str]) -> list[PhysicalDevice]:
    """Validate one container's device IDs and map them (replicas de-duplicated) to physical devices."""
    if not ids:
        raise RequestError(f"{resource.name}: a container request with no device IDs")
    if len(set(ids)) != len(ids):
        raise RequestError(f"{resource.name}: device IDs repeated in one container request: {', '.join(ids)}")
    unknown = [i for i in ids if resource.device(i) is None]
    if unknown:
        raise RequestError(f"{resource.name}: unknown device ID(s): {', '.join(unknown[:5])}"
                           + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
    out: dict[str, PhysicalDevice] = {}
    for device_id in ids:
        device = resource.device(device_id)
        assert device is not None
        out.setdefault(device.physical.health_key, device.physical)
    return list(out.values())


def response(edits: ContainerEdits) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=edits.envs, annotations=edits.annotations,
        mounts=[pb.Mount(host_path=m.host_path, container_path=m.container_path, read_only=m.read_only)
                for m in edits.mounts],
        devices=[pb.DeviceSpec(host_path=d.host_path, container_path=d.container_path, permissions=d.permissions)
                 for d in edits.devices],
        cdi_devices=[pb.CDIDevice(name=name) for name in edits.cdi_devices],
    )


class ResourceAllocator(Protocol):
    """What a resource's service asks: Allocate and GetPreferredAllocation answers."""

    resource: Resource

    def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse: ...

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int, policy: str) -> list[str]: ...


class Allocator:
    """Builds ContainerAllocateResponses for one resource."""

    def __init__(self, resource: Resource, sharing: Sharing, allocate: Allocate):
        self.resource = resource
        self._sharing, self._allocate = sharing, allocate

    def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        if not request.container_requests:
            raise RequestError(f"{self.resource.name}: an Allocate request with no container requests")
        return pb.AllocateResponse(container_responses=[self.container(list(c.devices_ids))
                                                        for c in request.container_requests])

    def container(self, ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        physical = unique_physical(self.resource, ids)
        if self.resource.shared and len(ids) > 1 and self._sharing.fail_requests_greater_than_one:
            raise RequestError(f"{self.resource.name}: maximum request size for shared resources is 1, "
                               f"got {len(ids)} (sharing.*.failRequestsGreaterThanOne)")
        return response(self._allocate(physical))

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int, policy: str) -> list[str]:
        return preferred(self.resource, available, must_include, size, policy)
