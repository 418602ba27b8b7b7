"""PCI device entries for simulated host roots, laid out as the kernel lays out ``/sys/bus/pci``.

Every simulated node gets a host bridge, so that a node without GPUs still has the PCI tree a real
``/sys`` always has (an empty or missing one makes the probe fail, see ``vendors.pci``).
"""

from __future__ import annotations

import os
from pathlib import Path

from vendors.pci import DEVICES

HOST_BRIDGE = "0000:00:00.0"
HOST_BRIDGE_CLASS = 0x060000
# An AMD EPYC/Ryzen root complex, as lspci shows it at 00:00.0 on many GPU servers.
HOST_BRIDGE_IDS = (0x1022, 0x1480)


def write_device(root: Path, bdf: str, vendor: int, device: int, class_code: int, *, revision: int = 0,
                 numa_node: int | None = None, driver: str | None = None, config: bytes | None = None) -> Path:
    """``sys/bus/pci/devices/<bdf>`` with its id files; ``driver`` adds the bound driver's link."""
    path = root / DEVICES / bdf
    path.mkdir(parents=True, exist_ok=True)
    for name, text in (("vendor", f"0x{vendor:04x}"), ("device", f"0x{device:04x}"), ("class", f"0x{class_code:06x}"),
                       ("revision", f"0x{revision:02x}"), ("numa_node", str(-1 if numa_node is None else numa_node))):
        (path / name).write_text(text + "\n")
    if config is not None:
        (path / "config").write_bytes(config)
    if driver is not None:
        target = root / "sys/bus/pci/drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(target, path), path / "driver")
    return path


def write_host_bridge(root: Path) -> None:
    """The host bridge at 0000:00:00.0 (idempotent)."""
    if not (root / DEVICES / HOST_BRIDGE).exists():
        write_device(root, HOST_BRIDGE, *HOST_BRIDGE_IDS, HOST_BRIDGE_CLASS)
