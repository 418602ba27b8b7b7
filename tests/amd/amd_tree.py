"""Shared helpers for the AMD tests: fixture captures and small inventories."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from labeller.config import Config, LabelGroups
from labeller.inventory import AmdComputeNode, AmdGpu, AmdInventory, BackendReport, Inventory, PciGpu
from labeller.rules import node_labels
from vendors import amd, pci

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/amd"
MI300X_CPX = FIXTURES / "mi300x-x8-cpx-rocm-k8s-dp"
MI210 = FIXTURES / "mi210-x8-xgmi-rocm-k8s-dp"
RX7900XTX = FIXTURES / "rx7900xtx-navi31-tinygrad"
VEGA10 = FIXTURES / "vega10-mi25-rocm-k8s-dp"
FIRMWARE_INFO = FIXTURES / "debugfs-firmware-info/amdgpu_firmware_info"
TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"


def copy_capture(capture: Path, tmp_path: Path) -> Path:
    root = tmp_path / "host"
    shutil.copytree(capture, root)
    return root


def no_enrichment(host_root: Path) -> list[amd.EnrichedGpu]:
    return []


def pci_gpus_of(root: Path) -> tuple[PciGpu, ...]:
    """The PCI scan of a simulated root; the raw captures have no PCI tree, and their AMD backend
    is tested on its own."""
    return pci.scan(root)[0] if pci.devices_dir(root).is_dir() else ()


def probe(root: Path, firmware: bool = False) -> tuple[AmdInventory | None, BackendReport]:
    return amd.probe(root, pci_gpus_of(root), enricher=no_enrichment, firmware=firmware)


def labels_for(root: Path, config: Config | None = None) -> dict[str, str]:
    pci_gpus = pci_gpus_of(root)
    inventory, report = amd.probe(root, pci_gpus, enricher=no_enrichment, firmware=(config or Config()).labels.firmware)
    return node_labels(Inventory(pci_gpus=pci_gpus, amd=inventory, reports=(report,)), config or Config()).labels


def config(**groups: bool) -> Config:
    return Config(labels=replace(LabelGroups(), **groups))


def node(index: int, simd: int = 1216, per_cu: int = 4, vram: int | None = 206141652992) -> AmdComputeNode:
    return AmdComputeNode(kfd_node=index, gpu_id=index, render_minor=127 + index, card=index - 1, simd_count=simd,
                          simd_per_cu=per_cu, vram_bytes=vram, gfx_target_version=90402, location_id=index << 8, domain=0)


def gpu(index: int, device_id: int = 0x74A1, name: str | None = "AMD Instinct MI300X OAM", family: str | None = "AI",
        nodes: tuple[AmdComputeNode, ...] | None = None, **extra: object) -> AmdGpu:
    return AmdGpu(bdf=f"0000:{index:02x}:00.0", device_id=device_id, revision=0, product_name=name, family=family,
                  nodes=nodes if nodes is not None else (node(index + 1),), **extra)  # type: ignore[arg-type]


def inventory(*gpus: AmdGpu, driver: str = "6.8.5", src: str = "ABC123") -> Inventory:
    return Inventory(amd=AmdInventory(driver_version=driver, driver_src_version=src, gpus=gpus))


def amd_pci(bdf: str, device_id: int = 0x74A1, driver: str | None = "amdgpu") -> PciGpu:
    return PciGpu(bdf=bdf, vendor_id=0x1002, device_id=device_id, class_code=0x038000, revision=0, driver=driver)
