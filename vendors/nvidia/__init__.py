"""NVIDIA GPUs: NVML probe (nvml), GFD's labels (labels), device groups by MIG strategy (devices),
Allocate (allocate), XID and lost-GPU health (health), a simulated NVML (simulate)."""

from __future__ import annotations

from labeller.vendor import Vendor
from vendors.nvidia import allocate, devices, health, labels, nvml
from vendors.nvidia.facts import PCI_CLASSES, PCI_VENDOR_ID

VENDOR = Vendor(
    name="nvidia",
    pci_vendor_id=PCI_VENDOR_ID,
    pci_classes=PCI_CLASSES,
    presence_label="nvidia.com/gpu.present",
    labels_enabled=lambda config: config.labels.nvidia,
    probe=nvml.probe,
    labelers=labels.LABELERS,
    device_groups=devices.groups,
    allocator=allocate.allocator,
    health=health.checker,
    health_source="NVML: XID critical-error events, and a poll for GPUs that stop answering",
    simulator="vendors.nvidia.simulate",
)
