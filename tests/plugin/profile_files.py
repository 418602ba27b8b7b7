"""Profile files that tests rewrite under a running plugin (the simulated hardware changing)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

L40S_BYTES = 48305799168  # nvidia-smi: 46068MiB


def l40s_node(gpus: int = 2, *, nvml_error: str | None = None, amd_gpus: int = 0,
              config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A node with ``gpus`` NVIDIA L40S (and ``amd_gpus`` AMD MI210); ``nvml_error`` makes nvmlInit fail."""
    nvidia: dict[str, Any] = {
        "driver_version": "550.90.07", "cuda_driver_version": 12040,
        "gpus": [{"name": "NVIDIA L40S", "repeat": gpus, "uuid": "GPU-3e9b7a41-52c8-4d1f-8a06-b7c2d4e1f9{i:02d}",
                  "pci_bus_id": "0000:{i:02x}:00.0", "memory_bytes": L40S_BYTES, "compute_capability": [8, 9]}],
    }
    if nvml_error is not None:
        nvidia["nvml_error"] = nvml_error
    profile: dict[str, Any] = {"name": "l40s", "nvidia": nvidia}
    if amd_gpus:
        profile["amd"] = mi210_node(amd_gpus)["amd"]
    if config is not None:
        profile["config"] = config
    return profile


def mi210_node(gpus: int = 2) -> dict[str, Any]:
    """A node with ``gpus`` AMD Instinct MI210 and no NVIDIA GPU."""
    return {"name": "mi210", "amd": {"driver_version": "6.8.5", "gpus": [
        {"device_id": 0x740F, "product_name": "AMD Instinct MI210", "gfx_target_version": 90010,
         "simd_count": 416, "vram_bytes": 68702699520, "repeat": gpus}]}}


def time_slicing(replicas: int, *, rename: bool = False, fail_on_init_error: bool = False) -> dict[str, Any]:
    """A config document that shares ``nvidia.com/gpu`` as ``replicas`` replicas."""
    return {"version": "v1", "flags": {"failOnInitError": fail_on_init_error},
            "sharing": {"timeSlicing": {"renameByDefault": rename,
                                        "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}


def write_yaml(path: Path, document: dict[str, Any]) -> None:
    """Replace ``path`` in one step, as a config-map update does, so a reader never sees half a file."""
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(yaml.safe_dump(document, sort_keys=False))
    os.replace(partial, path)
