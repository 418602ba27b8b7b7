"""What a node publishes through Dynamic Resource Allocation: its devices, as ``resource.k8s.io/v1``
ResourceSlices.

A vendor's DRA role (``labeller.model.vendor.dra``) turns the inventory into ``DraDevice`` objects: a
name, typed attributes and capacities, each with where its value came from, and the physical
device (``labeller.model.offer.PhysicalDevice``) it stands for, the same object the device plugin serves.
``resource_slices`` lays them out as the API wants them: one pool per driver, named after the node,
split over slices of at most 128 devices. A device that draws on shared counters (a MIG device made
at prepare, KEP-4815's partitionable devices: ``DraDevice.consumes``) goes into the slice of its
counter set, one slice per set with the set itself (``sharedCounters``), as Kubernetes 1.34 wants
them: a device may only name counters of its own slice. Pure: no I/O, no client.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from labeller.model.inventory import Inventory
from labeller.model.offer import PhysicalDevice

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128  # the API rejects a slice with more
# Attributes every driver may publish, defined by Kubernetes itself
# (k8s.io/dynamic-resource-allocation/deviceattribute).
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


class Version(str):
    """An attribute value of the API's version type: a semantic version ("550.54.15", "9.0.0")."""

    def __new__(cls, text: str) -> Self:
        if not _SEMVER.fullmatch(text):
            raise ValueError(f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH)")
        return super().__new__(cls, text)


AttributeValue = str | int | bool | Version


@dataclass(frozen=True)
class Attribute:
    """One device attribute: its value (a ``Version`` is published as a version, any other ``str`` as
    a string), and where it came from, as a label's provenance (``labeller.model.labels.Provenance``)."""

    value: AttributeValue
    backend: str  # "nvml", "sysfs", "pci", "config"
    source: str  # the call or file and what it said
    rule: str = ""  # how that became the value

    def document(self) -> dict[str, Any]:
        """The API's DeviceAttribute: exactly one of string, int, bool, version."""
        if isinstance(self.value, bool):
            return {"bool": self.value}
        if isinstance(self.value, int):
            return {"int": self.value}
        if isinstance(self.value, Version):
            return {"version": str(self.value)}
        return {"string": self.value}


@dataclass(frozen=True)
class RequestPolicy:
    """How claims consume a capacity of a device that allows multiple allocations (Kubernetes 1.34's
    ``DeviceCapacity.requestPolicy``, feature gate ``DRAConsumableCapacity``), in its ``validRange``
    form: a request that asks none consumes ``default``; one that asks less than ``min`` consumes
    ``min``, one between is rounded up to ``min + n * step``, one above ``max`` does not fit the device.
    The API's rules (``pkg/apis/resource/validation``) hold by construction: ``min <= default <= max
    <= the capacity``, ``min + step <= the capacity``, ``default`` and ``max`` are ``min`` plus whole steps."""

    default: int
    min: int
    max: int | None = None
    step: int | None = None

    def document(self) -> dict[str, Any]:
        valid_range = {"min": quantity(self.min)}
        if self.max is not None:
            valid_range["max"] = quantity(self.max)
        if self.step is not None:
            valid_range["step"] = quantity(self.step)
        return {"default": quantity(self.default), "validRange": valid_range}


@dataclass(frozen=True)
class Capacity:
    """One device capacity: a count or a number of bytes, with where it came from; with a
    ``request_policy``, consumed by each claim that shares the device (``DraDevice.allow_multiple_allocations``)."""

    value: int
    backend: str
    source: str
    rule: str = ""
    request_policy: RequestPolicy | None = None

    def document(self) -> dict[str, Any]:
        if self.request_policy is None:
            return {"value": quantity(self.value)}
        return {"value": quantity(self.value), "requestPolicy": self.request_policy.document()}


# What Kubernetes 1.34 accepts as a DeviceTaint's effect (DRADeviceTaints, alpha); 1.35 adds None.
TAINT_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class DeviceTaint:
    """A taint of a published device (``Device.taints``): ``key`` a qualified name in the driver's
    domain, ``value`` a label value (may be empty), ``effect`` one of ``TAINT_EFFECTS``. The API server
    stamps ``timeAdded`` when a taint comes without one; the publisher keeps the stamp of a taint it
    published before."""

    key: str
    effect: str
    value: str = ""

    def document(self) -> dict[str, Any]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class CounterSet:
    """Counters that devices draw on (a ResourceSlice's ``sharedCounters`` entry): a GPU's memory
    slices, compute slices and engines, which its partitions use up as they are allocated. ``name``
    is a DNS label unique in the pool, as is each counter's."""

    name: str
    counters: Mapping[str, Capacity]

    def document(self) -> dict[str, Any]:
        return {"name": self.name,
                "counters": {key: self.counters[key].document() for key in sorted(self.counters)}}


