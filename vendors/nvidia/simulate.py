"""A fake ``pynvml`` module that replays a profile's ``nvidia:`` section.

``build`` validates the section, writes the GPUs' PCI sysfs entries under the simulated root, and
returns a module with the subset of the pynvml API that gpu-labeller uses, with pynvml's own
semantics: error classes, codes and constants are the real pynvml ones, struct results are the
real ctypes structures (so ``PciInfo.busId`` reads back as pynvml gives it), and calls fail with
``NVMLError_Uninitialized`` outside nvmlInit/nvmlShutdown. Only ``libnvidia-ml`` is not needed.

Test hooks on the module: ``inject_xid(uuid, xid)`` queues an XID event for the GPU (or MIG
device) with that UUID on every event set registered for XID events; ``set_lost(uuid, lost)``
makes every call on that GPU raise ``NVMLError_GpuIsLost`` (False restores it) and, as the driver
does when a GPU falls off the bus, queues NVML's GPU-unavailable event for it; ``inject_mig_change(uuid)`` queues the
MIG configuration change event the driver sends when GPU or compute instances are created or
destroyed on a MIG-capable GPU. ``nvmlEventSetWait`` waits as the real one does: until an event
comes or its timeout passes, whatever else happens meanwhile.
"""

from __future__ import annotations

import re
import string
import threading
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml as real

from vendors.nvidia.facts import (
    COMPUTE_CLASS,
    GPU_INSTANCE_PROFILES,
    PCI_VENDOR_ID,
    WHOLE_GPU,
    compute_instance_profiles,
    gpu_instance_profiles,
    mig_memory_gb,
    mig_profile_name,
)
from vendors.nvidia.migtable import Engines, GpuInstanceProfile, MigModel, mig_model
from vendors.pci import normalise_bdf
from vendors.sim_pci import write_device, write_host_bridge
from labeller.base.log import get_logger

log = get_logger(__name__)

MAX_MIG_DEVICES = 7  # NVML's most MIG devices on a GPU, for a model the MIG table does not know
# GPU-instance profile ids are the real ones (vendors/nvidia/migtable.py), and on a model the table
# does not know, made up: the profile index plus this offset. Compute-instance profile ids are fake,
# offset from the indices too, so that a caller that mixes ids and indices up (go-nvlib matches
# ids, then names profiles by index) fails loudly there.
UNKNOWN_GI_PROFILE_ID_OFFSET = 100
CI_PROFILE_ID_OFFSET = 64

GPU_KEYS = ("name", "uuid", "memory_bytes", "compute_capability", "pci_bus_id", "pci_device_id", "minor_number",
            "numa_node", "pci_class", "mig_mode", "mig_devices", "nvlink_peers", "fabric", "vgpu", "error", "repeat")
MIG_KEYS = ("profile", "uuid", "memory_mib", "multiprocessors", "slices_gi", "slices_ci", "engines_copy",
            "engines_decoder", "engines_encoder", "engines_jpeg", "engines_ofa", "gpu_instance_id",
            "compute_instance_id", "placement_start", "placement_size", "repeat")
SECTION_KEYS = ("driver_version", "cuda_driver_version", "nvml_error", "gpus", "state_file")
_PROFILE_RE = re.compile(r"^(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.(?P<gb>\d+)gb(?P<suffix>\+me|\+me\.all|\+gfx|-me)?$")
SUPPORTED_EVENTS: int = (real.nvmlEventTypeSingleBitEccError | real.nvmlEventTypeDoubleBitEccError
                         | real.nvmlEventTypePState | real.nvmlEventTypeXidCriticalError | real.nvmlEventTypeClock
                         | real.nvmlEventTypeGpuUnavailableError)
MIG_CHANGE_EVENT: int = real.nvmlEventMigConfigChange  # supported by MIG-capable GPUs only


def _profile_index(table: dict[int, Any], wanted: Any) -> int | None:
    """The first NVML profile index whose entry in ``table`` is ``wanted`` (as NVML would report it)."""
    return next((index for index, value in sorted(table.items()) if value == wanted), None)


# --- the simulated hardware ----------------------------------------------------------------------

@dataclass
class FakeMig:
    uuid: str
    profile: str
    gi_profile: GpuInstanceProfile  # its GPU instance's, from the MIG table or made up from the entry
    gi_profile_index: int
    ci_profile_index: int
    compute_slices: int  # of its compute instance
    memory_mib: int
    attributes: dict[str, int]
    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int | None  # first memory slice of its GPU instance; None until placed
    placement_size: int | None  # memory slices its GPU instance takes; None until placed
    parent: FakeGpu | None = None


@dataclass
class FakeGpu:
    index: int
    name: str
    uuid: str
    memory_bytes: int
    compute_capability: tuple[int, int] | None
    bus_id: str  # sysfs form "0000:18:00.0"
    pci_device_id: int
    minor_number: int
    numa_node: int | None
    pci_class: int
    mig_mode: str
    mig_model: MigModel | None  # its MIG geometry, None for a model the MIG table does not know
    migs: list[FakeMig]
    nvlink_peers: list[str]
    fabric: tuple[bytes, int] | None
    vgpu: bool
    vgpu_host_driver: tuple[str, str] | None  # (version, branch) in the capability's record 0
    error_code: int | None  # every call on this GPU fails with this NVML error
    lost: bool = False
    # its GPU instances by id, those of the profile's MIG devices and those made through NVML; replaced
    # whole on every change (as ``migs`` is), so a reader on another thread sees one state or the next
    gis: dict[int, FakeGpuInstance] = field(default_factory=dict)


@dataclass(frozen=True)
class FakeGpuInstance:
    gpu: FakeGpu
    id: int
    profile: GpuInstanceProfile
    placement_start: int
    placement_size: int


@dataclass(frozen=True)
class FakeComputeInstance:
    gpu_instance: FakeGpuInstance
    id: int
    profile_index: int


@dataclass
class FakeEvent:
    """pynvml's c_nvmlEventData_t, field names included; eventData holds the XID."""

    device: FakeGpu
    eventType: int
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int


@dataclass
class FakeEventSet:
    registered: dict[int, int] = field(default_factory=dict)  # id(gpu) -> event mask
    queue: deque[FakeEvent] = field(default_factory=deque)
    ready: threading.Condition = field(default_factory=threading.Condition)


# --- profile validation --------------------------------------------------------------------------

def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _fail(where, "must be a positive integer")
    return value


def _non_negative_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(where, "must be a non-negative integer")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, "must be a non-empty string")
    return value


def _mapping(value: Any, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, "must be a mapping")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise _fail(f"{where}.{unknown[0]}", f"unknown key (known here: {', '.join(keys)})")
    return value


