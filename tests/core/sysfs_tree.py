"""Build small sysfs trees laid out as the kernel lays them out (for PCI tests)."""

from __future__ import annotations

import os
from pathlib import Path


def add_pci_device(root: Path, bdf: str, vendor: int, device: int, class_code: int,
                   numa_node: int = -1, driver: str | None = None, revision: int = 0xA1) -> Path:
    path = root / "sys/bus/pci/devices" / bdf
    path.mkdir(parents=True)
    (path / "vendor").write_text(f"0x{vendor:04x}\n")
    (path / "device").write_text(f"0x{device:04x}\n")
    (path / "class").write_text(f"0x{class_code:06x}\n")
    (path / "revision").write_text(f"0x{revision:02x}\n")
    (path / "numa_node").write_text(f"{numa_node}\n")
    if driver is not None:
        target = root / "sys/bus/pci/drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(target, path), path / "driver")
    return path
