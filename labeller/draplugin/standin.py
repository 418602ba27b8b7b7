"""TEMPORARY stand-in for the DRA model (``labeller/resourceslices.py``, ``Host.dra_devices``), which
another branch builds; replaced by it once merged. Same names and shapes, made-up attributes."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from labeller.host import Host
from labeller.inventory import Inventory
from labeller.offer import Offer, PhysicalDevice

DRIVERS = {"nvidia": "gpu.nvidia.com", "amd": "gpu.amd.com"}
MAX_DEVICES_PER_SLICE = 128


@dataclass(frozen=True)
class DraDevice:
    name: str
    physical: PhysicalDevice
    attributes: Mapping[str, Any] = field(default_factory=dict)
    capacity: Mapping[str, Any] = field(default_factory=dict)

    @property
    def health_key(self) -> str:
        return self.physical.health_key

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "attributes": {"uuid": {"string": self.physical.health_key}}}
        if self.physical.memory_bytes:
            out["capacity"] = {"memory": {"value": str(self.physical.memory_bytes)}}
        return out


def resource_slices(node_name: str, devices_by_driver: Mapping[str, Sequence[DraDevice]], generation: int = 1
                    ) -> list[dict[str, Any]]:
    slices: list[dict[str, Any]] = []
    for driver in sorted(devices_by_driver):
        devices = list(devices_by_driver[driver])
        chunks = [devices[i:i + MAX_DEVICES_PER_SLICE] for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)]
        for index, chunk in enumerate(chunks):
            slices.append({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"{node_name}-{driver.replace('.', '-')}-{index}"},
                "spec": {"driver": driver, "nodeName": node_name,
                         "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(chunks)},
                         "devices": [device.document() for device in chunk]},
            })
    return slices


def healthy(devices_by_driver: Mapping[str, Sequence[DraDevice]], unhealthy: Collection[str]
            ) -> dict[str, list[DraDevice]]:
    return {driver: [d for d in devices if d.health_key not in unhealthy] for driver, devices in devices_by_driver.items()}


def dra_devices(host: Host, inventory: Inventory, offer: Offer) -> dict[str, list[DraDevice]]:
    out: dict[str, list[DraDevice]] = {}
    for vendor in host.vendors:
        physical = {p.health_key: p for g in vendor.devices.groups(inventory, host.config) for p in g.devices}
        if physical and vendor.name in DRIVERS:
            out[DRIVERS[vendor.name]] = [DraDevice(f"gpu-{i}", p) for i, p in enumerate(physical.values())]
    return out


def vendor_of(host: Host, driver: str) -> str:
    return next(name for name, d in DRIVERS.items() if d == driver)
