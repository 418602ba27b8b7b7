"""What a container gets for AMD devices, as AMD's plugin answers Allocate, but with ``rwm``:
``/dev/kfd`` plus each device's ``/dev/dri/card<N>`` (when known) and ``/dev/dri/renderD<M>``.

With a CDI ``deviceListStrategy`` (``cdi-cri``, ``cdi-annotations``; AMD's plugin has no CDI) the
devices are named ``amd.com/gpu=<PCI address>`` instead, resolved in the spec file the plugin
writes (vendors/amd/cdi.py); device nodes are passed too only when a non-CDI strategy is also listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from labeller.model.config import Config
from labeller.model.offer import PhysicalDevice, Resource
from labeller.model.vendor.plugin import CDI_STRATEGIES, Allocate, ContainerEdits, DeviceNode, name_cdi_devices
from vendors.amd.devices import AmdDevice

CDI_KIND = "amd.com/gpu"


def device_paths(device: AmdDevice) -> list[str]:
    """The device nodes of one KFD compute node: its card (when known) and its render node."""
    card = [f"/dev/dri/card{device.node.card}"] if device.node.card is not None else []
    return [*card, f"/dev/dri/renderD{device.node.render_minor}"]


def allocator(config: Config, host_root: Path, resource: Resource) -> Allocate:
    flags = config.plugin
    strategies = set(flags.device_list_strategy)

    def allocate(physical: Sequence[PhysicalDevice]) -> ContainerEdits:
        devices = [d for d in physical if isinstance(d, AmdDevice)]
        edits = ContainerEdits()
        if strategies - set(CDI_STRATEGIES):
            paths = ["/dev/kfd", *(p for d in devices for p in device_paths(d))]
            edits.devices = [DeviceNode(p, p) for p in paths]
        name_cdi_devices(edits, [f"{CDI_KIND}={d.visible_id}" for d in devices], flags.device_list_strategy,
                         flags.cdi_annotation_prefix, "gpu-labeller-amd")
        return edits

    return allocate
