"""What sysfs says about a node's AMD GPUs: plain, immutable data (the AMD part of the inventory).

Built by ``vendors.amd.probe``; read by the label rules, the device groups and the plugin's
allocation and health checks of this package. Field units are in the names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from labeller.model.inventory import VendorPart


@dataclass(frozen=True)
class AmdComputeNode:
    """One KFD topology node of a GPU: the whole GPU, or one compute partition (XCP) of it."""

    kfd_node: int  # topology node index
    gpu_id: int | None  # KFD gpu_id file
    render_minor: int  # drm_render_minor -> /dev/dri/renderD<minor>
    card: int | None  # /dev/dri/card<N> when known
    simd_count: int
    simd_per_cu: int
    vram_bytes: int | None  # mem_banks/0 size_in_bytes; None when the capture has no mem_banks
    gfx_target_version: int | None
    location_id: int
    domain: int
    numa_node: int | None = None
    # (peer kfd node, link type) from io_links/p2p_links; type 11 = XGMI, 2 = PCIe
    links: tuple[tuple[int, int], ...] = ()
    num_xcc: int | None = None  # its accelerator complex dies (XCCs), where KFD says (MI300 and later)


@dataclass(frozen=True)
class AmdGpu:
    """One physical AMD GPU, grouping its KFD nodes (several when compute-partitioned)."""

    bdf: str  # physical function, "0000:19:00.0"
    device_id: int
    revision: int | None
    product_name: str | None  # board FRU product_name, else amdgpu.ids marketing name
    family: str | None  # libdrm-style family code: "AI", "NV", "GC_11_0_0", ...
    nodes: tuple[AmdComputeNode, ...]
    compute_partition: str | None = None  # lower-case "spx", "cpx", ...
    memory_partition: str | None = None  # lower-case "nps1", ...
    compute_partitioning_supported: bool = False
    memory_partitioning_supported: bool = False
    # the compute partition modes available_compute_partition lists, lower-case ("spx", "dpx", ...)
    available_compute_partitions: tuple[str, ...] = ()
    numa_node: int | None = None
    unique_id: str | None = None
    expected_partitions: int | None = None  # from the partition mode (cpx on MI300X -> 8)
    firmware: tuple[tuple[str, int, int], ...] = ()  # (block, feature, version) when readable


@dataclass(frozen=True)
class AmdInventory(VendorPart):
    """AMD's part of the inventory: what sysfs (KFD topology, DRM cards, amdgpu module) said."""

    vendor: ClassVar[str] = "amd"
    driver_version: str  # /sys/module/amdgpu/version; "" for in-tree amdgpu
    driver_src_version: str
    gpus: tuple[AmdGpu, ...]
