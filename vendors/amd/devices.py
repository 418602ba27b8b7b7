"""AMD's device group: ``amd.com/gpu``, one device per KFD compute node, as AMD's plugin offers them.

A partitioned GPU (CPX, DPX, ...) offers each partition; its ID is the partition's PCI address
from KFD (the GPU's own address when it is not partitioned). Peers are the GPUs a partition's
node reaches over XGMI.
"""

from __future__ import annotations

from dataclasses import dataclass

from labeller.config import Config
from labeller.inventory import Inventory
from labeller.offer import DeviceGroup, PhysicalDevice
from vendors.amd.facts import LINK_XGMI, pci_address
from vendors.amd.model import AmdComputeNode, AmdGpu, AmdInventory

GPU = "amd.com/gpu"
VENDOR = "amd"
XCP = "xcp"  # a compute partition whose mode the partition files do not say (a raw KFD capture)


@dataclass(frozen=True, kw_only=True)
class AmdDevice(PhysicalDevice):
    """One KFD compute node: a whole GPU, or one partition of ``amd_gpu``."""

    node: AmdComputeNode
    amd_gpu: AmdGpu


def devices(gpus: tuple[AmdGpu, ...]) -> list[AmdDevice]:
    gpu_of_node = {n.kfd_node: g.bdf for g in gpus for n in g.nodes}
    out: list[AmdDevice] = []
    seen: set[str] = set()
    for gpu in gpus:
        partitioned = len(gpu.nodes) > 1
        for node in gpu.nodes:
            address = pci_address(node.domain, node.location_id) if partitioned else gpu.bdf
            if address in seen:  # a capture without distinct partition addresses
                address = f"{gpu.bdf}-kfd{node.kfd_node}"
            seen.add(address)
            peers = tuple(gpu_of_node[peer] for peer, kind in node.links
                          if kind == LINK_XGMI and peer in gpu_of_node and gpu_of_node[peer] != gpu.bdf)
            out.append(AmdDevice(
                vendor=VENDOR, health_key=f"kfd:{node.kfd_node}", visible_id=address, gpu=gpu.bdf,
                numa_node=node.numa_node if node.numa_node is not None else gpu.numa_node,
                fabric_peers=peers, partition=(gpu.compute_partition or XCP) if partitioned else None, node=node,
                amd_gpu=gpu,
            ))
    return out


def groups(inventory: Inventory, config: Config) -> list[DeviceGroup]:
    part = inventory.part(AmdInventory)
    if part is None:
        return []
    return [DeviceGroup(GPU, VENDOR, tuple(devices(part.gpus)))]
