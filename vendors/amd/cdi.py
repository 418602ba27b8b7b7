"""The CDI spec of the AMD devices the plugin serves (``deviceListStrategy`` cdi-annotations or
cdi-cri), kind ``amd.com/gpu``: each device (a GPU or a partition, named by its PCI address) gets
its ``/dev/dri/card<N>`` (when known) and ``/dev/dri/renderD<M>``; every container of the kind gets
``/dev/kfd``. amd-ctk names its own ``amd.com/gpu`` devices by index, so the names do not clash."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labeller.model.config import Config
from labeller.model.offer import PhysicalDevice
from vendors.amd.allocate import CDI_KIND, device_paths
from vendors.amd.devices import AmdDevice

CDI_VERSION = "0.5.0"  # names starting with a digit (PCI addresses)


def _node(path: str) -> dict[str, str]:
    return {"path": path, "permissions": "rwm"}


def spec(devices: Sequence[PhysicalDevice], config: Config, host_root: Path) -> dict[str, Any] | None:
    amd = [d for d in devices if isinstance(d, AmdDevice)]
    if not amd:
        return None
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": d.visible_id, "containerEdits": {"deviceNodes": [_node(p) for p in device_paths(d)]}}
                    for d in amd],
        "containerEdits": {"deviceNodes": [_node("/dev/kfd")]},
    }
