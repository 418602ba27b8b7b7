"""PCI device entries for simulated host roots, laid out as the kernel lays out ``/sys/bus/pci``.

Every simulated node gets a host bridge, so that a node without GPUs still has the PCI tree a real
``/sys`` always has (an empty or missing one makes the probe fail, see ``vendors.pci``).

As in a real ``/sys``, a device's files live in the hardware tree, ``sys/devices/<root>/<root
port>/<bdf>``, and ``sys/bus/pci/devices/<bdf>`` is a relative link to it; that link tells the PCI
root complex (``vendors.pci.pcie_root``). A simulated machine has eight root complexes per PCI
domain, each owning 32 buses (``pci0000:00``, ``pci0000:20``, ... ``pci0000:e0``), as two-socket
AMD EPYC servers such as the DGX A100 lay them out, so GPUs on nearby buses share a root.
"""

from __future__ import annotations

import os
from pathlib import Path

from vendors.pci import DEVICES

HOST_BRIDGE = "0000:00:00.0"
HOST_BRIDGE_CLASS = 0x060000
# An AMD EPYC/Ryzen root complex, as lspci shows it at 00:00.0 on many GPU servers.
HOST_BRIDGE_IDS = (0x1022, 0x1480)


BUSES_PER_ROOT = 0x20


def root_bus(bdf: str) -> str:
    """The simulated PCI root complex of ``bdf``: ``pci0000:40`` for ``0000:47:00.0``."""
    domain, bus, _ = bdf.split(":")
    return f"pci{domain}:{int(bus, 16) & ~(BUSES_PER_ROOT - 1):02x}"


def _hardware_path(bdf: str) -> str:
    """``devices/<root>[/<root port>]/<bdf>`` under ``sys``: a device on a bus of its own sits behind a
    root port of its root bus (function 01.1, as on EPYC); one on the root bus itself (a host bridge)
    sits directly under it."""
    root = root_bus(bdf)
    domain, bus = root.removeprefix("pci").split(":")
    if bdf.split(":")[1] == bus:
        return f"devices/{root}/{bdf}"
    return f"devices/{root}/{domain}:{bus}:01.1/{bdf}"


def write_device(root: Path, bdf: str, vendor: int, device: int, class_code: int, *, revision: int = 0,
                 numa_node: int | None = None, driver: str | None = None, config: bytes | None = None) -> Path:
    """The device's directory in ``sys/devices`` with its id files, linked from
    ``sys/bus/pci/devices/<bdf>``; ``driver`` adds the bound driver's link. Returns the link."""
    path = root / DEVICES / bdf
    directory = root / "sys" / _hardware_path(bdf)
    if path.is_symlink() or path.exists():  # written before: its files are added to
        directory = Path(os.path.realpath(path))
    else:
        directory.mkdir(parents=True, exist_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(directory, path.parent), path)
    for name, text in (("vendor", f"0x{vendor:04x}"), ("device", f"0x{device:04x}"), ("class", f"0x{class_code:06x}"),
                       ("revision", f"0x{revision:02x}"), ("numa_node", str(-1 if numa_node is None else numa_node))):
        (directory / name).write_text(text + "\n")
    if config is not None:
        (directory / "config").write_bytes(config)
    if driver is not None:
        target = root / "sys/bus/pci/drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(target, directory), directory / "driver")
    return path


def write_host_bridge(root: Path) -> None:
    """The host bridge at 0000:00:00.0 (idempotent)."""
    if not (root / DEVICES / HOST_BRIDGE).exists():
        write_device(root, HOST_BRIDGE, *HOST_BRIDGE_IDS, HOST_BRIDGE_CLASS)
