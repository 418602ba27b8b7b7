"""What the device plugin advertises: the one model shared by the plugin and the label agreement test.

``advertised_resources(inventory, config)`` turns discovery's ``Inventory`` and the config into
resources, each with its name, socket name and devices. Pure: no I/O.

- Full NVIDIA GPUs are ``nvidia.com/gpu``, with IDs by ``deviceIDStrategy`` (UUID, or NVML index).
- MIG, as GFD labels it: ``single`` advertises every MIG device as ``nvidia.com/gpu`` when the node
  is uniformly MIG-enabled with one profile (a mixed or empty node advertises no ``nvidia.com/gpu``,
  matching the ``-MIG-INVALID`` labels with count 0); ``single`` on a node without MIG enabled is
  ``none``. ``mixed`` advertises GPUs without MIG as ``nvidia.com/gpu`` and each MIG profile as
  ``nvidia.com/mig-<profile>``.
- AMD GPUs are ``amd.com/gpu``: one device per KFD compute node, so a partitioned GPU advertises
  its partitions. IDs are the compute node's PCI address (the GPU's BDF when not partitioned).
- Time-slicing (or MPS) replicas: each device becomes ``<id>::<n>`` for n in 0..replicas-1, under
  ``<name>.shared`` with ``renameByDefault``. Replicas keep their physical device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from labeller.config import Config
from labeller.inventory import AmdGpu, Inventory, MigDevice, NvidiaGpu

Vendor = Literal["nvidia", "amd"]
NVIDIA_GPU = "nvidia.com/gpu"
AMD_GPU = "amd.com/gpu"
REPLICA_SEPARATOR = "::"
LINK_XGMI = 11


@dataclass(frozen=True)
class PhysicalDevice:
    """A GPU, a MIG device or an AMD compute partition: what a container actually gets.

    ``health_key`` names the unit the health checker tracks; ``gpu`` names the physical GPU it is
    part of (NVIDIA: PCI bus id of the GPU; AMD: BDF of the GPU), and ``fabric_peers`` lists the
    ``gpu`` of each GPU it is joined to by NVLink or XGMI, once per link.
    """

    vendor: Vendor
    health_key: str  # NVIDIA: GPU or MIG UUID; AMD: "kfd:<node>"
    visible_id: str  # NVIDIA_VISIBLE_DEVICES / CDI name: UUID or index ("0", "1:0"); AMD: PCI address
    gpu: str
    numa_node: int | None = None
    fabric_peers: tuple[str, ...] = ()
    gpu_uuid: str | None = None  # NVIDIA: the (parent) GPU's UUID
    minor_number: int | None = None  # NVIDIA: /dev/nvidia<minor>
    mig: tuple[int, int] | None = None  # NVIDIA MIG: (GPU instance id, compute instance id)
    kfd_node: int | None = None  # AMD
    card: int | None = None  # AMD: /dev/dri/card<N>
    render_minor: int | None = None  # AMD: /dev/dri/renderD<M>


@dataclass(frozen=True)
class AdvertisedDevice:
    id: str  # the ID the kubelet sees: plain, or "<id>::<n>" for a replica
    physical: PhysicalDevice
    replica: int | None = None


@dataclass(frozen=True)
class Resource:
    name: str  # what is registered: "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"
    vendor: Vendor
    devices: tuple[AdvertisedDevice, ...]
    replicas: int = 1  # 1: not shared

    @property
    def shared(self) -> bool:
        return self.replicas > 1

    @property
    def socket_name(self) -> str:
        """``nvidia-gpu.sock``, ``nvidia-mig-1g.10gb.sock``, ``amd-gpu.shared.sock``."""
        domain, _, name = self.name.partition("/")
        return f"{domain.split('.')[0]}-{name}.sock"

    def device(self, device_id: str) -> AdvertisedDevice | None:
        return self._by_id.get(device_id)

    @cached_property
    def _by_id(self) -> dict[str, AdvertisedDevice]:
        return {d.id: d for d in self.devices}


def replica_id(device_id: str, replica: int) -> str:
    return f"{device_id}{REPLICA_SEPARATOR}{replica}"


# --- NVIDIA --------------------------------------------------------------------------------------

def _nvidia_gpu(gpu: NvidiaGpu, config: Config) -> PhysicalDevice:
    return PhysicalDevice(
        vendor="nvidia", health_key=gpu.uuid,
        visible_id=gpu.uuid if config.plugin.device_id_strategy == "uuid" else str(gpu.index),
        gpu=gpu.pci_bus_id, numa_node=gpu.numa_node, fabric_peers=gpu.nvlink_peers, gpu_uuid=gpu.uuid,
        minor_number=gpu.minor_number,
    )


def _nvidia_mig(gpu: NvidiaGpu, mig: MigDevice, config: Config) -> PhysicalDevice:
    ids = (mig.gpu_instance_id, mig.compute_instance_id)
    return PhysicalDevice(
        vendor="nvidia", health_key=mig.uuid,
        visible_id=mig.uuid if config.plugin.device_id_strategy == "uuid" else f"{gpu.index}:{mig.index}",
        gpu=gpu.pci_bus_id, numa_node=gpu.numa_node, gpu_uuid=gpu.uuid, minor_number=gpu.minor_number,
        mig=(ids[0], ids[1]) if ids[0] is not None and ids[1] is not None else None,
    )


def mig_single_valid(gpus: tuple[NvidiaGpu, ...]) -> bool:
    """GFD's rule: every GPU MIG-enabled, each with MIG devices, all of one profile."""
    return (all(g.mig_enabled and g.mig_devices for g in gpus)
            and len({m.profile for g in gpus for m in g.mig_devices}) == 1)


