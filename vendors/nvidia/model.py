"""What NVML says about a node's NVIDIA GPUs: plain, immutable data (the NVIDIA part of the inventory).

Built by ``vendors.nvidia.nvml``; read by the label rules, the device groups and the plugin's
allocation and health checks of this package. Field units are in the names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from labeller.model.inventory import VendorPart
from vendors.nvidia.facts import mig_resource


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
    # Its GPU instance as nvmlGpuInstanceGetInfo gives it: the profile id (19 is 1g.5gb on an A100)
    # and the memory slices it occupies, placement.start to start + size - 1. None where not read.
    gpu_instance_profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None

    @property
    def memory_slices(self) -> range | None:
        """The GPU memory slices its GPU instance occupies; None where the placement was not read."""
        if self.placement_start is None or self.placement_size is None:
            return None
        return range(self.placement_start, self.placement_start + self.placement_size)

    @property
    def resource_name(self) -> str:
        """MIG-mixed resource and label prefix, e.g. "nvidia.com/mig-1g.10gb.me"."""
        return mig_resource(self.profile)


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile of a MIG-enabled GPU, as NVML describes it to whoever makes MIG
    devices (nvmlDeviceGetGpuInstanceProfileInfo and nvmlDeviceGetGpuInstancePossiblePlacements):
    what a MIG device of it takes of the GPU, how many may exist at once, and where each may sit."""

    index: int  # NVML's profile index (NVML_GPU_INSTANCE_PROFILE_*), what the info call takes
    id: int  # the profile id NVML reports (``nvidia-smi mig -lgip`` "ID"), what creating one takes
    name: str  # "1g.5gb", "1g.10gb+me": go-nvlib's name of its whole-instance MIG device
    slices: int  # its compute (GPC) slices: sliceCount
    instances: int  # how many can exist on the GPU at once: instanceCount
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices, as NVML lists them


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
    brand: str | None = None  # nvmlDeviceGetBrand as go-nvlib names it ("Nvidia", "GeForceRTX"); None: not given
    # nvmlDeviceGetAddressingMode: "HMM", "ATS" or "None" (possible, not active); None where the driver
    # (before 580) or the platform has none
    addressing_mode: str | None = None
    # Its MIG geometry, read only where MIG devices are made at prepare (labeller.dra.dynamicMig)
    # and MIG is enabled: every GPU instance profile NVML offers on it. Empty: not read.
    mig_profiles: tuple[MigProfile, ...] = ()


@dataclass(frozen=True)
class MpsServed:
    """One resource an MPS control daemon serves, as its readiness file says: every daemon of it
    answers and its limits are set."""

    resource: str  # the advertised name, e.g. "nvidia.com/gpu" or "nvidia.com/gpu.shared"
    replicas: int
    devices: tuple[str, ...]  # GPU UUIDs, sorted


@dataclass(frozen=True)
class MpsReadiness:
    """What ``gpu-labeller mps-control-daemon`` says it serves, read from its readiness file under
    ``flags.mpsRoot``: ``served`` is empty and ``problem`` says why when the file is missing,
    unreadable or stale (its heartbeat stopped)."""

    served: tuple[MpsServed, ...] = ()
    problem: str | None = None


@dataclass(frozen=True)
class NvidiaInventory(VendorPart):
    """NVIDIA's part of the inventory: what NVML (and PCI config space) said."""

    vendor: ClassVar[str] = "nvidia"
    driver_version: str  # "550.54.15"
    cuda_driver_version: int  # nvmlSystemGetCudaDriverVersion, e.g. 12040
    gpus: tuple[NvidiaGpu, ...]
    # A GPU is a vGPU: its PCI config space has NVIDIA's "VF" capability (or, where only the first
    # 64 bytes are readable, NVML says so). None: could not be determined, vgpu labels are omitted.
    vgpu_present: bool | None = False
    vgpu_host_driver: tuple[str, str] | None = None  # (version, branch) from the capability's record
    mps: MpsReadiness | None = None  # read only when the config shares by MPS
