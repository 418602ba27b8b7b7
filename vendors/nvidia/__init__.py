"""NVIDIA GPUs: NVML probe (nvml), GFD's labels (labels), device groups by MIG strategy (devices),
Allocate (allocate), XID and lost-GPU health (health), a simulated NVML (simulate)."""

from __future__ import annotations

from labeller.vendor import Vendor, allocator_in, cdi_in, checker_in
from vendors.nvidia import devices, labels, mps, nvml
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
    allocator=allocator_in("vendors.nvidia.allocate"),
    health=checker_in("vendors.nvidia.health"),
    cdi=cdi_in("vendors.nvidia.cdi"),
    health_source="NVML: XID critical-error events, and a poll for GPUs that stop answering",
    simulator="vendors.nvidia.simulate",
    mps=mps.check,
    offer_inputs=mps.offer_inputs,
    key_docs=labels.KEY_DOCS,
)
