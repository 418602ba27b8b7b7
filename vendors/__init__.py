"""GPU vendors, one package each, registered here as NFD registers its sources; and the host
facts they share (pci: the PCI scan; sysfs: bounded reads; dmi; plausible: physical bounds).

A vendor package builds a ``labeller.model.vendor.Vendor``; adding a vendor is adding its package and
one entry below. Order matters only for output order (NVIDIA's resources first).
"""

from __future__ import annotations

from labeller.model.config import ResourceNames
from labeller.model.vendor import Vendor, resource_names
from vendors.amd import VENDOR as AMD
from vendors.nvidia import VENDOR as NVIDIA

VENDORS: tuple[Vendor, ...] = (NVIDIA, AMD)
# What config parsing must know of their resource names. The config is NVIDIA's device-plugin
# format, so a short name there ("gpu") is NVIDIA's.
RESOURCE_NAMES: ResourceNames = resource_names(VENDORS, short_names=NVIDIA)