@dataclass(frozen=True)
class CounterUse:
    """What allocating a device takes of one counter set (a Device's ``consumesCounters`` entry)."""

    counter_set: CounterSet
    counters: Mapping[str, int]

    def document(self) -> dict[str, Any]:
        return {"counterSet": self.counter_set.name,
                "counters": {key: {"value": quantity(self.counters[key])} for key in sorted(self.counters)}}


@dataclass(frozen=True)
class DraDevice:
    """One device of a ResourceSlice: a whole GPU, a MIG device or a GPU partition.

    ``name`` is the vendor's DRA driver's name for it (``gpu-0``, ``gpu-1-128``); ``attributes`` and
    ``capacity`` are keyed by their name as published (short names belong to the driver's domain,
    qualified ones such as ``resource.kubernetes.io/pciBusID`` are Kubernetes' own). ``physical`` is
    the device plugin's view of the same unit: what preparing a claim gives the container, and whose
    ``health_key`` the health checks report. ``allow_multiple_allocations``: several claims may be
    allocated the device at once, each consuming part of its capacities (``Capacity.request_policy``):
    Kubernetes 1.34's consumable capacity, ``sharing.memory`` in DRA. ``taints`` say why the device
    should not be used (the DRA plugin's health taints, ``labeller.apps.draplugin.taints``).

    A partition made at prepare (a MIG device of ``labeller.dra.dynamicMig``) ``consumes`` counters
    of its GPU, and ``make`` says what preparing it makes first (the vendor's ``DeviceMaker`` reads
    it: the GPU, the profile and the placement; JSON-able); its ``physical`` stands for the partition
    to be, with the GPU's health key, until the maker answers the one made. ``exclusive`` is
    (group, variant) for devices that cannot be held at once in different variants (an AMD GPU's
    partitions, all of one compute partition mode): the plugin refuses a claim whose device's
    variant differs from one another claim holds in the group."""

    name: str
    physical: PhysicalDevice
    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    capacity: Mapping[str, Capacity] = field(default_factory=dict)
    allow_multiple_allocations: bool = False
    taints: tuple[DeviceTaint, ...] = ()
    consumes: tuple[CounterUse, ...] = ()
    make: Mapping[str, Any] | None = None
    exclusive: tuple[str, str] | None = None

    @property
    def health_key(self) -> str:
        return self.physical.health_key

    def document(self) -> dict[str, Any]:
        """The API's Device: attributes and capacities in name order, the counters it draws on, whether
        it may be shared, its taints."""
        out: dict[str, Any] = {"name": self.name}
        if self.attributes:
            out["attributes"] = {key: self.attributes[key].document() for key in sorted(self.attributes)}
        if self.capacity:
            out["capacity"] = {key: self.capacity[key].document() for key in sorted(self.capacity)}
        if self.consumes:
            out["consumesCounters"] = [use.document() for use in self.consumes]
        if self.allow_multiple_allocations:
            out["allowMultipleAllocations"] = True
        if self.taints:
            out["taints"] = [taint.document() for taint in self.taints]
        return out


def quantity(value: int) -> str:
    """``value`` as Kubernetes writes a binary-SI quantity in canonical form: the largest power of
    1024 that divides it (85520809984 -> "81559Mi", 14 -> "14", 0 -> "0")."""
    if value < 0:
        raise ValueError(f"a capacity cannot be negative, got {value}")
    exponent = 0
    while value and value % 1024 == 0 and exponent < len(_BINARY_SUFFIXES) - 1:
        value //= 1024
        exponent += 1
    return f"{value}{_BINARY_SUFFIXES[exponent]}"


def semver(version: str, parts: int = 3) -> Version | None:
    """A dotted version as a semantic version: missing parts are 0 ("550.90" -> "550.90.0", as
    NVIDIA's driver parses it), parts beyond ``parts`` dropped ("6.8.5.60100" -> "6.8.5", as AMD's
    driver trims it); None when it is not numbers and dots."""
    numbers = version.strip().split(".")
    if not version.strip() or not all(n.isdigit() for n in numbers):
        return None
    numbers = [str(int(n)) for n in numbers[:parts]]
    return Version(".".join(numbers + ["0"] * (parts - len(numbers))))


