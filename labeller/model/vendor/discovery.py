"""How a vendor's GPUs are found and labelled (role 1): what every command runs, the dry run included.

``Discovery`` finds them: which PCI devices are its GPUs, the probe of its driver or sysfs, and the
stand-in a simulated node gives that probe. ``Labelling`` says what the labels are: its presence
label, the label rules, and the key families they write (``gpu-labeller explain``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from labeller.model.config import Config
from labeller.model.inventory import BackendReport, PciGpu, VendorPart
from labeller.model.labels import KeyDoc, Labeler

# (host root, the GPUs on the PCI bus, config, simulation handle) -> (the vendor's part, its report).
# Never raises: a failure is the report.
Prober = Callable[[Path, tuple[PciGpu, ...], Config, Any], tuple[VendorPart | None, BackendReport]]


class Simulator(Protocol):
    """A vendor's simulator module (vendors/<vendor>/simulate.py), driven by vendors.simulate."""

    def build(self, section: Any, root: Path, base_dir: Path) -> Any:
        """Write the vendor's part of a simulated node (its profile ``section``) under ``root`` and
        return the probe's stand-in; ValueError naming the key on bad input."""

    def absent(self) -> Any:
        """The stand-in of a node without this vendor's GPUs."""


@dataclass(frozen=True)
class Discovery:
    pci_vendor_id: int
    pci_classes: tuple[int, ...]  # PCI base classes that are its GPUs (0x03 display, 0x12 accelerator)
    probe: Prober
    # Imports its simulator module when called: only a simulated node does, never a real one.
    simulator: Callable[[], Simulator]
    # (host root) -> a cheap stamp of what its probe would find, for a process that probes rarely:
    # read every second, a new value means "probe again". None: nothing cheap to read (the vendor's
    # driver events say when its devices change, through the health checks).
    changes: Callable[[Path], object] | None = None


@dataclass(frozen=True)
class Labelling:
    presence_label: str  # "nvidia.com/gpu.present"
    presence_upstream: str  # for people: who else writes the presence label
    enabled: Callable[[Config], bool]  # whether any of its label groups is on
    labelers: tuple[Labeler, ...]
    key_docs: tuple[KeyDoc, ...]  # every key family its labelers write, for people
