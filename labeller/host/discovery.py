"""Probe a host root: the PCI scan, then each vendor's backend, assembled into one Inventory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labeller.model.config import Config
from labeller.model.inventory import BackendReport, Inventory, VendorPart
from labeller.model.vendor import Vendor
from vendors import dmi, pci
from vendors.sysfs import Untrusted
from labeller.base.log import get_logger

log = get_logger(__name__)


def discover(host_root: Path, config: Config, vendors: Sequence[Vendor],
             handles: Mapping[str, Any] | None = None) -> Inventory:
    """Probe the node under ``host_root``. ``handles`` hands a simulated node's stand-ins (a fake
    pynvml) to the vendor of that name.

    Raises ``ProbeError`` when the host root has no readable PCI device list, so that a wrong
    mount is never mistaken for a node without GPUs. Past that, backends never raise: a failure
    becomes a BackendReport, so one vendor's trouble cannot hide another vendor's GPUs.
    """
    handles = handles or {}
    pci_gpus, pci_report = pci.scan(host_root, {v.discovery.pci_vendor_id: v.discovery.pci_classes for v in vendors})
    parts: list[VendorPart] = []
    reports: list[BackendReport] = [pci_report]
    for vendor in vendors:
        part, report = vendor.discovery.probe(host_root, pci_gpus, config, handles.get(vendor.name))
        reports.append(report)
        if part is not None:
            parts.append(part)
    try:
        machine = dmi.read_machine(host_root, config.gfd.machine_type_file)
    except Untrusted as exc:
        machine = None
        reports.append(BackendReport("dmi", "error", f"machine name unreadable: {exc}"))
    for report in reports:
        if report.status in ("unavailable", "error") or report.problems:
            log.warning("probe incomplete", backend=report.backend, status=report.status,
                        reason=report.detail, problems=list(report.problems))
    return Inventory(pci_gpus=pci_gpus, parts=tuple(parts), machine=machine, reports=tuple(reports))
