"""What this node offers: the resources the device plugin serves and the labels count.

Plain, immutable data and no I/O. A vendor's device groups (``labeller.model.vendor.devices``) name its
physical devices under base resources; ``labeller.model.sharing.derive`` applies the sharing config to
them and returns the ``Offer``. The label rules and the device plugin read the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from labeller.model.config import SharingStrategy

REPLICA_SEPARATOR = "::"
# The most devices one resource may advertise. The kubelet takes a resource's devices in one
# ListAndWatch message of at most 4 MiB (gRPC's default); a device with the longest ID there is (a
# MIG UUID of the old form with a replica suffix) and a NUMA node encodes in 77 bytes, so this many
# take 2.4 MiB. More, and the kubelet drops the message while the plugin believes it registered.
MAX_DEVICES_PER_RESOURCE = 32768


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
    # Every name a config's ``devices`` list may give it (UUID, index "0" or "1:0", PCI address).
    names: tuple[str, ...] = ()
    memory_bytes: int = 0  # its memory, when the vendor knows it (memory sharing divides it); 0: unknown
    split: bool = False  # a whole device whose memory belongs to partitions it does not serve (MIG enabled)


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
class Held:
    """A resource the config asks for that is not advertised: why, and whether it waits for
    something that may come (an MPS control daemon getting ready) or can never be served."""

    resource: Resource
    reason: str
    waiting: bool


@dataclass(frozen=True)
class Offer:
    """Everything the node offers: the resources to advertise, the groups withheld (and why), and
    the resources held back."""

    resources: tuple[Resource, ...] = ()
    withheld: dict[str, str] = field(default_factory=dict)  # base -> reason
    held: tuple[Held, ...] = ()

    def resource(self, base: str) -> Resource | None:
        """The first resource offered under ``base`` (whatever sharing renamed it to), or None."""
        return next((r for r in self.resources if r.base == base), None)

    def of_base(self, base: str) -> tuple[Resource, ...]:
        """Every resource offered under ``base``: its whole devices and its replicas, when sharing
        a subset splits them."""
        return tuple(r for r in self.resources if r.base == base)

    def of_vendor(self, vendor: str) -> tuple[Resource, ...]:
        return tuple(r for r in self.resources if r.vendor == vendor)


def replica_id(device_id: str, replica: int) -> str:
    return f"{device_id}{REPLICA_SEPARATOR}{replica}"
