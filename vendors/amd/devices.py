"""AMD's device groups: one device per KFD compute node, as AMD's plugin offers them.

A partitioned GPU (CPX, DPX, ...) offers each partition; its ID is the partition's PCI address
from KFD (the GPU's own address when it is not partitioned). Peers are the GPUs a partition's
node reaches over XGMI.

Resource names follow AMD's plugin's naming strategies (``labeller.amd.resourceNamingStrategy``):
- ``single`` (the default): every device is ``amd.com/gpu``. AMD's plugin refuses to start on a
  node whose GPUs are in different partition modes; we advertise them all and warn.
- ``mixed``: a device of a GPU whose compute and memory partition modes are known is
  ``amd.com/<compute>_<memory>`` (``amd.com/cpx_nps4``); others (GPUs without partitioning, such
  as the MI210) stay ``amd.com/gpu``. AMD's plugin puts those under the one partition name when
  the node has only one (and drops them when it has several).
"""

from __future__ import annotations

from dataclasses import dataclass

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import DeviceGroup, PhysicalDevice
from vendors.amd.facts import LINK_XGMI, pci_address
from vendors.amd.model import AmdComputeNode, AmdGpu, AmdInventory
from vendors.amd.settings import AmdSettings
from labeller.base.log import get_logger

GPU = "amd.com/gpu"
VENDOR = "amd"
XCP = "xcp"  # a compute partition whose mode the partition files do not say (a raw KFD capture)

log = get_logger(__name__)


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
                amd_gpu=gpu, names=(address, str(len(out))),
            ))
    return out


def partition_type(gpu: AmdGpu) -> str | None:
    """``cpx_nps4``: AMD's plugin's partition type, when both modes are known."""
    if gpu.compute_partition and gpu.memory_partition:
        return f"{gpu.compute_partition}_{gpu.memory_partition}"
    return None


def groups(inventory: Inventory, config: Config) -> list[DeviceGroup]:
    part = inventory.part(AmdInventory)
    if part is None:
        return []
    found = devices(part.gpus)
    if config.section(AmdSettings).resource_naming == "mixed":
        by_name: dict[str, list[PhysicalDevice]] = {}
        for device in found:
            kind = partition_type(device.amd_gpu)
            by_name.setdefault(f"amd.com/{kind}" if kind else GPU, []).append(device)
        return [DeviceGroup(name, VENDOR, tuple(members)) for name, members in by_name.items()]
    kinds = sorted({kind for d in found if (kind := partition_type(d.amd_gpu))})
    if len(kinds) > 1:
        log.warning("GPUs in different partition modes are all advertised as amd.com/gpu, so a pod cannot choose "
                    "one (AMD's plugin refuses to start); labeller.amd.resourceNamingStrategy: mixed names each mode",
                    vendor=VENDOR, reason="mixed-partitions", modes=kinds)
    return [DeviceGroup(GPU, VENDOR, tuple(found))]
