"""PCI bus scan: which NVIDIA and AMD GPUs are physically present, driver or not."""

from __future__ import annotations

import os
from pathlib import Path

from labeller.inventory import AMD_VENDOR_ID, NVIDIA_VENDOR_ID, BackendReport, PciGpu
from vendors.sysfs import numa_node, read_int

DISPLAY_CLASS = 0x03  # PCI base class "display controller" (VGA 0x0300, 3D 0x0302, other 0x0380)
ACCELERATOR_CLASS = 0x12  # "processing accelerator": amdgpu also binds these (Instinct MI300 and later)
GPU_CLASSES = {NVIDIA_VENDOR_ID: (DISPLAY_CLASS,), AMD_VENDOR_ID: (DISPLAY_CLASS, ACCELERATOR_CLASS)}


def devices_dir(host_root: Path) -> Path:
    return host_root / "sys/bus/pci/devices"


def normalise_bdf(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" and sysfs's "0000:18:00.0" to the sysfs form, lower-case."""
    domain, _, rest = bus_id.strip().lower().rpartition(":")
    domain, _, bus = domain.rpartition(":") if domain.count(":") else ("", "", domain)
    domain_int = int(domain, 16) if domain else 0
    return f"{domain_int:04x}:{bus}:{rest}"


def read_device(path: Path) -> PciGpu | None:
    """A GPU from one ``/sys/bus/pci/devices/<bdf>`` directory; None if it is not a GPU we know."""
    vendor = read_int(path / "vendor")
    class_code = read_int(path / "class")
    if vendor not in GPU_CLASSES or class_code is None or class_code >> 16 not in GPU_CLASSES[vendor]:
        return None
    driver_link = path / "driver"
    driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
    return PciGpu(
        bdf=normalise_bdf(path.name),
        vendor_id=vendor,
        device_id=read_int(path / "device") or 0,
        class_code=class_code,
        revision=read_int(path / "revision"),
        numa_node=numa_node(read_int(path / "numa_node")),
        driver=driver,
    )


def scan(host_root: Path) -> tuple[tuple[PciGpu, ...], BackendReport]:
    root = devices_dir(host_root)
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return (), BackendReport("pci", "absent", f"{root} does not exist")
    except OSError as exc:
        return (), BackendReport("pci", "error", f"cannot list {root}: {exc.strerror}")
    gpus = tuple(gpu for entry in entries if (gpu := read_device(entry)) is not None)
    return gpus, BackendReport("pci", "ok" if gpus else "absent", f"{len(gpus)} GPU(s) on the PCI bus")
