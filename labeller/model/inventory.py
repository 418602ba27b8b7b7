"""What discovery found on a node: the bottom of the model, which imports nothing of the project.

Plain, immutable data and no I/O. The PCI scan (``vendors.pci``) fills ``pci_gpus``; each vendor
package adds its own part (``vendors/<vendor>/model.py``, a ``VendorPart``), found again with
``inventory.part(NvidiaInventory)``. Field units are in the names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeVar

from labeller.base.errors import InputError


@dataclass(frozen=True)
class PciGpu:
    """A display/3D controller seen on the PCI bus, whether or not a driver is bound."""

    bdf: str  # "0000:18:00.0", lower-case, 4-digit domain
    vendor_id: int
    device_id: int
    class_code: int  # 24-bit, e.g. 0x030200 (3D controller), 0x030000 (VGA)
    revision: int | None = None
    numa_node: int | None = None  # None when the kernel says -1 or the file is unreadable
    driver: str | None = None  # bound driver name ("nvidia", "amdgpu"), None if unbound
    # The PCI root complex above it, "pci0000:40": where its /sys/devices path starts. None where
    # sys/bus/pci/devices/<bdf> is not the kernel's link into /sys/devices.
    pcie_root: str | None = None


BackendStatus = Literal["ok", "absent", "unavailable", "error"]


class ProbeError(InputError):
    """The probe as a whole cannot be trusted (no readable ``/sys/bus/pci/devices`` under the host
    root, an unreadable tree): nothing may be added or removed on its account. The message is one
    line naming the path and the likely cause."""


@dataclass(frozen=True)
class BackendReport:
    """What one backend saw, and why it found nothing when it did not.

    ``absent``: no hardware for this backend. ``unavailable``: hardware is there but the
    library/driver is not (labels fall back to PCI presence). ``error``: the probe failed or was
    partial; consumers must not treat the result as the whole truth.
    """

    backend: str  # "pci", "nvidia", "amd", "dmi"
    status: BackendStatus
    detail: str = ""
    problems: tuple[str, ...] = ()  # per-device problems that did not stop the backend


@dataclass(frozen=True)
class VendorPart:
    """A vendor's part of the inventory; each vendor package subclasses it with its own fields."""

    vendor: ClassVar[str] = ""


Part = TypeVar("Part", bound=VendorPart)


@dataclass(frozen=True)
class Inventory:
    pci_gpus: tuple[PciGpu, ...] = ()
    parts: tuple[VendorPart, ...] = ()  # one per vendor whose backend described GPUs
    machine: str | None = None  # raw DMI product name
    reports: tuple[BackendReport, ...] = field(default=())

    @property
    def partial(self) -> bool:
        """True when the labels may be incomplete: a backend failed, skipped a device, or could not
        describe GPUs that are on the PCI bus (e.g. NVML missing during a driver upgrade). Callers
        that write labels must not remove any on a partial inventory."""
        return any(r.status in ("error", "unavailable") or r.problems for r in self.reports)

    def part(self, kind: type[Part]) -> Part | None:
        """The vendor part of type ``kind``, or None when that vendor described no GPU."""
        return next((p for p in self.parts if isinstance(p, kind)), None)

    def pci_gpus_of(self, vendor_id: int) -> tuple[PciGpu, ...]:
        return tuple(g for g in self.pci_gpus if g.vendor_id == vendor_id)
