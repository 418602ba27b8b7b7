"""MIG devices made at prepare (``labeller.dra.dynamicMig``): a MIG-enabled GPU as KEP-4815's
partitionable device, as NVIDIA's DRA driver publishes it with its DynamicMIG feature.

Each such GPU publishes one counter set, ``gpu-<minor>-counter-set``, and one device per GPU
instance profile and placement NVML offers on it, ``gpu-<minor>-mig-<profile>-<profile id>-<start>``
(the name a MIG device of that profile at that placement has once made), each drawing on the set:

- ``memory-slice-<i>`` (1 each): the GPU's memory slices, which a placement covers: two devices
  whose placements overlap are never allocated together;
- ``compute-slices``: its compute (GPC) slices, ``memory`` (bytes), ``multiprocessors``,
  ``copy-engines``, ``decoders``, ``encoders``, ``jpeg-engines`` and ``ofa-engines``: what its GPU
  instance profile takes (nvmlDeviceGetGpuInstanceProfileInfo). NVIDIA's driver draws on the same
  counters but ``compute-slices``.

A counter's value is the most the GPU's placements can use of it together: the largest sum over
every set of placements that do not overlap, keep each profile within its instance count and the
GPU within its compute slices (NVIDIA's takes the largest profile's figure, the same wherever the
whole-GPU profile has every engine of the GPU). So whatever the scheduler allocates within the
counters, the GPU can make.

MIG devices someone else made (``mig-parted``, an admin's ``nvidia-smi mig -cgi``) are left alone and
published as without dynamicMig; the placements they cover, their profiles' instances and their
compute slices are not offered. A MIG device the DRA plugin made (``DraState.made``) is published as
the device it was made for. A GPU whose MIG devices cannot be placed (a placement NVML does not give,
a GPU instance of a profile it does not list) is published as without dynamicMig, and says why once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from labeller.model.resourceslices import Attribute, Capacity, CounterSet, CounterUse, DraDevice
from vendors.nvidia.devices import VENDOR, NvidiaDevice
from vendors.nvidia.facts import MIB, profile_label
from vendors.nvidia.model import MigDevice, MigProfile, NvidiaGpu
from labeller.base.log import get_logger

log = get_logger(__name__)

# Counter (as NVIDIA's driver names it from its capacity), capacity, MigProfile field.
_COUNTED = (("multiprocessors", "multiprocessors", "multiprocessors"),
            ("copy-engines", "copyEngines", "copy_engines"),
            ("decoders", "decoders", "decoders"),
            ("encoders", "encoders", "encoders"),
            ("jpeg-engines", "jpegEngines", "jpeg_engines"),
            ("ofa-engines", "ofaEngines", "ofa_engines"))
COMPUTE_SLICES = "compute-slices"
_said: set[tuple[str, str]] = set()  # (GPU UUID, reason) already logged: a probe repeats every interval


def memory_slice(index: int) -> str:
    return f"memory-slice-{index}"


def counter_set_name(gpu_name: str) -> str:
    return f"{gpu_name}-counter-set"


def takes(profile: MigProfile, start: int, size: int) -> dict[str, int]:
    """What a MIG device of ``profile`` at ``start`` takes of its GPU's counters."""
    out = {"memory": profile.memory_mib * MIB, COMPUTE_SLICES: profile.slices,
           **{counter: getattr(profile, field) for counter, _, field in _COUNTED}}
    out.update({memory_slice(i): 1 for i in range(start, start + size)})
    return out


@dataclass(frozen=True)
class _Taken:
    """What MIG devices someone else made hold of a GPU: memory slices, instances per profile id,
    compute slices."""

    slices: frozenset[int] = frozenset()
    instances: tuple[tuple[int, int], ...] = ()  # (profile id, GPU instances of it)
    compute: int = 0


_SUMMED = ("memory", COMPUTE_SLICES, *(counter for counter, _, _ in _COUNTED))  # the counters _vector gives


def _vector(profile: MigProfile) -> tuple[int, ...]:
    """What a MIG device of ``profile`` takes of each counter of ``_SUMMED``, in that order."""
    return (profile.memory_mib * MIB, profile.slices, *(getattr(profile, field) for _, _, field in _COUNTED))