def _nvidia_groups(gpus: tuple[NvidiaGpu, ...], config: Config) -> dict[str, list[PhysicalDevice]]:
    """Base resource name (before sharing) -> physical devices, in NVML order."""
    groups: dict[str, list[PhysicalDevice]] = {}
    any_mig = any(g.mig_enabled for g in gpus)
    if config.mig_strategy == "single" and any_mig:
        if mig_single_valid(gpus):
            groups[NVIDIA_GPU] = [_nvidia_mig(g, m, config) for g in gpus for m in g.mig_devices]
        return groups
    for gpu in gpus:
        if config.mig_strategy == "mixed" and gpu.mig_enabled:
            for mig in gpu.mig_devices:
                groups.setdefault(mig.resource_name, []).append(_nvidia_mig(gpu, mig, config))
        else:  # strategy none advertises every GPU whole, MIG-enabled or not (as NVIDIA's plugin)
            groups.setdefault(NVIDIA_GPU, []).append(_nvidia_gpu(gpu, config))
    return groups


# --- AMD -----------------------------------------------------------------------------------------

def _pci_address(domain: int, location_id: int) -> str:
    """KFD's location_id = bus << 8 | device << 3 | function."""
    bus, device, function = location_id >> 8 & 0xFF, location_id >> 3 & 0x1F, location_id & 0x7
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def _amd_devices(gpus: tuple[AmdGpu, ...]) -> list[PhysicalDevice]:
    gpu_of_node = {n.kfd_node: g.bdf for g in gpus for n in g.nodes}
    devices: list[PhysicalDevice] = []
    seen: set[str] = set()
    for gpu in gpus:
        partitioned = len(gpu.nodes) > 1
        for node in gpu.nodes:
            address = _pci_address(node.domain, node.location_id) if partitioned else gpu.bdf
            if address in seen:  # a capture without distinct partition addresses
                address = f"{gpu.bdf}-kfd{node.kfd_node}"
            seen.add(address)
            peers = tuple(gpu_of_node[peer] for peer, kind in node.links
                          if kind == LINK_XGMI and peer in gpu_of_node and gpu_of_node[peer] != gpu.bdf)
            devices.append(PhysicalDevice(
                vendor="amd", health_key=f"kfd:{node.kfd_node}", visible_id=address, gpu=gpu.bdf,
                numa_node=node.numa_node if node.numa_node is not None else gpu.numa_node,
                fabric_peers=peers, kfd_node=node.kfd_node, card=node.card, render_minor=node.render_minor,
            ))
    return devices


# --- together ------------------------------------------------------------------------------------

def _resource(base: str, vendor: Vendor, physical: Iterable[PhysicalDevice], config: Config) -> Resource:
    replicas = config.sharing.replicas_for(base)
    if replicas > 1:
        devices = tuple(AdvertisedDevice(replica_id(p.visible_id, n), p, n) for p in physical for n in range(replicas))
    else:
        devices = tuple(AdvertisedDevice(p.visible_id, p) for p in physical)
    return Resource(config.sharing.advertised_name(base), vendor, devices, replicas)


def advertised_resources(inventory: Inventory, config: Config) -> list[Resource]:
    """Every resource with at least one device, NVIDIA first, in a stable order."""
    resources: list[Resource] = []
    if inventory.nvidia is not None and inventory.nvidia.gpus:
        for base, physical in _nvidia_groups(inventory.nvidia.gpus, config).items():
            resources.append(_resource(base, "nvidia", physical, config))
    if inventory.amd is not None and inventory.amd.gpus:
        resources.append(_resource(AMD_GPU, "amd", _amd_devices(inventory.amd.gpus), config))
    return [r for r in resources if r.devices]