def pcie_root(inventory: Inventory, bdf: str) -> dict[str, Attribute]:
    """Kubernetes' ``resource.kubernetes.io/pcieRoot`` of the PCI device ``bdf``, as both vendors'
    drivers publish it for a GPU and for each of its MIG devices or partitions; none where the PCI
    scan found no root complex for it (``PciGpu.pcie_root``)."""
    pci = next((gpu for gpu in inventory.pci_gpus if gpu.bdf == bdf), None)
    if pci is None or pci.pcie_root is None:
        return {}
    return {PCIE_ROOT: Attribute(pci.pcie_root, "sysfs", f"/sys/bus/pci/devices/{bdf} -> "
                                 f"/sys/devices/{pci.pcie_root}/.../{bdf}",
                                 "the first directory of the device's path under /sys/devices, as "
                                 "k8s.io/dynamic-resource-allocation/deviceattribute reads it")}


def slice_name(node_name: str, driver: str, index: int) -> str:
    """``<node>-<driver>-<index>``, a valid DNS subdomain name (dots in the driver become dashes)."""
    driver_part = _NOT_DNS.sub("-", driver.lower()).strip("-")
    return f"{node_name}-{driver_part}-{index}"


def _groups(devices: Sequence[DraDevice]) -> list[tuple[list[CounterSet], list[DraDevice]]]:
    """The devices as slices hold them: those that draw on no counters first, in chunks of at most
    128, then each counter set with the devices that draw on it (in the order they come). ValueError
    when a counter set has more devices than one slice holds."""
    plain = [d for d in devices if not d.consumes]
    groups: list[tuple[list[CounterSet], list[DraDevice]]] = [
        ([], plain[i:i + MAX_DEVICES_PER_SLICE]) for i in range(0, len(plain), MAX_DEVICES_PER_SLICE)]
    by_sets: dict[tuple[str, ...], tuple[list[CounterSet], list[DraDevice]]] = {}
    for device in devices:
        if device.consumes:
            sets = {use.counter_set.name: use.counter_set for use in device.consumes}
            key = tuple(sorted(sets))
            if key not in by_sets:
                by_sets[key] = ([sets[name] for name in key], [])
                groups.append(by_sets[key])
            by_sets[key][1].append(device)
    for counter_sets, members in by_sets.values():
        if len(members) > MAX_DEVICES_PER_SLICE:
            names = ", ".join(c.name for c in counter_sets)
            raise ValueError(f"{len(members)} devices draw on counter set(s) {names}; one slice holds at most "
                             f"{MAX_DEVICES_PER_SLICE}")
    return groups


def resource_slices(node_name: str, devices_by_driver: Mapping[str, Sequence[DraDevice]], generation: int = 1
                    ) -> list[dict[str, Any]]:
    """The ResourceSlice objects of one node, JSON-ready: per driver one pool named after the node,
    its devices in the given order split over as many slices as the 128-device limit needs (each
    slice says how many the pool has), then one slice per counter set with the devices that draw on
    it; deterministic names. A driver without devices publishes no slice."""
    slices: list[dict[str, Any]] = []
    for driver in sorted(devices_by_driver):
        groups = _groups(devices_by_driver[driver])
        for index, (sets, chunk) in enumerate(groups):
            spec: dict[str, Any] = {
                "driver": driver,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(groups)},
            }
            if sets:
                spec["sharedCounters"] = [counter_set.document() for counter_set in sets]
            spec["devices"] = [device.document() for device in chunk]
            slices.append({
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {"name": slice_name(node_name, driver, index)},
                "spec": spec,
            })
    return slices


def unshared(devices: Sequence[DraDevice]) -> list[DraDevice]:
    """The devices as each is allocated to one claim at a time: without ``allow_multiple_allocations``
    and request policies (what an API server without ``DRAConsumableCapacity`` keeps of them)."""
    return [dataclasses.replace(d, allow_multiple_allocations=False, capacity={
        key: dataclasses.replace(c, request_policy=None) for key, c in d.capacity.items()})
        if d.allow_multiple_allocations else d for d in devices]


def untainted(devices: Sequence[DraDevice]) -> list[DraDevice]:
    """The devices without taints (what is published where the API server drops ``Device.taints``,
    ``DRADeviceTaints`` off): an unhealthy device leaves the slice, as it leaves the device plugin's list."""
    return [d for d in devices if not d.taints]


def unpartitioned(devices: Sequence[DraDevice]) -> list[DraDevice]:
    """The devices that draw on no counters and are not made at prepare (what is published where the
    API server drops ``sharedCounters`` and ``consumesCounters``, ``DRAPartitionableDevices`` off: a
    partition published without the counters that keep it apart from its siblings would be allocated
    beside them). The vendors publish the partitions that exist instead (``DraState.counters``)."""
    return [d for d in devices if not d.consumes and d.make is None]
