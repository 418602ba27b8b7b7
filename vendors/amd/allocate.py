"""What a container gets for AMD devices, as AMD's plugin answers Allocate, but with ``rwm``:
``/dev/kfd`` plus each device's ``/dev/dri/card<N>`` (when known) and ``/dev/dri/renderD<M>``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from labeller.config import Config
from labeller.offer import PhysicalDevice
from labeller.vendor import Allocate, ContainerEdits, DeviceNode
from vendors.amd.devices import AmdDevice


def allocator(config: Config, host_root: Path) -> Allocate:
    def allocate(physical: Sequence[PhysicalDevice]) -> ContainerEdits:
        paths = ["/dev/kfd"]
        for device in physical:
            if not isinstance(device, AmdDevice):
                continue
            if device.node.card is not None:
                paths.append(f"/dev/dri/card{device.node.card}")
            paths.append(f"/dev/dri/renderD{device.node.render_minor}")
        return ContainerEdits(devices=[DeviceNode(p, p) for p in paths])

    return allocate
