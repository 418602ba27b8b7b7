"""GPU vendors, one package each, registered here as NFD registers its sources; and the host
facts they share (pci: the PCI scan; sysfs: bounded reads; dmi; plausible: physical bounds).

A vendor package builds a ``labeller.vendor.Vendor``; adding a vendor is adding its package and
one entry below. Order matters only for output order (NVIDIA's resources first).
"""

from __future__ import annotations

from labeller.vendor import Vendor
from vendors.amd import VENDOR as AMD
from vendors.nvidia import VENDOR as NVIDIA

VENDORS: tuple[Vendor, ...] = (NVIDIA, AMD)
