"""Allocate: from requested device IDs to what the container runtime must give the container.

NVIDIA, as NVIDIA's plugin (``deviceListStrategy``): ``envvar`` sets ``NVIDIA_VISIBLE_DEVICES`` to
the de-duplicated UUIDs or indices; ``volume-mounts`` sets it to a directory and mounts one
``/dev/null`` per device under it; ``cdi-annotations`` adds one annotation naming the CDI devices;
``cdi-cri`` fills ``cdi_devices``. With ``passDeviceSpecs`` (and a non-CDI strategy) device nodes
are passed under ``nvidiaDevRoot``: ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``
and ``/dev/nvidia<minor>`` always (nvidia-uvm nodes are created on first use, so their absence at
plugin start proves nothing), ``/dev/nvidia-modeset`` only when it exists under the host root, and
for MIG devices the ``nvidia-caps`` nodes listed in ``/proc/driver/nvidia-caps/mig-minors``.

AMD, as AMD's plugin but with ``rwm``: ``/dev/kfd`` plus each device's ``/dev/dri/card<N>`` (when
known) and ``/dev/dri/renderD<M>``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from labeller.config import PluginFlags, Sharing
from labeller.plugin.api import api_pb2 as pb
from labeller.plugin.resources import PhysicalDevice, Resource

PERMISSIONS = "rwm"
VOLUME_MOUNT_DIR = "/var/run/nvidia-container-devices"
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
NVIDIA_OPTIONAL_NODES = ("/dev/nvidia-modeset",)
MIG_MINORS = "proc/driver/nvidia-caps/mig-minors"


class RequestError(ValueError):
    """A request the kubelet should not have sent; becomes gRPC INVALID_ARGUMENT."""


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


class Allocator:
    """Builds ContainerAllocateResponses for one resource."""

    def __init__(self, resource: Resource, flags: PluginFlags, sharing: Sharing, host_root: Path):
        self.resource = resource
        self._flags, self._sharing, self._host_root = flags, sharing, host_root
        self._mig_minors = _read_mig_minors(host_root / MIG_MINORS) if resource.vendor == "nvidia" else {}
        self._optional = [p for p in NVIDIA_OPTIONAL_NODES if (host_root / p.lstrip("/")).exists()]

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
        if self.resource.vendor == "amd":
            return self._amd(physical)
        return self._nvidia(physical)

    def _amd(self, physical: list[PhysicalDevice]) -> pb.ContainerAllocateResponse:
        paths = ["/dev/kfd"]
        for device in physical:
            if device.card is not None:
                paths.append(f"/dev/dri/card{device.card}")
            if device.render_minor is not None:
                paths.append(f"/dev/dri/renderD{device.render_minor}")
        return pb.ContainerAllocateResponse(devices=[_spec(p, p) for p in paths])

    def _nvidia(self, physical: list[PhysicalDevice]) -> pb.ContainerAllocateResponse:
        ids = [d.visible_id for d in physical]
        strategies = self._flags.device_list_strategy
        response = pb.ContainerAllocateResponse()
        if "volume-mounts" in strategies:
            response.envs["NVIDIA_VISIBLE_DEVICES"] = VOLUME_MOUNT_DIR
            response.mounts.extend(pb.Mount(host_path="/dev/null", container_path=f"{VOLUME_MOUNT_DIR}/{i}",
                                            read_only=True) for i in ids)
        elif "envvar" in strategies:
            response.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
        names = [f"{CDI_KIND}={i}" for i in ids]
        if "cdi-annotations" in strategies:
            # NVIDIA uses a random suffix; a digest of the IDs is as unique per container and reproducible.
            suffix = hashlib.sha256(",".join(ids).encode()).hexdigest()[:16]
            response.annotations[f"{self._flags.cdi_annotation_prefix}nvidia-device-plugin_{suffix}"] = ",".join(names)
        if "cdi-cri" in strategies:
            response.cdi_devices.extend(pb.CDIDevice(name=n) for n in names)
        if self._flags.pass_device_specs and ({"envvar", "volume-mounts"} & set(strategies)):
            response.devices.extend(self._nvidia_specs(physical))
        return response

    def _nvidia_specs(self, physical: list[PhysicalDevice]) -> list[pb.DeviceSpec]:
        root = self._flags.nvidia_dev_root.rstrip("/")
        paths = [*NVIDIA_CONTROL_NODES, *self._optional]
        for device in physical:
            if device.minor_number is not None and f"/dev/nvidia{device.minor_number}" not in paths:
                paths.append(f"/dev/nvidia{device.minor_number}")
            if device.mig is not None and device.minor_number is not None:
                gi, ci = device.mig
                for cap in (f"gpu{device.minor_number}/gi{gi}/access", f"gpu{device.minor_number}/gi{gi}/ci{ci}/access"):
                    minor = self._mig_minors.get(cap)
                    if minor is not None and f"/dev/nvidia-caps/nvidia-cap{minor}" not in paths:
                        paths.append(f"/dev/nvidia-caps/nvidia-cap{minor}")
        return [_spec(p, root + p) for p in paths]


def _spec(container_path: str, host_path: str) -> pb.DeviceSpec:
    return pb.DeviceSpec(container_path=container_path, host_path=host_path, permissions=PERMISSIONS)


def _read_mig_minors(path: Path) -> dict[str, int]:
    """``gpu0/gi1/access 12`` lines -> {"gpu0/gi1/access": 12}; empty when unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out
