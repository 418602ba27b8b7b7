"""The contract a vendor package fulfils, split by role as NFD splits its sources.

1. ``discovery``: ``Discovery`` (PCI identity, probe, simulator) and ``Labelling`` (presence label,
   label rules, key docs, which label groups are on): what every command runs.
2. ``devices``: ``Devices`` (device groups, resource-name facts, and ``plugin_parts``, which loads
   ``plugin.PluginParts``: Allocate, health checks, CDI spec, for the device plugin alone).
3. ``mps``: ``Mps``, for a vendor whose GPUs MPS can share (optional).
4. ``dra``: ``Dra``, its devices as its Dynamic Resource Allocation driver names them (optional).
5. ``settings``: its keys of the config file (``labeller.model.configtable.Section``), declared in its package
   and read as ``config.section(<its settings class>)``.

A vendor is one package, ``vendors/<name>/``, whose ``__init__`` builds its ``Vendor`` from these;
adding one means that package plus one entry in ``vendors.VENDORS``. The model never imports a
vendor package: the commands hand it the registry (and config parsing its ``ResourceNames``, which
carries the vendors' config keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from labeller.model.config import Config, ResourceNames
from labeller.model.configtable import Section
from labeller.model.vendor.devices import Devices
from labeller.model.vendor.discovery import Discovery, Labelling
from labeller.model.vendor.dra import Dra
from labeller.model.vendor.mps import Mps


@dataclass(frozen=True)
class Vendor:
    name: str  # "nvidia": also the profile section and the backend report's name
    discovery: Discovery
    labelling: Labelling
    devices: Devices
    mps: Mps | None  # None: MPS cannot share its GPUs
    dra: Dra | None = None  # None: it has no DRA driver
    settings: Section = Section()  # its keys of the config file; none by default

    def offer_inputs(self, config: Config) -> object:
        """What its offer reads besides the probe (``Mps.offer_inputs``); None for a vendor without MPS."""
        return self.mps.offer_inputs(config) if self.mps is not None else None


def resource_names(vendors: Sequence[Vendor], short_names: Vendor) -> ResourceNames:
    """What config parsing must know of the vendors' resource names; a short name in the sharing
    config ("gpu") is one of ``short_names``'s."""
    mps = [v.mps for v in vendors if v.mps is not None]
    return ResourceNames(
        default_domain=short_names.devices.domain,
        own=tuple(v.devices.own_names for v in vendors),
        mps_shareable=tuple(m.shareable for m in mps),
        mps_shares=" or ".join(m.shares for m in mps),
        dra_vendors=tuple(v.name for v in vendors if v.dra is not None),
        settings=tuple(v.settings for v in vendors),
    )
