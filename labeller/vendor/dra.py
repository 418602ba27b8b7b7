"""What a vendor publishes through Dynamic Resource Allocation (role 4, optional).

``devices`` turns the inventory into the ``DraDevice`` objects of the vendor's DRA driver
(``labeller.resourceslices``): the names, attributes and capacities the vendor's own DRA driver
publishes, so a DeviceClass or CEL selector written for theirs selects the same devices on ours.
A value the inventory does not hold is left out, never made up. ``attribute_docs`` says, per
attribute and capacity, what it means and which upstream driver defines it (``gpu-labeller explain``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from labeller.config import Config
from labeller.inventory import Inventory
from labeller.offer import Offer
from labeller.resourceslices import DraDevice

# (inventory, offer, config) -> the vendor's DRA devices, in a stable order. The offer is there for
# a vendor whose devices depend on what the device plugin serves; neither built-in vendor reads it.
DraDevices = Callable[[Inventory, Offer, Config], list[DraDevice]]


@dataclass(frozen=True)
class AttributeDoc:
    """One attribute or capacity family of a driver, for people. ``name`` as published; ``<i>``
    stands for any text (``memorySlice<i>``)."""

    name: str
    kind: str  # the API's attribute type ("string", "int", "bool", "version"), or "capacity"
    meaning: str  # what it holds and where its value comes from
    upstream: str  # which upstream driver publishes it, and how ours differs where it does
    # A name this driver published before and no longer does: the attribute it became, for claims
    # written against the old name (``explain`` says so; completion does not offer it).
    renamed_to: str | None = None


@dataclass(frozen=True)
class Dra:
    driver: str  # the DRA driver name: "gpu.nvidia.com"; also the attributes' domain
    upstream: str  # for people: the vendor's own DRA driver, "NVIDIA k8s-dra-driver-gpu"
    devices: DraDevices
    attribute_docs: tuple[AttributeDoc, ...]
    served_label: str  # "nvidia.com/gpu.dra": "true" on a node whose GPUs of this vendor DRA serves
