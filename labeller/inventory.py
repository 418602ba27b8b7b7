"""What discovery found on a node.

Plain, immutable data and no I/O: vendor backends (``vendors/``) build these objects, label rules
(``labeller/``) and the device plugin read them. Field units are in the names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

NVIDIA_VENDOR_ID = 0x10DE
AMD_VENDOR_ID = 0x1002


@dataclass(frozen=True)
class PciGpu:
    """A display/3D controller seen on the PCI bus, whether or not a driver is bound."""

    bdf: str  # "0000:18:00.0", lower-case, 4-digit domain
    vendor_id: int
    device_id: int
    class_code: int  # 24-bit, e.g. 0x030200 (3D controller), 0x030000 (VGA)
    revision: int | None = None
    numa_node: int | None = None  # None when the kernel says -1 or the file is unreadable
    driver: str | None = None  # bound driver name ("nvidia", "amdgpu"), None if unbound


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of an NVIDIA GPU, with the attributes NVML reports for it."""

    index: int  # position under its parent (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str  # "MIG-..."
    profile: str  # NVIDIA profile name as go-nvlib prints it, e.g. "1g.10gb", "1g.10gb+me"
    memory_mib: int  # memorySizeMB attribute
    multiprocessors: int = 0
    slices_gi: int = 0
    slices_ci: int = 0
    engines_copy: int = 0
    engines_decoder: int = 0
    engines_encoder: int = 0
    engines_jpeg: int = 0
    engines_ofa: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def name_in_labels(self) -> str:
        """The profile as resource names and label values write it: "+" is not allowed there, so
        "1g.10gb+me" -> "1g.10gb.me" (GFD's GetName)."""
        return self.profile.replace("+", ".")

    @property
    def resource_name(self) -> str:
        """MIG-mixed resource and label prefix, e.g. "nvidia.com/mig-1g.10gb.me"."""
        return "nvidia.com/mig-" + self.name_in_labels


@dataclass(frozen=True)
class NvidiaGpu:
    """One physical NVIDIA GPU as NVML describes it."""

    index: int  # NVML index
    name: str  # nvmlDeviceGetName, raw (e.g. "NVIDIA H100 80GB HBM3")
    uuid: str  # "GPU-..."
    memory_bytes: int  # nvmlDeviceGetMemoryInfo().total; 0 when unknown
    compute_capability: tuple[int, int] | None  # (major, minor); None when unknown
    pci_bus_id: str  # normalised like PciGpu.bdf: "0000:18:00.0"
    minor_number: int | None = None  # /dev/nvidia<minor>
    mig_capable: bool = False  # nvmlDeviceGetMigMode succeeded
    mig_enabled: bool = False  # current MIG mode is enabled
    mig_devices: tuple[MigDevice, ...] = ()
    nvlink_peers: tuple[str, ...] = ()  # bus ids of the far end, one entry per active link
    numa_node: int | None = None
    pci_class: int | None = None  # from sysfs; decides gpu.mode
    clique: str | None = None  # "<clusterUUID>.<cliqueId>" for fabric-attached GPUs
    vgpu_guest: bool | None = None  # NVML virtualization mode is VGPU; None when NVML cannot say


@dataclass(frozen=True)
class NvidiaInventory:
    driver_version: str  # "550.54.15"
    cuda_driver_version: int  # nvmlSystemGetCudaDriverVersion, e.g. 12040
    gpus: tuple[NvidiaGpu, ...]
    # A GPU is a vGPU: its PCI config space has NVIDIA's "VF" capability (or, where only the first
    # 64 bytes are readable, NVML says so). None: could not be determined, vgpu labels are omitted.
    vgpu_present: bool | None = False
    vgpu_host_driver: tuple[str, str] | None = None  # (version, branch) from the capability's record


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
    numa_node: int | None = None
    unique_id: str | None = None
    expected_partitions: int | None = None  # from the partition mode (cpx on MI300X -> 8)
    firmware: tuple[tuple[str, int, int], ...] = ()  # (block, feature, version) when readable


@dataclass(frozen=True)
class AmdInventory:
    driver_version: str  # /sys/module/amdgpu/version; "" for in-tree amdgpu
    driver_src_version: str
    gpus: tuple[AmdGpu, ...]


BackendStatus = Literal["ok", "absent", "unavailable", "error"]


class ProbeError(Exception):
    """The probe as a whole cannot be trusted (no readable ``/sys/bus/pci/devices`` under the host
    root, an unreadable tree): nothing may be added or removed on its account. The message is one
    line naming the path and the likely cause."""


@dataclass(frozen=True)
class BackendReport:
    """What one backend saw, and why it found nothing when it did not.

    ``absent``: no hardware for this backend. ``unavailable``: hardware is there but the
    library/driver is not (labels fall back to PCI presence). ``error``: the probe failed or was
    partial; consumers must not treat the result as the whole truth.
    """

    backend: str  # "pci", "nvidia", "amd", "dmi", "pyamdgpuinfo"
    status: BackendStatus
    detail: str = ""
    problems: tuple[str, ...] = ()  # per-device problems that did not stop the backend


@dataclass(frozen=True)
class Inventory:
    pci_gpus: tuple[PciGpu, ...] = ()
    nvidia: NvidiaInventory | None = None
    amd: AmdInventory | None = None
    machine: str | None = None  # raw DMI product name
    reports: tuple[BackendReport, ...] = field(default=())

    @property
    def partial(self) -> bool:
        """True when the labels may be incomplete: a backend failed, skipped a device, or could not
        describe GPUs that are on the PCI bus (e.g. NVML missing during a driver upgrade). Callers
        that write labels must not remove any on a partial inventory."""
        return any(r.status in ("error", "unavailable") or r.problems for r in self.reports)

    def pci_gpus_of(self, vendor_id: int) -> tuple[PciGpu, ...]:
        return tuple(g for g in self.pci_gpus if g.vendor_id == vendor_id)