def _error_code(value: Any, where: str) -> int:
    """An NVML error by pynvml's name, lower-case without the prefix: library_not_found, unknown."""
    code = getattr(real, "NVML_ERROR_" + str(value).upper(), None) if isinstance(value, str) else None
    if not isinstance(code, int):
        raise _fail(where, f"must be an NVML error name such as library_not_found, driver_not_loaded, unknown; "
                           f"got {value!r}")
    return code


def _template(value: Any, where: str, **fields: int) -> str:
    """A string with "{i}" style fields, format specs allowed ("{i:02x}").

    Only the plain field names are expanded: str.format would also reach attributes and items
    ("{i.__class__}", "{i[0]}"), so the template is expanded field by field, never by str.format.
    """
    text = _string(value, where)
    allowed = ", ".join("{" + name + "}" for name in fields)
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise _fail(where, f"bad template {text!r}: {exc}") from None
    out: list[str] = []
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        spec = spec or ""
        if name not in fields or conversion is not None or "{" in spec:
            raise _fail(where, f"bad template {text!r}: only {allowed} with an optional format spec "
                               "(such as {i:02x}) may be used")
        try:
            out.append(format(fields[name], spec))
        except ValueError as exc:
            raise _fail(where, f"bad template {text!r}: {exc}") from None
    return "".join(out)


def _repeat(entry: Mapping[str, Any], where: str) -> int:
    return _positive_int(entry.get("repeat", 1), f"{where}.repeat")


def _parse_profile(value: Any, where: str) -> tuple[int, int, int, str]:
    """(gpu slices, compute slices, GB, suffix) of a name such as "1g.5gb", "1c.3g.20gb", "1g.10gb+me"."""
    match = _PROFILE_RE.match(_string(value, where))
    if match is None:
        raise _fail(where, f"not a MIG profile name like 1g.5gb, 1c.3g.20gb or 1g.10gb+me: {value!r}")
    gpu_slices = int(match["g"])
    compute_slices = int(match["c"] or gpu_slices)
    return gpu_slices, compute_slices, int(match["gb"]), match["suffix"] or ""


def _gi_profile_index(name: str) -> int | None:
    """pynvml's NVML_GPU_INSTANCE_PROFILE_<name>; None where this pynvml predates it."""
    index = getattr(real, "NVML_GPU_INSTANCE_PROFILE_" + name, None)
    return index if isinstance(index, int) else None


def _table_profile(model: MigModel, name: str, where: str) -> tuple[GpuInstanceProfile, int]:
    """The GPU instance profile ``name`` of ``model``, and its NVML profile index."""
    profile = model.profile(name)
    if profile is None:
        known = ", ".join(profile.name for profile in model.profiles)
        raise _fail(where, f"{name} is not a MIG profile of the {model.model} (its profiles: {known}; "
                           "vendors/nvidia/migtable.py)")
    index = _gi_profile_index(profile.nvml)
    if index is None:
        raise _fail(where, f"this pynvml has no NVML_GPU_INSTANCE_PROFILE_{profile.nvml} for {name}")
    return profile, index


def _made_up_profile(entry: Mapping[str, Any], where: str, name: str, gpu_slices: int,
                     suffix: str) -> tuple[GpuInstanceProfile, int]:
    """The GPU instance profile of a model the MIG table does not know, from what the entry says: it
    takes as many memory slices as it has GPU slices unless ``placement_size`` says otherwise."""
    indices = gpu_instance_profiles(real)
    index = _profile_index(indices, (gpu_slices, suffix))
    if index is None:
        raise _fail(f"{where}.profile", f"no NVML instance profile for {entry['profile']!r}")
    if entry.get("memory_mib") is None:
        raise _fail(f"{where}.memory_mib", "must be a positive integer: the MIG table does not know this GPU "
                                           "(vendors/nvidia/migtable.py), so a MIG device gives its memory")
    nvml = next(name for name in GPU_INSTANCE_PROFILES if _gi_profile_index(name) == index)
    engines = Engines(*(_non_negative_int(entry.get(f"engines_{kind}", 0), f"{where}.engines_{kind}")
                        for kind in ("copy", "decoder", "encoder", "jpeg", "ofa")))
    size = entry.get("placement_size")
    return GpuInstanceProfile(
        nvml=nvml, id=index + UNKNOWN_GI_PROFILE_ID_OFFSET, name=name,
        memory_slices=gpu_slices if size is None else _positive_int(size, f"{where}.placement_size"),
        compute_slices=gpu_slices, instances=0, starts=(),
        memory_mib=_positive_int(entry.get("memory_mib"), f"{where}.memory_mib"),
        multiprocessors=_non_negative_int(entry.get("multiprocessors", 0), f"{where}.multiprocessors"),
        engines=engines,
    ), index


def _mig(entry: Mapping[str, Any], where: str, parent_bytes: int, model: MigModel | None, gpu: int,
         i: int) -> FakeMig:
    """One MIG device. Its GPU instance profile comes from the MIG table where it knows the GPU's
    model, and so do the defaults of ``memory_mib``, ``multiprocessors`` and the engines."""
    gpu_slices, compute_slices, gb, suffix = _parse_profile(entry.get("profile"), f"{where}.profile")
    ci_index = _profile_index(compute_instance_profiles(real), compute_slices)
    if ci_index is None or compute_slices > gpu_slices:
        raise _fail(f"{where}.profile", f"no NVML instance profile for {entry['profile']!r}")
    name = f"{gpu_slices}g.{gb}gb{suffix}"

    def check_name(memory_mib: int) -> int:
        expected_gb = mig_memory_gb(memory_mib, parent_bytes)
        if expected_gb != gb:
            named = mig_profile_name(gpu_slices, compute_slices, expected_gb, suffix)
            raise _fail(f"{where}.profile", f"{entry['profile']} does not match memory_mib {memory_mib} on a "
                                            f"{parent_bytes}-byte GPU (NVML tools would call it {named})")
        return memory_mib

    if entry.get("memory_mib") is not None:
        check_name(_positive_int(entry["memory_mib"], f"{where}.memory_mib"))
    profile, gi_index = (_table_profile(model, name, f"{where}.profile") if model is not None
                         else _made_up_profile(entry, where, name, gpu_slices, suffix))
    given = entry.get("placement_start")
    start = None if given is None else _non_negative_int(given, f"{where}.placement_start")
    if model is not None and start is not None and start not in profile.starts:
        raise _fail(f"{where}.placement_start", f"{start!r} is not a placement of {name} on the {model.model} "
                                                f"(it may start at memory slice {profile.starts})")
    size = entry.get("placement_size")
    if model is not None and size is not None and size != profile.memory_slices:
        raise _fail(f"{where}.placement_size", f"{size!r}: a GPU instance of {name} takes {profile.memory_slices} "
                                               f"memory slices on the {model.model}")
    memory_mib = check_name(_positive_int(entry.get("memory_mib", profile.memory_mib), f"{where}.memory_mib"))
    defaults = {"multiprocessors": profile.multiprocessors * compute_slices // profile.compute_slices,
                "slices_gi": gpu_slices, "slices_ci": compute_slices,
                **{f"engines_{kind}": getattr(profile.engines, kind)
                   for kind in ("copy", "decoder", "encoder", "jpeg", "ofa")}}
    attributes = {key: _non_negative_int(entry.get(key, default), f"{where}.{key}")
                  for key, default in defaults.items()}
    return FakeMig(
        uuid=_template(entry.get("uuid"), f"{where}.uuid", gpu=gpu, i=i),
        profile=str(entry["profile"]),
        gi_profile=profile,
        gi_profile_index=gi_index,
        ci_profile_index=ci_index,
        compute_slices=compute_slices,
        memory_mib=memory_mib,
        attributes=attributes,
        gpu_instance_id=_non_negative_int(entry.get("gpu_instance_id", i + 1), f"{where}.gpu_instance_id"),
        compute_instance_id=_non_negative_int(entry.get("compute_instance_id", 0), f"{where}.compute_instance_id"),
        placement_start=start,
        placement_size=None,
    )


