"""NVIDIA's device groups: which resources the node offers under each MIG strategy.

NVIDIA's plugin's rules, written once (the labels read the resulting offer, see labeller.model.offer):
- ``none``: every GPU is ``nvidia.com/gpu``, whole, MIG-enabled or not.
- ``single``: every MIG device is ``nvidia.com/gpu`` when the node is uniformly MIG-enabled with
  one profile; otherwise ``nvidia.com/gpu`` is withheld (GFD's ``-MIG-INVALID`` labels). A node
  without MIG enabled is treated as ``none``.
- ``mixed``: GPUs without MIG are ``nvidia.com/gpu``; each MIG profile is ``nvidia.com/mig-<profile>``.

Device IDs follow ``deviceIDStrategy``: the UUID, or the NVML index (``"0"``, ``"1:0"`` for MIG).
"""

from __future__ import annotations

from dataclasses import dataclass

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import DeviceGroup, PhysicalDevice
from vendors.nvidia.model import MigDevice, NvidiaGpu, NvidiaInventory
from vendors.nvidia.settings import NvidiaSettings
from labeller.base.log import get_logger

log = get_logger(__name__)

GPU = "nvidia.com/gpu"
VENDOR = "nvidia"


@dataclass(frozen=True, kw_only=True)
class NvidiaDevice(PhysicalDevice):
    """A whole GPU, or one MIG device of ``nvml_gpu``."""

    nvml_gpu: NvidiaGpu  # the physical GPU as NVML described it (a MIG device's parent)
    mig: MigDevice | None = None

    @property
    def mig_ids(self) -> tuple[int, int] | None:
        """(GPU instance id, compute instance id) of a MIG device, when NVML gave both."""
        if self.mig is None or self.mig.gpu_instance_id is None or self.mig.compute_instance_id is None:
            return None
        return self.mig.gpu_instance_id, self.mig.compute_instance_id


def _by_uuid(config: Config) -> bool:
    return config.section(NvidiaSettings).device_id_strategy == "uuid"


def whole(gpu: NvidiaGpu, config: Config) -> NvidiaDevice:
    return NvidiaDevice(
        vendor=VENDOR, health_key=gpu.uuid,
        visible_id=gpu.uuid if _by_uuid(config) else str(gpu.index),
        gpu=gpu.pci_bus_id, numa_node=gpu.numa_node, fabric_peers=gpu.nvlink_peers, nvml_gpu=gpu,
        names=(gpu.uuid, str(gpu.index)), memory_bytes=gpu.memory_bytes, split=gpu.mig_enabled,
    )


def partition(gpu: NvidiaGpu, mig: MigDevice, config: Config) -> NvidiaDevice:
    return NvidiaDevice(
        vendor=VENDOR, health_key=mig.uuid,
        visible_id=mig.uuid if _by_uuid(config) else f"{gpu.index}:{mig.index}",
        gpu=gpu.pci_bus_id, numa_node=gpu.numa_node, partition=mig.profile, nvml_gpu=gpu, mig=mig,
        names=(mig.uuid, f"{gpu.index}:{mig.index}"),
    )


def mig_single_problem(gpus: tuple[NvidiaGpu, ...]) -> str | None:
    """Why ``migStrategy: single`` cannot offer these GPUs' MIG devices as one resource (GFD's rule)."""
    if any(not gpu.mig_enabled for gpu in gpus):
        return "some GPUs have MIG enabled and some do not"
    if any(not gpu.mig_devices for gpu in gpus):
        return "a MIG-enabled GPU has no MIG devices"
    if len({mig.profile for gpu in gpus for mig in gpu.mig_devices}) > 1:
        return "more than one MIG profile on the node"
    return None


def groups(inventory: Inventory, config: Config) -> list[DeviceGroup]:
    part = inventory.part(NvidiaInventory)
    if part is None or not part.gpus:
        return []
    gpus = part.gpus
    if config.mig_strategy == "single" and any(gpu.mig_enabled for gpu in gpus):
        problem = mig_single_problem(gpus)
        if problem is not None:
            return [DeviceGroup(GPU, VENDOR, (), withheld=problem)]
        return [DeviceGroup(GPU, VENDOR, tuple(partition(g, m, config) for g in gpus for m in g.mig_devices))]
    by_base: dict[str, list[PhysicalDevice]] = {GPU: []}
    for gpu in gpus:
        if config.mig_strategy == "mixed" and gpu.mig_enabled:
            if not gpu.mig_devices and not config.dra_dynamic_mig:  # dynamicMig: they are made at prepare
                log.warning("MIG-enabled GPU has no MIG devices; it offers nothing", vendor=VENDOR, device=gpu.uuid)
            for mig in gpu.mig_devices:
                by_base.setdefault(mig.resource_name, []).append(partition(gpu, mig, config))
        else:
            by_base[GPU].append(whole(gpu, config))
    return [DeviceGroup(base, VENDOR, tuple(devices)) for base, devices in by_base.items()]
