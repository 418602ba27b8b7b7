"""NVIDIA facts, defined once: PCI ids and classes, MIG instance profiles and how they are named
(which profiles each GPU has, and where they sit: ``vendors.nvidia.migtable``).

Read by the NVML backend, the label rules, the device groups and the simulated NVML alike.
"""

from __future__ import annotations

import math
import re
from types import ModuleType

PCI_VENDOR_ID = 0x10DE
COMPUTE_CLASS = 0x030200  # "3D controller": a compute GPU (gpu.mode=compute)
GRAPHICS_CLASS = 0x030000  # "VGA compatible controller" (gpu.mode=graphics)
PCI_CLASSES = (0x03,)  # display controllers
WHOLE_GPU = 0xFFFFFFFF  # an event's gpuInstanceId / computeInstanceId when it concerns the whole GPU

MIB = 1 << 20
GIB = 1 << 30

# GPU-instance profile (pynvml's NVML_GPU_INSTANCE_PROFILE_<name>) -> (GPU slices, profile-name
# suffix), as go-nvlib's NewProfile names them.
GPU_INSTANCE_PROFILES: dict[str, tuple[int, str]] = {
    "1_SLICE": (1, ""),
    "1_SLICE_REV1": (1, "+me"),
    "1_SLICE_REV2": (1, ""),
    "1_SLICE_GFX": (1, "+gfx"),
    "1_SLICE_NO_ME": (1, "-me"),
    "1_SLICE_ALL_ME": (1, "+me.all"),
    "2_SLICE": (2, ""),
    "2_SLICE_REV1": (2, "+me"),
    "2_SLICE_GFX": (2, "+gfx"),
    "2_SLICE_NO_ME": (2, "-me"),
    "2_SLICE_ALL_ME": (2, "+me.all"),
    "3_SLICE": (3, ""),
    "3_SLICE_GFX": (3, "+gfx"),
    "4_SLICE": (4, ""),
    "4_SLICE_GFX": (4, "+gfx"),
    "6_SLICE": (6, ""),
    "7_SLICE": (7, ""),
    "8_SLICE": (8, ""),
}
# Compute-instance profile (pynvml's NVML_COMPUTE_INSTANCE_PROFILE_<name>) -> compute slices.
COMPUTE_INSTANCE_PROFILES: dict[str, int] = {
    "1_SLICE": 1,
    "1_SLICE_REV1": 1,
    "2_SLICE": 2,
    "3_SLICE": 3,
    "4_SLICE": 4,
    "6_SLICE": 6,
    "7_SLICE": 7,
    "8_SLICE": 8,
}


def gpu_instance_profiles(nvml: ModuleType) -> dict[int, tuple[int, str]]:
    """NVML's GPU-instance profile index -> (slices, suffix), for the constants this pynvml has."""
    return {getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_" + name): value
            for name, value in GPU_INSTANCE_PROFILES.items() if hasattr(nvml, "NVML_GPU_INSTANCE_PROFILE_" + name)}


def compute_instance_profiles(nvml: ModuleType) -> dict[int, int]:
    """NVML's compute-instance profile index -> compute slices, for the constants this pynvml has."""
    return {getattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_" + name): slices
            for name, slices in COMPUTE_INSTANCE_PROFILES.items()
            if hasattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_" + name)}


def mig_memory_gb(memory_mib: int, parent_total_bytes: int) -> int:
    """The "<GB>gb" of a MIG profile name, as go-nvlib computes it (rounded to eighths of the GPU)."""
    fraction = memory_mib * MIB / parent_total_bytes
    fraction = math.ceil(fraction * 8) / 8
    total_gb = -(-parent_total_bytes // GIB)  # ceiling division
    return math.floor(fraction * total_gb + 0.5)  # Go's math.Round: halves away from zero, not to even


def mig_profile_name(gpu_slices: int, compute_slices: int, memory_gb: int, suffix: str = "") -> str:
    """"1g.5gb", "1c.3g.20gb", "1g.10gb+me": the compute count is only written when it differs."""
    base = (f"{gpu_slices}g.{memory_gb}gb" if compute_slices == gpu_slices
            else f"{compute_slices}c.{gpu_slices}g.{memory_gb}gb")
    return base + suffix


def name_in_labels(profile: str) -> str:
    """The profile as resource names and label values write it: "+" is not allowed there, so
    "1g.10gb+me" -> "1g.10gb.me" (GFD's GetName)."""
    return profile.replace("+", ".")


def mig_resource(profile: str) -> str:
    """The MIG-mixed resource name and label prefix, e.g. "nvidia.com/mig-1g.10gb.me"."""
    return "nvidia.com/mig-" + name_in_labels(profile)


def profile_label(profile: str) -> str:
    """A MIG profile name as NVIDIA's DRA driver puts it into device names: dots dropped, lower-case,
    any other character a DNS label cannot hold a dash, no dash at either end (``1g.10gb+me`` is
    ``1g10gb-me``)."""
    return re.sub(r"[^a-z0-9-]", "-", profile.replace(".", "").lower()).strip("-")
