"""Run every backend against a host root and assemble one Inventory."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import structlog

from labeller.inventory import BackendReport, Inventory
from vendors import amd, dmi, nvidia, pci
from vendors.sysfs import Untrusted

log = structlog.get_logger(__name__)


def discover(host_root: Path, nvml: ModuleType | None = None, firmware: bool = False) -> Inventory:
    """Probe the node under ``host_root``. ``nvml`` replaces the real pynvml (simulation, tests);
    ``firmware`` also reads the AMD GPUs' firmware versions from debugfs.

    Raises ``ProbeError`` when the host root has no readable PCI device list, so that a wrong
    mount is never mistaken for a node without GPUs. Past that, backends never raise: a failure
    becomes a BackendReport, so one vendor's trouble cannot hide another vendor's GPUs.
    """
    pci_gpus, pci_report = pci.scan(host_root)
    nvidia_inventory, nvidia_report = nvidia.probe(host_root, pci_gpus, nvml)
    amd_inventory, amd_report = amd.probe(host_root, pci_gpus, firmware=firmware)
    reports: tuple[BackendReport, ...] = (pci_report, nvidia_report, amd_report)
    try:
        machine = dmi.read_machine(host_root)
    except Untrusted as exc:
        machine = None
        reports += (BackendReport("dmi", "error", f"machine name unreadable: {exc}"),)
    for report in reports:
        if report.status in ("unavailable", "error") or report.problems:
            log.warning("probe incomplete", backend=report.backend, status=report.status,
                        reason=report.detail, problems=list(report.problems))
    return Inventory(
        pci_gpus=pci_gpus,
        nvidia=nvidia_inventory,
        amd=amd_inventory,
        machine=machine,
        reports=reports,
    )