@functools.lru_cache(maxsize=64)
def _most(profiles: tuple[MigProfile, ...], taken: _Taken) -> tuple[tuple[str, int], ...]:
    """Each counter's most, over every set of placements the GPU can hold together beside what is
    taken: no overlap, each profile within its instances, the GPU within its compute slices.

    Every subset of a set that fits fits too, so the search grows sets from placements that fit alone,
    each placement's memory slices a bit mask (an A100's 2,300 sets in a few milliseconds); a memory
    slice's most is 1 where a placement that fits alone covers it."""
    total_compute = max(p.slices for p in profiles)
    held = dict(taken.instances)
    alone = [(p, start, size) for p in profiles for start, size in p.placements
             if taken.slices.isdisjoint(range(start, start + size)) and held.get(p.id, 0) < p.instances
             and taken.compute + p.slices <= total_compute]
    if not alone:
        return ()
    free = [(sum(1 << i for i in range(start, start + size)), p.id, p.instances, p.slices, _vector(p))
            for p, start, size in alone]
    best = [0] * len(_SUMMED)

    def visit(first: int, used: int, counts: dict[int, int], sums: tuple[int, ...], compute: int) -> None:
        for k, value in enumerate(sums):
            if value > best[k]:
                best[k] = value
        for n in range(first, len(free)):
            cover, profile_id, instances, slices, more = free[n]
            if used & cover or counts.get(profile_id, 0) >= instances or compute + slices > total_compute:
                continue
            counts[profile_id] = counts.get(profile_id, 0) + 1
            visit(n + 1, used | cover, counts, tuple(a + b for a, b in zip(sums, more)), compute + slices)
            counts[profile_id] -= 1

    visit(0, 0, held, (0,) * len(_SUMMED), taken.compute)
    slices = {i for _, start, size in alone for i in range(start, start + size)}
    return tuple(sorted([*zip(_SUMMED, best), *((memory_slice(i), 1) for i in slices)]))


def _gpu_instances(migs: Iterable[MigDevice]) -> dict[int, MigDevice]:
    """One MIG device per GPU instance (a GPU instance split into compute instances has several)."""
    out: dict[int, MigDevice] = {}
    for mig in migs:
        out.setdefault(mig.gpu_instance_id if mig.gpu_instance_id is not None else -1 - mig.index, mig)
    return out


def _taken(gpu: NvidiaGpu, theirs: list[MigDevice]) -> _Taken | str:
    """What someone else's MIG devices hold of the GPU, or why that cannot be told."""
    by_id = {p.id: p for p in gpu.mig_profiles}
    slices: set[int] = set()
    instances: dict[int, int] = {}
    compute = 0
    for mig in _gpu_instances(theirs).values():
        profile = by_id.get(mig.gpu_instance_profile_id) if mig.gpu_instance_profile_id is not None else None
        if mig.memory_slices is None or profile is None:
            return f"MIG device {mig.uuid}: its GPU instance's profile or placement is not known"
        slices.update(mig.memory_slices)
        instances[profile.id] = instances.get(profile.id, 0) + 1
        compute += profile.slices
    return _Taken(frozenset(slices), tuple(sorted(instances.items())), compute)


def _why_not(gpu: NvidiaGpu) -> str | None:
    if gpu.vgpu_guest:
        return "a vGPU guest cannot make MIG devices"
    if not gpu.mig_profiles or not any(p.placements for p in gpu.mig_profiles):
        return "NVML lists no MIG profile placements on it"
    return None


def _say_once(gpu: NvidiaGpu, reason: str) -> None:
    if (gpu.uuid, reason) not in _said:
        _said.add((gpu.uuid, reason))
        log.warning("MIG devices are not made at prepare on this GPU; its MIG devices that exist are published",
                    vendor="nvidia", device=gpu.uuid, reason="dynamic-mig-unavailable", detail=reason)


