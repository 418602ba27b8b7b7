"""What this node offers, derived: the one derivation that the labels and the device plugin both read.

``derive(inventory, config, vendors)`` asks each vendor for its device groups (a base resource
name and the physical devices under it, e.g. ``nvidia.com/gpu`` with the whole GPUs, or
``nvidia.com/mig-1g.5gb`` with those MIG devices) and applies the sharing config to each. The
device plugin serves ``Offer.resources`` as they are; the label rules read the same objects for
``gpu.count``, ``gpu.replicas``, ``gpu.sharing-strategy``, ``-SHARED`` and ``mig-<profile>.*``.
Pure: no I/O.

Sharing (NVIDIA's config format, applied to any vendor's resource; one case per kind below):
- a resource listed under ``sharing.timeSlicing`` or ``sharing.mps`` with ``replicas: N`` offers
  each selected device as ``<id>::<n>`` for n in 0..N-1, under ``rename``, ``<name>.shared`` with
  ``renameByDefault``, or the name itself; replicas keep their physical device.
- ``devices`` selects which devices are replicated (NVIDIA's ``updateDeviceMapWithReplicas``):
  ``all``, the first ``count`` in the group's order (NVML index; KFD node order), or the listed
  indices, UUIDs or PCI addresses. The rest stay whole under the plain name. A selector that does
  not fit the node is a ``ConfigError`` naming the entry and the device.
- MPS replicas are advertised only while the vendor says its MPS control daemon serves exactly
  that resource (``Mps.check``, ``labeller.model.vendor.mps``); until then the resource is ``held``
  (``waiting``), and devices MPS cannot share (MIG) are held for good. Held resources are neither
  advertised nor labelled.
- ``sharing.memory`` (gpushare's model) offers the whole GPUs of the base a vendor shares so
  (``Devices.memory_shared``: NVIDIA's ``nvidia.com/gpu``) by their memory instead:
  ``aliyun.com/gpu-mem`` with one device ``<id>::<n>`` per unit (GiB or MiB, floored) of
  each GPU's memory, and ``aliyun.com/gpu-count`` with one device per GPU; nothing under
  ``nvidia.com/gpu``. A GPU that cannot be shared so (MIG enabled, memory unknown or under one unit)
  is held for good, with the reason. Which GPU a container gets is decided at bind by the scheduler
  extender (``ALIYUN_COM_GPU_MEM_IDX``: the GPU's position in ``aliyun.com/gpu-count``).

A vendor the config serves through DRA (``labeller.dra.vendors``) offers nothing here: each of its
groups is withheld with that reason, and its GPUs are the DRA plugin's (``labeller.model.resourceslices``).
``sharing.memory`` applies there too (``memory_shared_devices``): each GPU it would share publishes
``allowMultipleAllocations`` and a ``memory`` capacity claims consume in the config's unit, so the
scheduler itself places claims by memory (Kubernetes 1.34's consumable capacity).

Where GFD's labels contradict what NVIDIA's plugin advertises, gpu-labeller labels what is
advertised (docs/deviations.md). The cases, all decided by the groups NVIDIA's package returns:
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

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from labeller.model.config import Config, ConfigError, DeviceSelector, MemorySharing, SharedResource, Sharing
from labeller.model.gpushare import RESOURCE_COUNT, RESOURCE_MEM
from labeller.model.inventory import Inventory
from labeller.model.offer import (MAX_DEVICES_PER_RESOURCE, AdvertisedDevice, DeviceGroup, Held, Offer, PhysicalDevice,
                            Resource, replica_id)
from labeller.model.resourceslices import DraDevice, RequestPolicy
from labeller.model.vendor import Vendor

# (a resource with MPS replicas) -> why it cannot be served by MPS now and whether that may change, or None
MpsGate = Callable[[Resource], "tuple[str, bool] | None"]


def whole(base: str, vendor: str, devices: Iterable[PhysicalDevice]) -> Resource:
    return Resource(base, base, vendor, tuple(AdvertisedDevice(p.visible_id, p) for p in devices))


def select(group: DeviceGroup, entry: SharedResource) -> tuple[list[PhysicalDevice], list[PhysicalDevice]]:
    """(the devices ``entry`` replicates, the rest), both in the group's order."""
    chosen = _selected(group, entry.devices, entry.where)
    return ([p for i, p in enumerate(group.devices) if i in chosen],
            [p for i, p in enumerate(group.devices) if i not in chosen])


