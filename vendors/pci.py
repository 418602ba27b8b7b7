"""PCI bus scan: which GPUs are physically present, driver or not.

Which devices are GPUs is each vendor's fact (``Discovery.pci_vendor_id`` and ``pci_classes``): the
scan is handed a map of PCI vendor id -> base classes.

A readable ``sys/bus/pci/devices`` is what makes the whole probe trustworthy: without it (a wrong
``--host-root``, ``/sys`` not mounted, or the empty directory a ``DirectoryOrCreate`` hostPath
leaves) the scan raises ``ProbeError`` instead of reporting a node without GPUs.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path

from labeller.model.inventory import BackendReport, PciGpu, ProbeError
from vendors.sysfs import Untrusted, list_dir, numa_node, read_int

GpuClasses = Mapping[int, tuple[int, ...]]  # PCI vendor id -> the PCI base classes that are its GPUs
DEVICES = "sys/bus/pci/devices"
_BDF = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
# A PCI root bus as the kernel names its directory under /sys/devices: "pci<domain>:<bus>"
# (a VMD domain has five digits: pci10000:00).
_ROOT_BUS = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")
_HINT = "is the host's /sys mounted at --host-root (HOST_ROOT)?"


def devices_dir(host_root: Path) -> Path:
    return host_root / DEVICES


def normalise_bdf(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" and sysfs's "0000:18:00.0" to the sysfs form, lower-case."""
    domain, _, rest = bus_id.strip().lower().rpartition(":")
    domain, _, bus = domain.rpartition(":") if domain.count(":") else ("", "", domain)
    domain_int = int(domain, 16) if domain else 0
    return f"{domain_int:04x}:{bus}:{rest}"


def pcie_root(entry: Path) -> str | None:
    """The PCI root complex of the device whose ``sys/bus/pci/devices/<bdf>`` entry is ``entry``, as
    Kubernetes defines ``resource.kubernetes.io/pcieRoot`` (k8s.io/dynamic-resource-allocation/
    deviceattribute): the kernel links that entry to the device's place in the hardware tree,
    ``../../../devices/pci0000:40/0000:40:01.1/0000:47:00.0``, and the root is the first directory
    under ``/sys/devices``. None where the entry is no such link (a hand-made tree, a capture without
    links): the attribute is then left out, as the vendors' drivers leave it out."""
    try:
        target = os.readlink(entry)
    except OSError:  # not a link, or gone
        return None
    if posixpath.isabs(target):
        return None
    parts = posixpath.normpath(posixpath.join("bus/pci/devices", target)).split("/")
    if len(parts) < 3 or parts[0] != "devices" or parts[-1] != entry.name or not _ROOT_BUS.fullmatch(parts[1]):
        return None
    return parts[1]


def read_device(path: Path, gpu_classes: GpuClasses) -> PciGpu | None:
    """A GPU from one ``/sys/bus/pci/devices/<bdf>`` directory; None if it is not a GPU we know.

    ``Untrusted`` when its files cannot tell: no readable vendor, or one of our vendors without a
    readable class, or ids wider than PCI allows.
    """
    vendor = read_int(path / "vendor")
    if vendor is None or not 0 <= vendor <= 0xFFFF:
        raise Untrusted(path / "vendor", "no PCI vendor id in it")
    if vendor not in gpu_classes:
        return None
    class_code = read_int(path / "class")
    if class_code is None or not 0 <= class_code <= 0xFFFFFF:
        raise Untrusted(path / "class", "no PCI class code in it")
    if class_code >> 16 not in gpu_classes[vendor]:
        return None
    device_id = read_int(path / "device") or 0
    revision = read_int(path / "revision")
    if not 0 <= device_id <= 0xFFFF or (revision is not None and not 0 <= revision <= 0xFF):
        raise Untrusted(path, f"device id {device_id:#x} or revision {revision} wider than PCI allows")
    driver_link = path / "driver"
    driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
    return PciGpu(
        bdf=normalise_bdf(path.name),
        vendor_id=vendor,
        device_id=device_id,
        class_code=class_code,
        revision=revision,
        numa_node=numa_node(read_int(path / "numa_node")),
        driver=driver,
        pcie_root=pcie_root(path),
    )


def device_names(host_root: Path) -> list[str]:
    """The PCI addresses listed under ``sys/bus/pci/devices``; ``ProbeError`` when there is no
    trustworthy list (a real /sys always lists at least the host bridge)."""
    root = devices_dir(host_root)
    try:
        names = list_dir(root)
    except Untrusted as exc:
        raise ProbeError(f"{exc.path}: {exc.reason}: {_HINT}") from None
    if names is None:
        raise ProbeError(f"{root} does not exist: {_HINT}")
    devices = [name for name in names if _BDF.fullmatch(name)]
    if not devices:
        raise ProbeError(f"{root} lists no PCI device, and a real /sys always lists some: {_HINT}")
    return devices


def scan(host_root: Path, gpu_classes: GpuClasses) -> tuple[tuple[PciGpu, ...], BackendReport]:
    """Every GPU on the bus (``gpu_classes``: whose). A device whose files cannot be trusted is a problem in
    the report (it might be a GPU), and the other devices are still scanned."""
    root = devices_dir(host_root)
    names = device_names(host_root)
    gpus: list[PciGpu] = []
    problems: list[str] = []
    for name in names:
        try:
            gpu = read_device(root / name, gpu_classes)
        except Untrusted as exc:
            problems.append(f"{name}: {exc}; cannot tell whether it is a GPU")
            continue
        if gpu is not None:
            gpus.append(gpu)
    detail = f"{len(gpus)} GPU(s) among {len(names)} PCI device(s)"
    return tuple(gpus), BackendReport("pci", "ok" if gpus else "absent", detail, tuple(problems))
