"""AMD facts, defined once: where sysfs keeps what the backend reads, KFD link types, partition
modes and how KFD encodes PCI addresses. Read by the probe, the device groups, the health checks
and the simulator alike.
"""

from __future__ import annotations

PCI_VENDOR_ID = 0x1002
PCI_CLASSES = (0x03, 0x12)  # display controllers, and processing accelerators (Instinct MI300 and later)

KFD_TOPOLOGY_DIRS = ("sys/class/kfd/kfd/topology", "sys/devices/virtual/kfd/kfd/topology")
AMDGPU_MODULE = "sys/module/amdgpu"
PCI_AMDGPU_DRIVER = "sys/module/amdgpu/drivers/pci:amdgpu"
DRM_CLASS = "sys/class/drm"
DEBUGFS_DRI = "sys/kernel/debug/dri"
FIRMWARE_INFO = "amdgpu_firmware_info"
HOST_AMDGPU_IDS = "usr/share/libdrm/amdgpu.ids"

LINK_XGMI = 11
LINK_PCIE = 2

# Partition modes with a fixed partition count; CPX has one partition per XCC, which depends on the chip.
PARTITIONS_BY_MODE = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4}


def pci_address(domain: int, location_id: int) -> str:
    """The PCI address KFD encodes: location_id = bus << 8 | device << 3 | function."""
    bus, device, function = location_id >> 8 & 0xFF, location_id >> 3 & 0x1F, location_id & 0x7
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def physical_function(bdf: str) -> str:
    """XCP partitions differ only in the function number: the physical GPU is function 0."""
    return bdf[:-1] + "0"