def _selected(group: DeviceGroup, selector: DeviceSelector, where: str) -> set[int]:
    """The positions in ``group.devices`` of the devices ``selector`` picks."""
    if selector.all:
        return set(range(len(group.devices)))
    if selector.count is not None:
        if selector.count > len(group.devices):
            raise ConfigError(f"{where}.devices: {selector.count} devices to share, but {group.base} has "
                              f"{len(group.devices)} on this node")
        return set(range(selector.count))
    by_name = {name: i for i, p in enumerate(group.devices) for name in (p.visible_id, p.health_key, *p.names)}
    unknown = [ref for ref in selector.refs if ref not in by_name]
    if unknown:
        raise ConfigError(f"{where}.devices: no device {unknown[0]} in {group.base} on this node "
                          f"({len(group.devices)} there: {', '.join(p.visible_id for p in group.devices[:4])}"
                          f"{', ...' if len(group.devices) > 4 else ''})")
    return {by_name[ref] for ref in selector.refs}


def too_many(name: str, count: int, how: str, fix: str) -> str:
    """The problem of a resource that would advertise ``count`` devices, or "" when the kubelet takes them."""
    if count <= MAX_DEVICES_PER_RESOURCE:
        return ""
    return (f"{name} would be advertised as {count} devices ({how}), more than the {MAX_DEVICES_PER_RESOURCE} the "
            f"kubelet takes for one resource; {fix}")


def replicated(group: DeviceGroup, devices: list[PhysicalDevice], entry: SharedResource, sharing: Sharing) -> Resource:
    """The replicas of ``devices`` as ``entry`` (the group's sharing entry) asks; ConfigError, before building them,
    when they are more than the kubelet takes."""
    replicas, name = entry.replicas, entry.advertised_name(sharing.rename_by_default)
    problem = too_many(name, len(devices) * replicas, f"{len(devices)} x {replicas} replicas",
                       f"lower replicas to {max(1, MAX_DEVICES_PER_RESOURCE // len(devices))} or less")
    if problem:
        raise ConfigError(f"{entry.where}: {problem}")
    advertised = tuple(AdvertisedDevice(replica_id(p.visible_id, n), p, n) for p in devices for n in range(replicas))
    return Resource(name, group.base, group.vendor, advertised, replicas, sharing.strategy)


def time_sliced(whole_part: list[Resource], shared: Resource) -> tuple[list[Resource], list[Held]]:
    return [*whole_part, shared], []


def mps_shared(whole_part: list[Resource], shared: Resource, check: MpsGate) -> tuple[list[Resource], list[Held]]:
    """MPS replicas only while the vendor's control daemon serves them; the whole part regardless."""
    blocked = check(shared)
    if blocked is None:
        return [*whole_part, shared], []
    reason, waiting = blocked
    return whole_part, [Held(shared, reason, waiting)]


def memory_problem(device: PhysicalDevice, memory: MemorySharing) -> str | None:
    """Why ``device`` cannot be offered by memory, or None."""
    if device.partition is not None or device.split:
        return "MIG is enabled (memory sharing offers whole GPUs only)"
    if device.memory_bytes < memory.unit_bytes:
        return f"its memory is unknown or less than one {memory.unit}"
    return None


def memory_units(device: PhysicalDevice, memory: MemorySharing) -> int:
    """How many units of ``aliyun.com/gpu-mem`` the device offers: its memory, floored."""
    return device.memory_bytes // memory.unit_bytes


def memory_shared(group: DeviceGroup, memory: MemorySharing) -> tuple[list[Resource], list[Held]]:
    """``aliyun.com/gpu-mem`` and ``aliyun.com/gpu-count`` over the group's whole GPUs; the others held."""
    problems = {p.health_key: problem for p in group.devices if (problem := memory_problem(p, memory)) is not None}
    held = []
    if problems:
        unusable = [p for p in group.devices if p.health_key in problems]
        reason = "; ".join(f"{p.visible_id}: {problems[p.health_key]}" for p in unusable)
        held.append(Held(whole(group.base, group.vendor, unusable), f"not shared by memory: {reason}", waiting=False))
    gpus = [p for p in group.devices if p.health_key not in problems]
    if not gpus:
        return [], held
    problem = too_many(RESOURCE_MEM, sum(memory_units(p, memory) for p in gpus),
                       f"one per {memory.unit} of {len(gpus)} GPUs",
                       "use unit: GiB" if memory.unit != "GiB" else "offer fewer GPUs by memory")
    if problem:
        raise ConfigError(f"sharing.memory.unit: {problem}")
    units = tuple(AdvertisedDevice(replica_id(p.visible_id, n), p, n) for p in gpus
                  for n in range(memory_units(p, memory)))
    per_gpu = min(memory_units(p, memory) for p in gpus)
    return [Resource(RESOURCE_MEM, group.base, group.vendor, units, per_gpu, "memory"),
            Resource(RESOURCE_COUNT, group.base, group.vendor, tuple(AdvertisedDevice(p.visible_id, p) for p in gpus),
                     1, "memory")], held