def _gpu_instances(migs: list[FakeMig], where: str) -> list[list[FakeMig]]:
    """The MIG devices by GPU instance, in order: those of one share its profile and placement, and
    their compute instances fit in it."""
    instances: dict[int, list[FakeMig]] = {}
    for mig in migs:
        instances.setdefault(mig.gpu_instance_id, []).append(mig)
    for gi_id, group in instances.items():
        if (len({mig.gi_profile.name for mig in group}) > 1
                or len({mig.placement_start for mig in group if mig.placement_start is not None}) > 1):
            raise _fail(where, f"the MIG devices of GPU instance {gi_id} must share its profile and placement_start")
        used = sum(mig.compute_slices for mig in group)
        if used > group[0].gi_profile.compute_slices:
            raise _fail(where, f"the compute instances of GPU instance {gi_id} take {used} compute slices; its "
                               f"{group[0].gi_profile.name} has {group[0].gi_profile.compute_slices}")
    return list(instances.values())


def _given_start(group: list[FakeMig]) -> int | None:
    return next((mig.placement_start for mig in group if mig.placement_start is not None), None)


def _placed(group: list[FakeMig], start: int, size: int) -> None:
    for mig in group:
        mig.placement_start, mig.placement_size = start, size


def _place(groups: list[list[FakeMig]], where: str, model: MigModel) -> None:
    """Give each GPU instance the placement given, else the lowest that lets every GPU instance of
    the GPU fit (the model's placements): NVML reports only placements a real GPU allows."""
    options: list[list[range]] = []
    for group in groups:
        given = _given_start(group)
        profile = group[0].gi_profile
        options.append([range(start, start + profile.memory_slices)
                        for start in (profile.starts if given is None else (given,))])

    def fit(n: int, used: frozenset[int]) -> list[range] | None:
        if n == len(groups):
            return []
        for slices in options[n]:
            rest = fit(n + 1, used | set(slices)) if used.isdisjoint(slices) else None
            if rest is not None:
                return [slices, *rest]
        return None

    chosen = fit(0, frozenset())
    if chosen is None:
        raise _fail(where, f"its GPU instances do not fit on one GPU together (a {model.model} has "
                           f"{model.memory_slices} memory slices; the placements of each profile: "
                           "vendors/nvidia/migtable.py)")
    for group, slices in zip(groups, chosen):
        _placed(group, slices.start, len(slices))


def _lay_out(groups: list[list[FakeMig]], where: str) -> None:
    """Place the GPU instances of a model the MIG table does not know: those given a placement_start
    there, the others in order, each at the first free memory slices after the one before."""
    used: list[tuple[range, int]] = []

    def take(slices: range, gi_id: int) -> None:
        for other, other_id in used:
            if set(slices) & set(other):
                raise _fail(where, f"GPU instances {other_id} and {gi_id} overlap (memory slices "
                                   f"{max(slices.start, other.start)} to {min(slices.stop, other.stop) - 1})")
        used.append((slices, gi_id))

    given = []
    for group in groups:
        start, size = _given_start(group), group[0].gi_profile.memory_slices
        if start is not None:
            take(range(start, start + size), group[0].gpu_instance_id)
            _placed(group, start, size)
            given.append(group)
    cursor = 0
    for group in groups:
        size = group[0].gi_profile.memory_slices
        if group in given:
            continue
        while any(set(range(cursor, cursor + size)) & set(slices) for slices, _ in used):
            cursor += 1
        take(range(cursor, cursor + size), group[0].gpu_instance_id)
        _placed(group, cursor, size)
        cursor += size


def _migs(value: Any, where: str, parent_bytes: int, model: MigModel | None, gpu: int) -> list[FakeMig]:
    if not isinstance(value, list):
        raise _fail(where, "must be a list")
    migs: list[FakeMig] = []
    for n, raw in enumerate(value):
        entry = _mapping(raw, f"{where}[{n}]", MIG_KEYS)
        for _ in range(_repeat(entry, f"{where}[{n}]")):
            migs.append(_mig(entry, f"{where}[{n}]", parent_bytes, model, gpu, len(migs)))
    most = MAX_MIG_DEVICES if model is None else model.compute_slices
    if len(migs) > most:
        on = "per GPU" if model is None else f"on the {model.model}"
        raise _fail(where, f"at most {most} MIG devices {on}, got {len(migs)}")
    instances = [(m.gpu_instance_id, m.compute_instance_id) for m in migs]
    if len(set(instances)) != len(instances):
        raise _fail(where, "two MIG devices share one (gpu_instance_id, compute_instance_id)")
    groups = _gpu_instances(migs, where)
    if model is None:
        _lay_out(groups, where)
    else:
        _place(groups, where, model)
    return migs


