"""AMD GPUs: sysfs probe (probe: KFD topology, DRM cards, amdgpu module; ids: family and names),
AMD's labeller's labels (labels), one device per KFD compute node (devices), the devices its DRA
driver publishes (dra); for the device plugin alone, Allocate (allocate), KFD health (health) and
the CDI spec (cdi); a simulated sysfs tree (simulate)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labeller.model.config import Config
from labeller.model.inventory import BackendReport, PciGpu
from labeller.model.vendor import Vendor
from labeller.model.vendor.devices import Devices
from labeller.model.vendor.discovery import Discovery, Labelling, Simulator
from labeller.model.vendor.dra import ConfigApi, DeviceMaker, Dra
from labeller.model.vendor.plugin import PluginParts
from vendors.amd import devices, dra, generation, labels, probe, settings
from vendors.amd.settings import any_labels
from vendors.amd.facts import PCI_CLASSES, PCI_VENDOR_ID
from vendors.amd.model import AmdInventory


def _probe(host_root: Path, pci_gpus: tuple[PciGpu, ...], config: Config, handle: Any
           ) -> tuple[AmdInventory | None, BackendReport]:
    # A simulated node hands in its own enricher (one that finds nothing), never the host's GPUs.
    return probe.probe(host_root, pci_gpus, config, handle if handle is not None else probe.pyamdgpuinfo_enricher)


def plugin_parts() -> PluginParts:
    """Allocate, health checks and the CDI spec: the device plugin's alone, so imported here, on its
    first call, and never on the dry run."""
    from vendors.amd import allocate, cdi, health

    return PluginParts(allocator=allocate.allocator, checker=health.checker, cdi_spec=cdi.spec)


def simulator() -> Simulator:
    """The stand-in of a simulated node: imported here, when a profile is replayed, never on a real node."""
    from vendors.amd import simulate

    return simulate



def dra_configs() -> ConfigApi:
    """Its opaque DRA config API: the DRA plugin's alone, so imported here, on its first call."""
    from vendors.amd import draconfig

    return draconfig.API


def dra_maker(host_root: Path, handles: Mapping[str, Any]) -> DeviceMaker:
    """What switches compute partition modes at prepare (``labeller.dra.dynamicMig``): the DRA plugin's alone."""
    from vendors.amd import partitionmaker

    return partitionmaker.maker(host_root, handles)


VENDOR = Vendor(
    name="amd",
    discovery=Discovery(pci_vendor_id=PCI_VENDOR_ID, pci_classes=PCI_CLASSES, probe=_probe, simulator=simulator,
                        changes=generation.topology_generation),
    labelling=Labelling(
        presence_label="amd.com/gpu.present",  # ours: AMD's labeller has no presence label to select on
        presence_upstream="none: gpu-labeller's own key (AMD's labeller has no presence label)",
        enabled=any_labels,
        labelers=labels.LABELERS,
        key_docs=labels.KEY_DOCS,
    ),
    devices=Devices(
        groups=devices.groups,
        domain="amd.com",
        own_names=re.compile(r"amd\.com/(gpu|[a-z]px_nps\d+)"),
        memory_shared=None,
        health_source="KFD topology: a compute node whose topology node disappears",
        plugin_parts=plugin_parts,
    ),
    mps=None,
    dra=Dra(driver=dra.DRIVER, upstream=dra.UPSTREAM, devices=dra.devices, attribute_docs=dra.ATTRIBUTE_DOCS,
            served_label="amd.com/gpu.dra", configs=dra_configs, taint_keys=dra.TAINT_KEYS,
            maker=dra_maker),
    settings=settings.SETTINGS,
)