MEMORY = "memory"  # the capacity both vendors' DRA drivers publish a device's bytes of memory as


def memory_policy(memory_bytes: int, memory: MemorySharing) -> RequestPolicy:
    """How claims consume a GPU's ``memory`` capacity under ``sharing.memory``: whole units of the
    config's (a claim asking 1500Mi of a GiB node takes 2Gi), at most the GPU's memory floored to
    units (what ``aliyun.com/gpu-mem`` offers of it); a claim that asks for no memory takes all of
    that, so it holds the GPU alone, as on a node that does not share. No step where the GPU holds a
    single unit (the API wants ``min + step`` within the capacity)."""
    unit = memory.unit_bytes
    whole_units = memory_bytes // unit * unit
    return RequestPolicy(default=whole_units, min=unit, max=whole_units, step=unit if whole_units >= 2 * unit else None)


def memory_shared_devices(devices: Sequence[DraDevice], memory: MemorySharing) -> list[DraDevice]:
    """``sharing.memory`` in DRA: each whole GPU memory sharing would share (``memory_problem``) and
    whose driver publishes its ``memory`` allows multiple allocations, its memory consumed by
    ``memory_policy``; the others (MIG devices, a GPU of unknown memory) stay exclusive."""
    out = []
    for device in devices:
        capacity = device.capacity.get(MEMORY)
        if capacity is None or capacity.value < memory.unit_bytes or memory_problem(device.physical, memory):
            out.append(device)
            continue
        shared = dataclasses.replace(capacity, request_policy=memory_policy(capacity.value, memory))
        out.append(dataclasses.replace(device, capacity={**device.capacity, MEMORY: shared},
                                       allow_multiple_allocations=True))
    return out


def share(group: DeviceGroup, config: Config, mps: MpsGate, memory_base: str | None
          ) -> tuple[list[Resource], list[Held]]:
    """The resources ``group`` becomes under the sharing config, and those held back. ``memory_base``:
    the base its vendor lets ``sharing.memory`` share (``Devices.memory_shared``)."""
    memory = config.sharing.memory
    if memory is not None and group.base == memory_base:
        return memory_shared(group, memory)
    entry = config.sharing.entry(group.base)
    if entry is None:
        return [whole(group.base, group.vendor, group.devices)], []
    picked, rest = select(group, entry)
    whole_part = [whole(group.base, group.vendor, rest)] if rest else []
    shared = replicated(group, picked, entry, config.sharing)
    if config.sharing.strategy == "mps":
        return mps_shared(whole_part, shared, mps)
    return time_sliced(whole_part, shared)


def no_mps(vendor: Vendor) -> MpsGate:
    """The check of a vendor without MPS: its resources are held for good."""
    return lambda resource: (f"{resource.base} cannot be shared by MPS (the {vendor.name} vendor has no MPS)", False)


def mps_check(vendor: Vendor, inventory: Inventory) -> MpsGate:
    if vendor.mps is None:
        return no_mps(vendor)
    check = vendor.mps.check
    return lambda resource: check(inventory, resource)


def dra_reason(vendor: str, driver: str) -> str:
    return f"served through DRA ({driver} ResourceSlices): labeller.dra.vendors names {vendor}"


def derive(inventory: Inventory, config: Config, vendors: Iterable[Vendor]) -> Offer:
    """The node's offer, vendor by vendor in registry order; groups without devices are not advertised,
    nor those of a vendor the node serves through DRA (``labeller.dra.vendors``): withheld, one owner per GPU.

    Raises ConfigError when the sharing config names devices this node does not have."""
    resources: list[Resource] = []
    held: list[Held] = []
    withheld: dict[str, str] = {}
    for vendor in vendors:
        for group in vendor.devices.groups(inventory, config):
            if vendor.dra is not None and config.served_by_dra(vendor.name):
                withheld[group.base] = dra_reason(vendor.name, vendor.dra.driver)
                continue
            if group.withheld is not None:
                withheld[group.base] = group.withheld
            if not group.devices:
                continue
            offered, kept = share(group, config, mps_check(vendor, inventory), vendor.devices.memory_shared)
            resources.extend(offered)
            held.extend(kept)
    names = [r.name for r in resources] + [h.resource.name for h in held]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"sharing: {twice[0]} would be registered twice; rename one of the shared resources")
    return Offer(resources=tuple(resources), withheld=withheld, held=tuple(held))