def _compute_capability(value: Any, where: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise _fail(where, "must be [major, minor], e.g. [9, 0]")
    return _non_negative_int(value[0], f"{where}[0]"), _non_negative_int(value[1], f"{where}[1]")


def _fabric(value: Any, where: str) -> tuple[bytes, int] | None:
    if value is None:
        return None
    entry = _mapping(value, where, ("cluster_uuid", "clique_id"))
    import uuid as uuidlib

    try:
        cluster = uuidlib.UUID(_string(entry.get("cluster_uuid"), f"{where}.cluster_uuid")).bytes
    except ValueError:
        raise _fail(f"{where}.cluster_uuid", "must be a UUID") from None
    return cluster, _non_negative_int(entry.get("clique_id"), f"{where}.clique_id")


def _vgpu(value: Any, where: str) -> tuple[bool, tuple[str, str] | None]:
    """``vgpu``: true (the "VF" capability alone) or {host_driver_version, host_driver_branch}."""
    if value is None or isinstance(value, bool):
        return bool(value), None
    entry = _mapping(value, where, ("host_driver_version", "host_driver_branch"))
    fields = []
    for key in ("host_driver_version", "host_driver_branch"):
        text = _string(entry.get(key), f"{where}.{key}")
        if len(text.encode()) > 10:
            raise _fail(f"{where}.{key}", "at most 10 bytes (the field's size in the vGPU capability)")
        fields.append(text)
    return True, (fields[0], fields[1])


# Keys whose value may be a list with one entry per repetition of a repeated GPU entry.
PER_REPEAT_KEYS = ("uuid", "pci_bus_id", "numa_node", "minor_number")


def _for_repetition(entry: Mapping[str, Any], where: str, repeat: int, position: int) -> dict[str, Any]:
    """The entry as seen by its ``position``-th repetition: per-repeat lists resolved to one value."""
    resolved = dict(entry)
    for key in PER_REPEAT_KEYS:
        value = entry.get(key)
        if isinstance(value, list):
            if len(value) != repeat:
                raise _fail(f"{where}.{key}", f"a list here needs exactly repeat={repeat} entries, got {len(value)}")
            resolved[key] = value[position]
    return resolved


def _bus_id(value: Any, where: str, index: int) -> str:
    bus_id = _template(value, where, i=index)
    try:
        bdf = normalise_bdf(bus_id)
    except ValueError:
        bdf = ""
    if not re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", bdf):
        raise _fail(where, f"not a PCI bus id like 0000:18:00.0: {bus_id!r}")
    return bdf


def _gpu(raw: Mapping[str, Any], where: str, index: int, repeat: int, position: int) -> FakeGpu:
    entry = _for_repetition(raw, where, repeat, position)
    memory_bytes = _positive_int(entry.get("memory_bytes"), f"{where}.memory_bytes")
    mig_mode = entry.get("mig_mode", "unsupported")
    if mig_mode not in ("unsupported", "disabled", "enabled"):
        raise _fail(f"{where}.mig_mode", f"must be one of unsupported, disabled, enabled; got {mig_mode!r}")
    if entry.get("mig_devices") and mig_mode != "enabled":
        raise _fail(f"{where}.mig_devices", "needs mig_mode: enabled")
    numa = entry.get("numa_node")
    minor = entry.get("minor_number")
    vgpu, vgpu_host_driver = _vgpu(entry.get("vgpu"), f"{where}.vgpu")
    name = _string(entry.get("name"), f"{where}.name")
    pci_device_id = _non_negative_int(entry.get("pci_device_id", 0), f"{where}.pci_device_id")
    model = mig_model(name, pci_device_id)
    return FakeGpu(
        index=index,
        name=name,
        uuid=_template(entry.get("uuid"), f"{where}.uuid", i=index),
        memory_bytes=memory_bytes,
        compute_capability=_compute_capability(entry.get("compute_capability"), f"{where}.compute_capability"),
        bus_id=_bus_id(entry.get("pci_bus_id"), f"{where}.pci_bus_id", index),
        pci_device_id=pci_device_id,
        minor_number=index if minor is None else _non_negative_int(minor, f"{where}.minor_number"),
        numa_node=None if numa is None else _non_negative_int(numa, f"{where}.numa_node"),
        pci_class=_non_negative_int(entry.get("pci_class", COMPUTE_CLASS), f"{where}.pci_class"),
        mig_mode=mig_mode,
        mig_model=model,
        migs=_migs(entry.get("mig_devices", []), f"{where}.mig_devices", memory_bytes, model, index),
        nvlink_peers=[],  # resolved once every GPU is known
        fabric=_fabric(entry.get("fabric"), f"{where}.fabric"),
        vgpu=vgpu,
        vgpu_host_driver=vgpu_host_driver,
        error_code=None if entry.get("error") is None else _error_code(entry["error"], f"{where}.error"),
    )


def _link_peers(gpus: list[FakeGpu], raw_entries: list[tuple[Mapping[str, Any], str]]) -> None:
    """nvlink_peers: "all" (one link to every other GPU, as through NVSwitch) or a list of bus ids."""
    known = {gpu.bus_id for gpu in gpus}
    for gpu, (entry, where) in zip(gpus, raw_entries):
        peers = entry.get("nvlink_peers", [])
        if peers == "all":
            gpu.nvlink_peers = [other.bus_id for other in gpus if other is not gpu]
            continue
        if not isinstance(peers, list):
            raise _fail(f"{where}.nvlink_peers", "must be 'all' or a list of PCI bus ids")
        resolved = [normalise_bdf(_string(peer, f"{where}.nvlink_peers[{n}]")) for n, peer in enumerate(peers)]
        unknown = [peer for peer in resolved if peer not in known]
        if unknown:
            raise _fail(f"{where}.nvlink_peers", f"{unknown[0]} is not the bus id of a GPU in this profile")
        gpu.nvlink_peers = resolved


def _check_unique(gpus: list[FakeGpu]) -> None:
    seen: set[str] = set()
    for gpu in gpus:
        for value in (gpu.uuid, gpu.bus_id, *(mig.uuid for mig in gpu.migs)):
            if value in seen:
                raise _fail(f"nvidia.gpus (GPU {gpu.index})",
                            f"{value} appears twice; UUIDs and bus ids must be unique")
            seen.add(value)


def parse_gpus(value: Any) -> list[FakeGpu]:
    if not isinstance(value, list):
        raise _fail("nvidia.gpus", "must be a list")
    gpus: list[FakeGpu] = []
    raw_entries: list[tuple[Mapping[str, Any], str]] = []
    for n, raw in enumerate(value):
        where = f"nvidia.gpus[{n}]"
        entry = _mapping(raw, where, GPU_KEYS)
        repeat = _repeat(entry, where)
        for position in range(repeat):
            gpus.append(_gpu(entry, where, len(gpus), repeat, position))
            raw_entries.append((entry, where))
    _link_peers(gpus, raw_entries)
    _check_unique(gpus)
    for gpu in gpus:
        for mig in gpu.migs:
            mig.parent = gpu
            assert mig.placement_start is not None and mig.placement_size is not None  # placed by _migs
            gpu.gis[mig.gpu_instance_id] = FakeGpuInstance(gpu, mig.gpu_instance_id, mig.gi_profile,
                                                           mig.placement_start, mig.placement_size)
    for name in sorted({gpu.name for gpu in gpus if gpu.migs and gpu.mig_model is None}):
        log.warning("the MIG table does not know this GPU: its GPU instances are laid out in order, with "
                    "made-up profile ids (vendors/nvidia/migtable.py)", vendor="nvidia", device=name,
                    reason="mig-model-unknown")
    return gpus


def _made_mig(gpu: FakeGpu, gpu_instance: FakeGpuInstance, ci_index: int, ci_id: int, uuid: str) -> FakeMig:
    """The MIG device of a compute instance made in ``gpu_instance`` (through NVML, or read back
    from the state file): named, sized and equipped as the profile's MIG devices are."""
    profile = gpu_instance.profile
    ci_slices = compute_instance_profiles(real)[ci_index]
    gi_slices, suffix = GPU_INSTANCE_PROFILES[profile.nvml]
    gi_index = _gi_profile_index(profile.nvml)
    assert gi_index is not None  # a profile of the table, which this pynvml has (_table_profile)
    attributes = {"multiprocessors": profile.multiprocessors * ci_slices // profile.compute_slices,
                  "slices_gi": gi_slices, "slices_ci": ci_slices,
                  **{f"engines_{kind}": getattr(profile.engines, kind)
                     for kind in ("copy", "decoder", "encoder", "jpeg", "ofa")}}
    return FakeMig(
        uuid=uuid, profile=mig_profile_name(gi_slices, ci_slices, mig_memory_gb(profile.memory_mib, gpu.memory_bytes),
                                            suffix),
        gi_profile=profile, gi_profile_index=gi_index, ci_profile_index=ci_index, compute_slices=ci_slices,
        memory_mib=profile.memory_mib, attributes=attributes, gpu_instance_id=gpu_instance.id,
        compute_instance_id=ci_id, placement_start=gpu_instance.placement_start,
        placement_size=gpu_instance.placement_size, parent=gpu)


def _restore(gpus: list[FakeGpu], state_file: Path) -> None:
    """The MIG layout the state file keeps, in place of the profile's, for each GPU it names."""
    from vendors.nvidia import simulate_mig  # only profiles that keep a MIG state file need it

    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    for uuid, layout in simulate_mig.load(state_file).items():
        gpu = by_uuid.get(uuid)
        if gpu is None or gpu.mig_mode != "enabled" or gpu.mig_model is None:
            continue
        gis: dict[int, FakeGpuInstance] = {}
        migs: list[FakeMig] = []
        for entry in layout:
            profile = gpu.mig_model.profile(entry.profile)
            if profile is None or entry.start not in profile.starts:
                raise _fail(f"nvidia.state_file ({state_file})", f"{entry.profile} at memory slice {entry.start} is "
                                                                 f"not a placement of the {gpu.mig_model.model}")
            gi = gis[entry.gi] = FakeGpuInstance(gpu, entry.gi, profile, entry.start, profile.memory_slices)
            for ci_id, ci_profile, mig_uuid in entry.cis:
                ci_index = _profile_index(compute_instance_profiles(real), ci_profile)
                if ci_index is None:
                    raise _fail(f"nvidia.state_file ({state_file})", f"no compute instance profile of {ci_profile} "
                                                                     "slices")
                migs.append(_made_mig(gpu, gi, ci_index, ci_id, mig_uuid))
        gpu.gis, gpu.migs = gis, migs


# --- sysfs ---------------------------------------------------------------------------------------

def _config_space(gpu: FakeGpu) -> bytes:
    """256 bytes of config space: vendor/device, a capability list, and NVIDIA's "VF" capability for a
    vGPU, with one record before the host driver's (record 0), as the layout allows."""
    config = bytearray(256)
    config[0:2] = PCI_VENDOR_ID.to_bytes(2, "little")
    config[0x06] = 0x10  # status: capability list present
    config[0x34] = 0x60
    config[0x60:0x62] = bytes([0x01, 0x68])  # power management -> next
    config[0x68:0x6A] = bytes([0x05, 0x78 if not gpu.vgpu else 0xC8])  # MSI -> next
    if gpu.vgpu:
        records = bytes([0x07, 0x04, 0xAA, 0xBB])  # some other record: id 7, length 4
        if gpu.vgpu_host_driver:
            version, branch = (field.encode().ljust(10, b"\0") for field in gpu.vgpu_host_driver)
            records += bytes([0x00, 22]) + version + branch
        capability = bytes([0x09, 0x78, 5 + len(records)]) + b"VF" + records  # vendor-specific, -> PCIe
        config[0xC8:0xC8 + len(capability)] = capability
    config[0x78:0x7A] = bytes([0x10, 0x00])  # PCI Express, end of list
    return bytes(config)


def write_sysfs(gpus: list[FakeGpu], root: Path, driver_loaded: bool) -> None:
    """The GPUs' PCI entries (bound to ``nvidia`` when the driver is loaded), and the host bridge."""
    write_host_bridge(root)
    for gpu in gpus:
        write_device(root, gpu.bus_id, PCI_VENDOR_ID, gpu.pci_device_id, gpu.pci_class, revision=0xA1,
                     numa_node=gpu.numa_node, driver="nvidia" if driver_loaded else None, config=_config_space(gpu))


# --- the module ----------------------------------------------------------------------------------

# nvmlDeviceGetBrand by product name, the first marker the name holds; others are NVML_BRAND_NVIDIA.
_BRANDS_BY_NAME = (("GeForce RTX", real.NVML_BRAND_GEFORCE_RTX), ("GeForce", real.NVML_BRAND_GEFORCE),
                   ("TITAN RTX", real.NVML_BRAND_TITAN_RTX), ("TITAN", real.NVML_BRAND_TITAN),
                   ("Quadro RTX", real.NVML_BRAND_QUADRO_RTX), ("Quadro", real.NVML_BRAND_QUADRO),
                   ("NVIDIA RTX", real.NVML_BRAND_NVIDIA_RTX))


def _max_mig_devices(gpu: FakeGpu) -> int:
    """nvmlDeviceGetMaxMigDeviceCount: one MIG device per compute slice."""
    return MAX_MIG_DEVICES if gpu.mig_model is None else gpu.mig_model.compute_slices


def _bus_id_nvml(bdf: str) -> bytes:
    """NVML prints the domain with 8 digits: "00000000:18:00.0"."""
    domain, rest = bdf.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}".encode()


