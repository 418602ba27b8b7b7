"""What this node offers: the one derivation that the labels and the device plugin both read.

``derive(inventory, config, vendors)`` asks each vendor for its device groups (a base resource
name and the physical devices under it, e.g. ``nvidia.com/gpu`` with the whole GPUs, or
``nvidia.com/mig-1g.5gb`` with those MIG devices) and applies the sharing config to each. The
device plugin serves ``Offer.resources`` as they are; the label rules read the same objects for
``gpu.count``, ``gpu.replicas``, ``gpu.sharing-strategy``, ``-SHARED`` and ``mig-<profile>.*``.
Pure: no I/O.

Sharing (NVIDIA's config format, applied to any vendor's resource):
- a resource listed under ``sharing.timeSlicing`` (or ``sharing.mps``) with ``replicas: N`` offers
  each device as ``<id>::<n>`` for n in 0..N-1, under ``<name>.shared`` with ``renameByDefault``;
  replicas keep their physical device.

Where GFD's labels contradict what NVIDIA's plugin advertises, gpu-labeller labels what is
advertised (README, "Deviations"). The cases, all decided by the groups NVIDIA's package returns:
- ``migStrategy: none`` advertises MIG-enabled GPUs whole, so they are shared as configured and
  counted; GFD labels them ``replicas=0`` and ``sharing-strategy=none``.
- ``migStrategy: mixed``: ``gpu.count`` counts the whole GPUs advertised as ``nvidia.com/gpu``;
  GFD counts the MIG-enabled GPUs too.
- several NVIDIA models on one node: ``gpu.count`` counts every GPU ``nvidia.com/gpu`` advertises;
  GFD counts only the model it names.
- ``migStrategy: single`` on a node that is not uniformly MIG-enabled with one profile offers
  nothing under ``nvidia.com/gpu`` (the group is withheld, and the labels say ``-MIG-INVALID``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from labeller.config import Config, SharingStrategy

if TYPE_CHECKING:
    from labeller.inventory import Inventory
    from labeller.vendor import Vendor

REPLICA_SEPARATOR = "::"


@dataclass(frozen=True, kw_only=True)
class PhysicalDevice:
    """A GPU, a MIG device or a GPU partition: what a container actually gets. Vendors subclass it
    with what their allocation and health checks need.

    ``health_key`` names the unit health checks track; ``gpu`` names the physical GPU it is part of
    (its PCI address), and ``fabric_peers`` lists the ``gpu`` of each GPU it is joined to by
    NVLink or XGMI, once per link.
    """

    vendor: str
    health_key: str  # NVIDIA: GPU or MIG UUID; AMD: "kfd:<node>"
    visible_id: str  # what the container is told: a UUID, an index ("0", "1:0"), a PCI address
    gpu: str
    numa_node: int | None = None
    fabric_peers: tuple[str, ...] = ()
    partition: str | None = None  # a partition's profile (a MIG profile, an AMD compute mode); None: whole


@dataclass(frozen=True)
class DeviceGroup:
    """One base resource a vendor offers, before sharing: its devices, or why it offers none."""

    base: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "amd.com/gpu": also the label prefix
    vendor: str
    devices: tuple[PhysicalDevice, ...]
    withheld: str | None = None  # why nothing is offered under ``base`` although GPUs are there


@dataclass(frozen=True)
class AdvertisedDevice:
    id: str  # the ID the kubelet sees: plain, or "<id>::<n>" for a replica
    physical: PhysicalDevice
    replica: int | None = None


@dataclass(frozen=True)
class Resource:
    """One resource the device plugin registers, with every device it advertises."""

    name: str  # what is registered: "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"
    base: str  # the resource before sharing renamed it; the label prefix
    vendor: str
    devices: tuple[AdvertisedDevice, ...]
    replicas: int = 1  # 1: not shared
    strategy: SharingStrategy = "none"  # how replicas share a device; "none" when not shared

    @property
    def shared(self) -> bool:
        return self.replicas > 1

    @property
    def renamed(self) -> bool:
        return self.name != self.base

    @property
    def socket_name(self) -> str:
        """``nvidia-gpu.sock``, ``nvidia-mig-1g.10gb.sock``, ``amd-gpu.shared.sock``."""
        domain, _, name = self.name.partition("/")
        return f"{domain.split('.')[0]}-{name}.sock"

    @cached_property
    def physical_devices(self) -> tuple[PhysicalDevice, ...]:
        """The distinct physical devices behind the advertised ones, in order."""
        return tuple({d.physical.health_key: d.physical for d in self.devices}.values())

    def device(self, device_id: str) -> AdvertisedDevice | None:
        return self._by_id.get(device_id)

    @cached_property
    def _by_id(self) -> dict[str, AdvertisedDevice]:
        return {d.id: d for d in self.devices}


@dataclass(frozen=True)
class Offer:
    """Everything the node offers: the resources to advertise, and the groups withheld (and why)."""

    resources: tuple[Resource, ...] = ()
    withheld: dict[str, str] = field(default_factory=dict)  # base -> reason

    def resource(self, base: str) -> Resource | None:
        """The resource offered under ``base`` (whatever sharing renamed it to), or None."""
        return next((r for r in self.resources if r.base == base), None)

    def of_vendor(self, vendor: str) -> tuple[Resource, ...]:
        return tuple(r for r in self.resources if r.vendor == vendor)


def replica_id(device_id: str, replica: int) -> str:
    return f"{device_id}{REPLICA_SEPARATOR}{replica}"


def share(group: DeviceGroup, config: Config) -> Resource:
    """The resource ``group`` becomes under the sharing config."""
    sharing = config.sharing
    replicas = sharing.replicas_for(group.base)
    if replicas > 1:
        devices = tuple(AdvertisedDevice(replica_id(p.visible_id, n), p, n) for p in group.devices for n in range(replicas))
        return Resource(sharing.advertised_name(group.base), group.base, group.vendor, devices, replicas,
                        sharing.strategy)
    return Resource(group.base, group.base, group.vendor, tuple(AdvertisedDevice(p.visible_id, p) for p in group.devices))


def derive(inventory: Inventory, config: Config, vendors: Iterable[Vendor]) -> Offer:
    """The node's offer, vendor by vendor in registry order; groups without devices are not advertised."""
    groups: list[DeviceGroup] = [group for vendor in vendors for group in vendor.device_groups(inventory, config)]
    return Offer(
        resources=tuple(share(g, config) for g in groups if g.devices),
        withheld={g.base: g.withheld for g in groups if g.withheld is not None},
    )

