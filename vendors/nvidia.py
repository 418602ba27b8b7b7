"""NVIDIA backend over NVML (pynvml). PLACEHOLDER: being written; reports 'absent' for now."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from labeller.inventory import BackendReport, NvidiaInventory, PciGpu


def probe(host_root: Path, pci_gpus: tuple[PciGpu, ...], nvml: ModuleType | None = None
          ) -> tuple[NvidiaInventory | None, BackendReport]:
    return None, BackendReport("nvidia", "absent", "backend not written yet")