class FakeNvml:
    """The state behind one fake pynvml module; its nvml* methods become the module's functions."""

    def __init__(self, driver_version: str, cuda_driver_version: int, gpus: list[FakeGpu], init_error: int | None,
                 state_file: Path | None = None):
        self.state_file = state_file
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.gpus = gpus
        self.init_error = init_error
        self.init_count = 0
        self.event_sets: list[FakeEventSet] = []
        self.lock = threading.Lock()
        # NVML creates no event set while a thread of the process waits on one (a real H200, driver
        # 580.159.04: tests/fixtures/nvidia/h200-passthrough/lock.txt): the waits in flight
        self._waits = threading.Condition()
        self._waiting = 0

    # helpers
    def _initialised(self) -> None:
        if self.init_count <= 0:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any) -> FakeGpu:
        self._initialised()
        gpu = handle.parent if isinstance(handle, FakeMig) else handle
        if not isinstance(gpu, FakeGpu):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.lost:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        if gpu.error_code is not None:
            raise real.NVMLError(gpu.error_code)
        return gpu

    def _mig(self, handle: Any) -> FakeMig:
        self._gpu(handle)
        if not isinstance(handle, FakeMig):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return handle

    def _find(self, uuid: str) -> FakeGpu | FakeMig:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
            for mig in gpu.migs:
                if mig.uuid == uuid:
                    return mig
        raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)

    # lifecycle and system
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._initialised()
        self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._initialised()
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._initialised()
        return self.cuda_driver_version

    # devices
    def nvmlDeviceGetCount(self) -> int:
        self._initialised()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._initialised()
        if not 0 <= index < len(self.gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpu(self.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeGpu | FakeMig:
        self._initialised()
        found = self._find(uuid.decode() if isinstance(uuid, bytes) else uuid)
        self._gpu(found)
        return found

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        return f"{gpu.name} MIG {handle.profile}" if isinstance(handle, FakeMig) else gpu.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        return handle.uuid if isinstance(handle, FakeMig) else gpu.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._gpu(handle)
        total = handle.memory_mib * 1024 * 1024 if isinstance(handle, FakeMig) else gpu.memory_bytes
        return real.c_nvmlMemory_t(total=total, free=total, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        gpu = self._gpu(handle)
        if gpu.compute_capability is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.compute_capability

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        return self._pci_info(gpu)


    @staticmethod
    def _pci_info(gpu: FakeGpu) -> Any:
        domain, bus, rest = gpu.bus_id.split(":")
        info = real.nvmlPciInfo_t()
        info.busId = _bus_id_nvml(gpu.bus_id)
        info.busIdLegacy = _bus_id_nvml(gpu.bus_id)
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId = (gpu.pci_device_id << 16) | PCI_VENDOR_ID
        return info

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu(handle).minor_number

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        """The brand NVML gives the product line: the data-center GPUs (Tesla T4, A100, H100, L40S)
        are "NVIDIA" on current drivers; GeForce, TITAN, Quadro and RTX workstation cards their own."""
        name = self._gpu(handle).name
        return int(next((brand for marker, brand in _BRANDS_BY_NAME if marker in name), real.NVML_BRAND_NVIDIA))

    def nvmlDeviceGetAddressingMode(self, handle: Any) -> int:
        """Drivers before 580 (NVML 13) have no such call; Turing and newer GPUs on them say None: a
        simulated machine has no coherent CPU-GPU memory (ATS) and no HMM."""
        gpu = self._gpu(handle)
        major = re.match(r"\d+", self.driver_version)
        if major is None or int(major.group()) < 580:
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if gpu.compute_capability is None or gpu.compute_capability < (7, 5):
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return int(real.NVML_DEVICE_ADDRESSING_MODE_NONE)

    def nvmlDeviceGetVirtualizationMode(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        return int(real.NVML_GPU_VIRTUALIZATION_MODE_VGPU if gpu.vgpu else real.NVML_GPU_VIRTUALIZATION_MODE_NONE)

    # MIG
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._gpu(handle)
        if gpu.mig_mode == "unsupported" or isinstance(handle, FakeMig):
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        mode = real.NVML_DEVICE_MIG_ENABLE if gpu.mig_mode == "enabled" else real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        return 0 if gpu.mig_mode == "unsupported" else _max_mig_devices(gpu)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeMig:
        gpu = self._gpu(handle)
        if gpu.mig_mode != "enabled" or not 0 <= index < _max_mig_devices(gpu):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        migs = gpu.migs  # one state: making and destroying replace the list
        if index >= len(migs):
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return migs[index]

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        mig = self._mig(handle)
        a = mig.attributes
        return real.c_nvmlDeviceAttributes(
            multiprocessorCount=a["multiprocessors"], sharedCopyEngineCount=a["engines_copy"],
            sharedDecoderCount=a["engines_decoder"], sharedEncoderCount=a["engines_encoder"],
            sharedJpegCount=a["engines_jpeg"], sharedOfaCount=a["engines_ofa"],
            gpuInstanceSliceCount=a["slices_gi"], computeInstanceSliceCount=a["slices_ci"],
            memorySizeMB=mig.memory_mib,
        )


    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig(handle).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig(handle).compute_instance_id

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int) -> FakeGpuInstance:
        gpu = self._gpu(handle)
        found = gpu.gis.get(gpu_instance_id)
        if found is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return found

    def nvmlGpuInstanceGetInfo(self, gpu_instance: FakeGpuInstance) -> Any:
        self._gpu(gpu_instance.gpu)
        info = real.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gpu_instance.id, gpu_instance.profile.id
        info.placement.start, info.placement.size = gpu_instance.placement_start, gpu_instance.placement_size
        return info

    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: FakeGpuInstance, ci_id: int) -> FakeComputeInstance:
        gpu = self._gpu(gpu_instance.gpu)
        for mig in gpu.migs:
            if mig.gpu_instance_id == gpu_instance.id and mig.compute_instance_id == ci_id:
                return FakeComputeInstance(gpu_instance, ci_id, mig.ci_profile_index)
        raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)

    def nvmlComputeInstanceGetInfo(self, compute_instance: FakeComputeInstance) -> Any:
        self._gpu(compute_instance.gpu_instance.gpu)
        info = real.c_nvmlComputeInstanceInfo_t()
        info.id, info.profileId = compute_instance.id, compute_instance.profile_index + CI_PROFILE_ID_OFFSET
        return info


    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        gpu = self._gpu(handle)
        if gpu.mig_mode == "unsupported":
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if profile not in gpu_instance_profiles(real):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.mig_model is not None:
            found = next((p for p in gpu.mig_model.profiles if _gi_profile_index(p.nvml) == profile), None)
            instances = 0 if found is None else found.instances
        else:  # what the profile's own MIG devices say
            found = next((mig.gi_profile for mig in gpu.migs if mig.gi_profile_index == profile), None)
            instances = len({mig.gpu_instance_id for mig in gpu.migs if mig.gi_profile_index == profile})
        if found is None:  # not a profile of this GPU
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        info = real.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount = found.id, found.compute_slices, instances
        info.multiprocessorCount, info.memorySizeMB = found.multiprocessors, found.memory_mib
        engines = found.engines
        info.copyEngineCount, info.decoderCount, info.encoderCount = engines.copy, engines.decoder, engines.encoder
        info.jpegCount, info.ofaCount, info.name = engines.jpeg, engines.ofa, f"MIG {found.name}"
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpu_instance: FakeGpuInstance, profile: int,
                                                     engine_profile: int, version: int = 2) -> Any:
        self._gpu(gpu_instance.gpu)
        slices = compute_instance_profiles(real)
        if profile not in slices or engine_profile != real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        info = real.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id, info.sliceCount = profile + CI_PROFILE_ID_OFFSET, slices[profile]
        return info

    # MIG devices made and destroyed, as NVIDIA's DRA driver does at prepare and unprepare
    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: Any, profile_id: int, placements_ref: Any,
                                                   count_ref: Any) -> int:
        """Where a GPU instance of ``profile_id`` may sit: the MIG table's placements, as the real
        call gives them to the pointers it is passed (the count alone when ``placements_ref`` is None;
        INSUFFICIENT_SIZE when the array is smaller than that)."""
        gpu = self._gpu(handle)
        profile = self._made_profile(gpu, profile_id)
        placements = [(start, profile.memory_slices) for start in profile.starts]
        count = getattr(count_ref, "_obj", count_ref)
        if placements_ref is not None:
            if count.value < len(placements):
                raise real.NVMLError(real.NVML_ERROR_INSUFFICIENT_SIZE)
            array = getattr(placements_ref, "_obj", placements_ref)
            for slot, (start, size) in zip(array, placements):
                slot.start, slot.size = start, size
        count.value = len(placements)
        return int(real.NVML_SUCCESS)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement: Any) -> FakeGpuInstance:
        """A GPU instance of ``profile_id`` at ``placement`` (a c_nvmlGpuInstancePlacement_t, or a
        pointer to one): INVALID_ARGUMENT for a placement the profile does not have,
        INSUFFICIENT_RESOURCES where it overlaps a GPU instance, or the profile's instances or the
        GPU's compute slices are used up, as the real driver refuses them."""
        gpu = self._gpu(handle)
        profile = self._made_profile(gpu, profile_id)
        placement = getattr(placement, "_obj", placement)
        start, size = int(placement.start), int(placement.size)
        if start not in profile.starts or size != profile.memory_slices:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        with self.lock:
            gis = dict(gpu.gis)
            taken = {slice_ for gi in gis.values() for slice_ in range(gi.placement_start,
                                                                       gi.placement_start + gi.placement_size)}
            assert gpu.mig_model is not None  # _made_profile found it in the table
            slices = sum(gi.profile.compute_slices for gi in gis.values()) + profile.compute_slices
            if (taken & set(range(start, start + size)) or slices > gpu.mig_model.compute_slices
                    or sum(gi.profile.id == profile.id for gi in gis.values()) >= profile.instances):
                raise real.NVMLError(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
            gi_id = next(i for i in range(1, len(gis) + 2) if i not in gis)
            gis[gi_id] = FakeGpuInstance(gpu, gi_id, profile, start, size)
            gpu.gis = gis
            self._save()
            return gis[gi_id]

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: FakeGpuInstance, profile_id: int
                                             ) -> FakeComputeInstance:
        """A compute instance of ``profile_id`` (a compute instance profile's id, from
        nvmlGpuInstanceGetComputeInstanceProfileInfo) in the GPU instance: its MIG device appears with
        a new UUID. INSUFFICIENT_RESOURCES where the GPU instance's compute slices are taken."""
        gpu = self._gpu(gpu_instance.gpu)
        ci_index = profile_id - CI_PROFILE_ID_OFFSET
        ci_slices = compute_instance_profiles(real).get(ci_index)
        if ci_slices is None:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        with self.lock:
            if gpu.gis.get(gpu_instance.id) is not gpu_instance:
                raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)  # destroyed meanwhile
            mine = [mig for mig in gpu.migs if mig.gpu_instance_id == gpu_instance.id]
            if sum(mig.compute_slices for mig in mine) + ci_slices > gpu_instance.profile.compute_slices:
                raise real.NVMLError(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
            ci_id = next(i for i in range(len(mine) + 1) if i not in {mig.compute_instance_id for mig in mine})
            mig = _made_mig(gpu, gpu_instance, ci_index, ci_id, f"MIG-{uuidlib.uuid4()}")
            gpu.migs = [*gpu.migs, mig]
            self._save()
            return FakeComputeInstance(gpu_instance, ci_id, ci_index)

    def nvmlComputeInstanceDestroy(self, compute_instance: FakeComputeInstance) -> int:
        gpu = self._gpu(compute_instance.gpu_instance.gpu)
        gi_id = compute_instance.gpu_instance.id
        with self.lock:
            kept = [mig for mig in gpu.migs
                    if (mig.gpu_instance_id, mig.compute_instance_id) != (gi_id, compute_instance.id)]
            if len(kept) == len(gpu.migs):
                raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
            gpu.migs = kept
            self._save()
        return int(real.NVML_SUCCESS)

    def nvmlGpuInstanceDestroy(self, gpu_instance: FakeGpuInstance) -> int:
        """IN_USE while a compute instance of it is left, as the real driver answers."""
        gpu = self._gpu(gpu_instance.gpu)
        with self.lock:
            if gpu.gis.get(gpu_instance.id) is not gpu_instance:
                raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
            if any(mig.gpu_instance_id == gpu_instance.id for mig in gpu.migs):
                raise real.NVMLError(real.NVML_ERROR_IN_USE)
            gpu.gis = {gi_id: gi for gi_id, gi in gpu.gis.items() if gi_id != gpu_instance.id}
            self._save()
        return int(real.NVML_SUCCESS)

    def _made_profile(self, gpu: FakeGpu, profile_id: int) -> GpuInstanceProfile:
        """The GPU instance profile ``profile_id`` of the GPU's model: NOT_SUPPORTED where MIG is not
        enabled or the MIG table does not know the model (its placements are not known),
        INVALID_ARGUMENT for a profile id it does not have."""
        if gpu.mig_mode != "enabled" or gpu.mig_model is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        profile = next((p for p in gpu.mig_model.profiles if p.id == profile_id), None)
        if profile is None:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return profile

    def _save(self) -> None:
        """Keep the GPUs' MIG layout in the profile's ``state_file`` (when it names one), as a real
        driver keeps it across the processes that use NVML. Called holding ``lock``."""
        if self.state_file is not None:
            from vendors.nvidia import simulate_mig

            simulate_mig.save(self.state_file, [(gpu.uuid, gpu.gis.values(), gpu.migs) for gpu in self.gpus
                                                if gpu.mig_mode == "enabled"])

    # interconnect and topology
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        gpu = self._gpu(handle)
        if not gpu.nvlink_peers:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < real.NVML_NVLINK_MAX_LINKS:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return int(real.NVML_FEATURE_ENABLED if link < len(gpu.nvlink_peers) else real.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        gpu = self._gpu(handle)
        if not 0 <= link < len(gpu.nvlink_peers):
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED if not gpu.nvlink_peers
                                 else real.NVML_ERROR_INVALID_ARGUMENT)
        peer = next(other for other in self.gpus if other.bus_id == gpu.nvlink_peers[link])
        return self._pci_info(peer)


    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info_pointer: Any) -> int:
        """Fills the caller's struct, passed as pynvml callers pass it: byref(info)."""
        gpu = self._gpu(handle)
        if gpu.fabric is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        info = getattr(info_pointer, "_obj", info_pointer)
        cluster, clique = gpu.fabric
        info.clusterUuid = (real.c_uint8 * real.NVML_GPU_FABRIC_UUID_LEN)(*cluster)
        info.status, info.cliqueId, info.state = real.NVML_SUCCESS, clique, real.NVML_GPU_FABRIC_STATE_COMPLETED
        return int(real.NVML_SUCCESS)

    nvmlDeviceGetGpuFabricInfoV = nvmlDeviceGetGpuFabricInfo

    # events
    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._initialised()
        with self._waits:
            self._waits.wait_for(lambda: not self._waiting)
        event_set = FakeEventSet()
        with self.lock:
            self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._supported_events(self._gpu(handle))

    @staticmethod
    def _supported_events(gpu: FakeGpu) -> int:
        return SUPPORTED_EVENTS | (MIG_CHANGE_EVENT if gpu.mig_model is not None else 0)

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: FakeEventSet) -> None:
        gpu = self._gpu(handle)
        if event_types & ~self._supported_events(gpu):
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        with event_set.ready:
            event_set.registered[id(gpu)] = event_set.registered.get(id(gpu), 0) | event_types

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> FakeEvent:
        """The next queued event; NVMLError_Timeout when none arrives within ``timeout_ms``."""
        self._initialised()
        deadline = time.monotonic() + timeout_ms / 1000
        with self._waits:
            self._waiting += 1
        try:
            with event_set.ready:
                while not event_set.queue:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise real.NVMLError(real.NVML_ERROR_TIMEOUT)
                    event_set.ready.wait(remaining)
                return event_set.queue.popleft()
        finally:
            with self._waits:
                self._waiting -= 1
                self._waits.notify_all()


    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._initialised()
        with self.lock:
            if event_set in self.event_sets:
                self.event_sets.remove(event_set)

    # test hooks
    @property
    def event_waits(self) -> int:
        """The nvmlEventSetWait calls in flight."""
        with self._waits:
            return self._waiting

    def inject_xid(self, uuid: str, xid: int) -> None:
        """Queue an XID critical-error event for the GPU or MIG device ``uuid``."""
        try:
            target = self._find(uuid)
        except real.NVMLError:
            raise ValueError(f"inject_xid: no GPU or MIG device with UUID {uuid}") from None
        gpu = target.parent if isinstance(target, FakeMig) else target
        assert gpu is not None
        self._queue(gpu, FakeEvent(
            device=gpu, eventType=real.nvmlEventTypeXidCriticalError, eventData=xid,
            gpuInstanceId=target.gpu_instance_id if isinstance(target, FakeMig) else WHOLE_GPU,
            computeInstanceId=target.compute_instance_id if isinstance(target, FakeMig) else WHOLE_GPU,
        ))

    def inject_mig_change(self, uuid: str) -> None:
        """Queue a MIG configuration change event for the GPU ``uuid`` (it must be MIG-capable)."""
        gpu = next((g for g in self.gpus if g.uuid == uuid), None)
        if gpu is None or gpu.mig_model is None:
            raise ValueError(f"inject_mig_change: no MIG-capable GPU with UUID {uuid}")
        self._queue(gpu, FakeEvent(device=gpu, eventType=MIG_CHANGE_EVENT, eventData=0, gpuInstanceId=WHOLE_GPU,
                                   computeInstanceId=WHOLE_GPU))

    def _queue(self, gpu: FakeGpu, event: FakeEvent) -> None:
        """Deliver ``event`` to every event set registered for its type on ``gpu``."""
        with self.lock:
            sets = list(self.event_sets)
        for event_set in sets:
            with event_set.ready:
                if event_set.registered.get(id(gpu), 0) & event.eventType:
                    event_set.queue.append(event)
                    event_set.ready.notify_all()

    def set_lost(self, uuid: str, lost: bool) -> None:
        """Make every call on the GPU ``uuid`` (or on its MIG devices) raise NVMLError_GpuIsLost;
        losing it queues the GPU-unavailable event, as the driver does."""
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                was, gpu.lost = gpu.lost, lost
                if lost and not was:
                    self._queue(gpu, FakeEvent(device=gpu, eventType=real.nvmlEventTypeGpuUnavailableError,
                                               eventData=0, gpuInstanceId=WHOLE_GPU, computeInstanceId=WHOLE_GPU))
                return
        raise ValueError(f"set_lost: no GPU with UUID {uuid}")


