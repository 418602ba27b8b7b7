"""From inventory and offer to the node's label set: presence labels, then each vendor's rules.

Pure: no I/O. Vendors come in registry order (``vendors.VENDORS``), each with its own labelers,
which check their own label groups; a key produced twice with different values is reported as a
conflict by ``merge``, and labels Kubernetes would reject are dropped one by one.
"""

from __future__ import annotations

from collections.abc import Sequence

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.labels import Labeler, LabelSet, Labels, derived, merge, validated
from labeller.model.offer import Offer
from labeller.model.vendor import Vendor


def present(vendor: Vendor, inventory: Inventory) -> bool:
    """The vendor has a GPU on the PCI bus, or its backend described one (driver or not)."""
    part = next((p for p in inventory.parts if p.vendor == vendor.name), None)
    return bool(inventory.pci_gpus_of(vendor.discovery.pci_vendor_id)) or part is not None


def _presence_source(vendor: Vendor, inventory: Inventory) -> tuple[str, str, str]:
    gpus = inventory.pci_gpus_of(vendor.discovery.pci_vendor_id)
    rule = "true when the vendor has a GPU on the PCI bus or its backend described one"
    if not gpus:
        return vendor.name, f"the {vendor.name} backend described GPUs", rule
    listed = ", ".join(f"{g.bdf} [{g.vendor_id:04x}:{g.device_id:04x}] class {g.class_code >> 8:04x}" for g in gpus[:3])
    more = f" and {len(gpus) - 3} more" if len(gpus) > 3 else ""
    return "pci", f"/sys/bus/pci/devices: {listed}{more}", rule


def presence_labeler(vendors: Sequence[Vendor]) -> Labeler:
    """``<vendor presence label>=true`` for each vendor with a GPU whose label groups are on."""

    def presence_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
        return {v.labelling.presence_label: derived("true", *_presence_source(v, inventory))
                for v in vendors if v.labelling.enabled(config) and present(v, inventory)}

    return presence_labels


def dra_labeler(vendors: Sequence[Vendor]) -> Labeler:
    """``<vendor's DRA label>=true`` (``nvidia.com/gpu.dra``) for each vendor with a GPU here that the
    config serves through DRA, whose label groups are on: its GPUs are in ResourceSlices, not in
    the device plugin's extended resources."""

    def dra_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
        return {v.dra.served_label: derived("true", "config", f"labeller.dra.vendors = {list(config.dra_vendors)}",
                                            f"true where DRA ({v.dra.driver}) serves the {v.name} GPUs: the device "
                                            "plugin does not advertise them")
                for v in vendors if v.dra is not None and config.served_by_dra(v.name)
                and v.labelling.enabled(config) and present(v, inventory)}

    return dra_labels


def labelers(vendors: Sequence[Vendor], config: Config) -> list[Labeler]:
    """Presence and DRA first, then the labelers of each vendor whose label groups are on."""
    chosen = [presence_labeler(vendors), dra_labeler(vendors)]
    for vendor in vendors:
        if vendor.labelling.enabled(config):
            chosen.extend(vendor.labelling.labelers)
    return chosen


def node_labels(inventory: Inventory, config: Config, offer: Offer, vendors: Sequence[Vendor]) -> LabelSet:
    """Every label gpu-labeller wants on this node, with invalid ones dropped one by one."""
    return validated(merge(labelers(vendors, config), inventory, config, offer))
