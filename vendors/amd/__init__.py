"""AMD GPUs: sysfs probe (probe: KFD topology, DRM cards, amdgpu module; ids: family and names),
AMD's labeller's labels (labels), one device per KFD compute node (devices), Allocate (allocate),
KFD health (health), a simulated sysfs tree (simulate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labeller.config import Config
from labeller.inventory import BackendReport, PciGpu
from labeller.vendor import Vendor, allocator_in, cdi_in, checker_in
from vendors.amd import devices, labels, probe
from vendors.amd.facts import PCI_CLASSES, PCI_VENDOR_ID
from vendors.amd.model import AmdInventory


def _probe(host_root: Path, pci_gpus: tuple[PciGpu, ...], config: Config, handle: Any
           ) -> tuple[AmdInventory | None, BackendReport]:
    # A simulated node hands in its own enricher (one that finds nothing), never the host's GPUs.
    return probe.probe(host_root, pci_gpus, config, handle if handle is not None else probe.pyamdgpuinfo_enricher)


VENDOR = Vendor(
    name="amd",
    pci_vendor_id=PCI_VENDOR_ID,
    pci_classes=PCI_CLASSES,
    presence_label="amd.com/gpu.present",  # ours: AMD's labeller has no presence label to select on
    labels_enabled=lambda config: config.labels.amd or config.labels.amd_beta,
    probe=_probe,
    labelers=labels.LABELERS,
    device_groups=devices.groups,
    allocator=allocator_in("vendors.amd.allocate"),
    health=checker_in("vendors.amd.health"),
    cdi=cdi_in("vendors.amd.cdi"),
    health_source="KFD topology: a compute node whose topology node disappears",
    simulator="vendors.amd.simulate",
    key_docs=labels.KEY_DOCS,
)