_EXPORTED_PREFIXES = ("NVML_", "NVMLError", "nvmlEventType", "nvmlEventMigConfigChange", "c_nvml", "nvmlPciInfo_t",
                      "byref")


def _module(state: FakeNvml) -> ModuleType:
    module = ModuleType("fake_pynvml", "gpu-labeller's simulated pynvml")
    for name in dir(real):
        if name.startswith(_EXPORTED_PREFIXES):
            setattr(module, name, getattr(real, name))
    for name in dir(state):
        if name.startswith("nvml") or name in ("inject_xid", "inject_mig_change", "set_lost"):
            setattr(module, name, getattr(state, name))
    setattr(module, "state", state)
    return module


def absent() -> ModuleType:
    """The fake of a node with no NVIDIA driver: nvmlInit fails with LIBRARY_NOT_FOUND."""
    return _module(FakeNvml("", 0, [], real.NVML_ERROR_LIBRARY_NOT_FOUND))


def build(section: Any, root: Path, base_dir: Path | None = None) -> ModuleType:
    """Validate a profile's ``nvidia:`` section, write its PCI sysfs entries under ``root``, return the fake."""
    section = _mapping(section, "nvidia", SECTION_KEYS)
    init_error = None if section.get("nvml_error") is None else _error_code(section["nvml_error"], "nvidia.nvml_error")
    driver_version = _string(section.get("driver_version"), "nvidia.driver_version")
    cuda_driver_version = _positive_int(section.get("cuda_driver_version"), "nvidia.cuda_driver_version")
    gpus = parse_gpus(section.get("gpus", []))
    state_file = None
    if section.get("state_file") is not None:
        state_file = (base_dir or Path.cwd()) / _string(section["state_file"], "nvidia.state_file")
        _restore(gpus, state_file)
    write_sysfs(gpus, root, driver_loaded=init_error != real.NVML_ERROR_DRIVER_NOT_LOADED)
    return _module(FakeNvml(driver_version, cuda_driver_version, gpus, init_error, state_file))
