"""Helpers for the NVIDIA tests: real GPU figures, and a simulated node built from a profile section."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from labeller.config import Config, parse_config
from labeller.discovery import discover
from labeller.inventory import Inventory
from labeller.rules import node_labels
from vendors import fake_nvml

# nvidia-smi figures: H100 SXM 81559 MiB, A100-SXM4-40GB 40536 MiB, T4 15109 MiB.
H100_BYTES = 85520809984
A100_40GB_BYTES = 42505273344
A100_80GB_BYTES = 85899345920
T4_BYTES = 15843721216


def h100(**overrides: Any) -> dict[str, Any]:
    gpu = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000000-0000-4000-8000-0000000000{i:02d}",
           "pci_bus_id": "0000:{i:02x}:00.0", "memory_bytes": H100_BYTES, "compute_capability": [9, 0],
           "mig_mode": "disabled"}
    return gpu | overrides


def a100(**overrides: Any) -> dict[str, Any]:
    gpu = {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-a1000000-0000-4000-8000-0000000000{i:02d}",
           "pci_bus_id": "0000:{i:02x}:00.0", "memory_bytes": A100_40GB_BYTES, "compute_capability": [8, 0],
           "mig_mode": "disabled"}
    return gpu | overrides


def mig_1g5gb(repeat: int = 1) -> dict[str, Any]:
    """nvidia-smi mig -lgip on an A100-SXM4-40GB: 1g.5gb has 4.75 GiB, 14 SMs, 1 copy engine."""
    return {"profile": "1g.5gb", "repeat": repeat, "uuid": "MIG-00000000-0000-4000-8000-00000000{gpu:02d}{i:02d}",
            "memory_mib": 4864, "multiprocessors": 14, "engines_copy": 1}


def section(*gpus: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"driver_version": "550.54.15", "cuda_driver_version": 12040, "gpus": list(gpus)} | extra


def build(tmp_path: Path, nvidia: dict[str, Any]) -> tuple[Path, ModuleType]:
    root = tmp_path / "root"
    root.mkdir(parents=True, exist_ok=True)
    return root, fake_nvml.build(nvidia, root)


def inventory_of(tmp_path: Path, nvidia: dict[str, Any]) -> Inventory:
    root, nvml = build(tmp_path, nvidia)
    return discover(root, nvml)


def labels_of(tmp_path: Path, nvidia: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, str]:
    parsed = parse_config(config) if config is not None else Config()
    label_set = node_labels(inventory_of(tmp_path, nvidia), parsed)
    assert label_set.conflicts == [] and label_set.dropped == {}
    return label_set.labels
