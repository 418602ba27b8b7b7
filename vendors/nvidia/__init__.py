"""NVIDIA GPUs: NVML probe (nvml), GFD's labels (labels), device groups by MIG strategy (devices),
MPS (mps), the devices its DRA driver publishes (dra); for the device plugin alone, Allocate
(allocate), XID and lost-GPU health (health) and the CDI spec (cdi); a simulated NVML (simulate)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labeller.model.vendor import Vendor
from labeller.model.vendor.devices import Devices
from labeller.model.vendor.discovery import Discovery, Labelling, Simulator
from labeller.model.vendor.dra import ConfigApi, DeviceMaker, Dra
from labeller.model.vendor.mps import Mps
from labeller.model.vendor.plugin import PluginParts
from vendors.nvidia import devices, dra, labels, mps, nvml, settings
from vendors.nvidia.settings import NvidiaSettings
from vendors.nvidia.facts import PCI_CLASSES, PCI_VENDOR_ID


def plugin_parts() -> PluginParts:
    """Allocate, health checks and the CDI spec: the device plugin's alone, so imported here, on its
    first call, and never on the dry run."""
    from vendors.nvidia import allocate, cdi, health

    return PluginParts(allocator=allocate.allocator, checker=health.checker, cdi_spec=cdi.spec)


def simulator() -> Simulator:
    """The stand-in of a simulated node: imported here, when a profile is replayed, never on a real node."""
    from vendors.nvidia import simulate

    return simulate



def dra_configs() -> ConfigApi:
    """Its opaque DRA config API: the DRA plugin's alone, so imported here, on its first call."""
    from vendors.nvidia import draconfig

    return draconfig.API


def dra_maker(host_root: Path, handles: Mapping[str, Any]) -> DeviceMaker:
    """What makes MIG devices at prepare (``labeller.dra.dynamicMig``): the DRA plugin's alone."""
    from vendors.nvidia import migmaker

    return migmaker.maker(host_root, handles)


VENDOR = Vendor(
    name="nvidia",
    discovery=Discovery(pci_vendor_id=PCI_VENDOR_ID, pci_classes=PCI_CLASSES, probe=nvml.probe, simulator=simulator),
    labelling=Labelling(
        presence_label="nvidia.com/gpu.present",
        presence_upstream="the NVIDIA GPU Operator (from NFD's feature.node.kubernetes.io/pci-10de.present)",
        enabled=lambda config: config.section(NvidiaSettings).labels,
        labelers=labels.LABELERS,
        key_docs=labels.KEY_DOCS,
    ),
    devices=Devices(
        groups=devices.groups,
        domain="nvidia.com",
        own_names=re.compile(r"nvidia\.com/(gpu|mig-(\d+c\.)?\d+g\.\d+gb(\.[a-z]+)*)"),
        memory_shared=devices.GPU,  # gpushare's aliyun.com/gpu-mem divides whole NVIDIA GPUs
        health_source="NVML: XID critical-error events, and a poll for GPUs that stop answering",
        plugin_parts=plugin_parts,
    ),
    mps=Mps(
        shareable=re.compile(r"nvidia\.com/(?!mig-).*", re.DOTALL),  # whole GPUs, under any name but a MIG profile's
        shares="whole NVIDIA GPUs (nvidia.com/gpu)",
        check=mps.check,
        offer_inputs=mps.offer_inputs,
    ),
    dra=Dra(driver=dra.DRIVER, upstream=dra.UPSTREAM, devices=dra.devices, attribute_docs=dra.ATTRIBUTE_DOCS,
            served_label="nvidia.com/gpu.dra", configs=dra_configs, taint_keys=dra.TAINT_KEYS,
            maker=dra_maker),
    settings=settings.SETTINGS,
)