@dataclass(frozen=True)
class Partitioned:
    """A GPU's devices under dynamicMig: the MIG devices someone else made (published as without
    it), and one device per profile and placement that is not theirs, drawing on the counter set."""

    theirs: tuple[MigDevice, ...]
    devices: tuple[DraDevice, ...]


def partitioned(gpu: NvidiaGpu, made: frozenset[str], gpu_name: str, static_name: Mapping[str, str],
                attributes: Mapping[str, Attribute]) -> Partitioned | None:
    """The GPU as counters and devices, or None (said once) where MIG devices cannot be made on it.
    ``static_name``: each MIG device's name by UUID as published without dynamicMig; ``attributes``:
    the GPU's own, which each of its MIG devices carries."""
    why = _why_not(gpu)
    theirs = [mig for mig in gpu.mig_devices if static_name[mig.uuid] not in made]
    taken = _taken(gpu, theirs) if why is None else why
    if isinstance(taken, str):
        _say_once(gpu, taken)
        return None
    counters = dict(_most(gpu.mig_profiles, taken))
    if not counters:  # every placement is someone else's
        return Partitioned(tuple(theirs), ())
    source = f"nvmlDeviceGetGpuInstanceProfileInfo and nvmlDeviceGetGpuInstancePossiblePlacements(GPU {gpu.index})"
    rule = ("the most that placements which fit on the GPU together use (no overlap, each profile within its "
            "instances, the GPU within its compute slices), beside the MIG devices someone else made")
    counter_set = CounterSet(counter_set_name(gpu_name),
                             {name: Capacity(value, "nvml", source, rule) for name, value in counters.items()})
    held = dict(taken.instances)
    devices = []
    for profile in gpu.mig_profiles:
        if held.get(profile.id, 0) >= profile.instances or taken.compute + profile.slices > max(
                p.slices for p in gpu.mig_profiles):
            continue
        for start, size in profile.placements:
            if taken.slices.isdisjoint(range(start, start + size)):
                devices.append(_device(gpu, profile, start, size, counter_set, gpu_name, attributes, source))
    return Partitioned(tuple(theirs), tuple(sorted(devices, key=lambda d: d.name)))


def _device(gpu: NvidiaGpu, profile: MigProfile, start: int, size: int, counter_set: CounterSet, gpu_name: str,
            gpu_attributes: Mapping[str, Attribute], source: str) -> DraDevice:
    name = f"{gpu_name}-mig-{profile_label(profile.name)}-{profile.id}-{start}"
    where = f"GPU instance profile {profile.id} ({profile.name}) of GPU {gpu.index}"
    attributes = {
        "type": Attribute("mig", "nvml", f"nvmlDeviceGetMigMode(GPU {gpu.index}): MIG enabled",
                          "a MIG device made at prepare (labeller.dra.dynamicMig)"),
        "parentUUID": Attribute(gpu.uuid, "nvml", f"nvmlDeviceGetUUID(GPU {gpu.index}) = {gpu.uuid!r}",
                                "the GPU the MIG device is made on"),
        "profile": Attribute(profile.name, "nvml", f"nvmlDeviceGetGpuInstanceProfileInfo: {where}",
                             "the profile name go-nvlib gives"),
        **gpu_attributes,
    }
    capacity = {cap: Capacity(getattr(profile, field), "nvml", f"nvmlDeviceGetGpuInstanceProfileInfo: {where}")
                for _, cap, field in _COUNTED}
    capacity["memory"] = Capacity(profile.memory_mib * MIB, "nvml",
                                  f"nvmlDeviceGetGpuInstanceProfileInfo: {where}: memorySizeMB = {profile.memory_mib}",
                                  "MiB * 2^20")
    physical = NvidiaDevice(vendor=VENDOR, health_key=gpu.uuid, visible_id=name, gpu=gpu.pci_bus_id,
                            numa_node=gpu.numa_node, partition=profile.name, nvml_gpu=gpu, names=(name,))
    plan = {"gpu": gpu.uuid, "profile": profile.name, "profileId": profile.id, "start": start, "size": size,
            "slices": profile.slices}
    return DraDevice(name, physical, attributes, capacity,
                     consumes=(CounterUse(counter_set, takes(profile, start, size)),), make=plan)
