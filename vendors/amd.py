"""AMD backend over sysfs (KFD topology). PLACEHOLDER: being written; reports 'absent' for now."""

from __future__ import annotations

from pathlib import Path

from labeller.inventory import AmdInventory, BackendReport, PciGpu


def probe(host_root: Path, pci_gpus: tuple[PciGpu, ...]) -> tuple[AmdInventory | None, BackendReport]:
    return None, BackendReport("amd", "absent", "backend not written yet")
