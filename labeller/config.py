"""The configuration file: NVIDIA device-plugin config v1, plus gpu-labeller's own section.

One ConfigMap serves the labels and the device plugin, and users coming from NVIDIA's plugin can
bring theirs unchanged: ``flags`` and ``sharing`` are read in NVIDIA's format (keys NVIDIA accepts
but that do not matter here are accepted and ignored). ``sharing.*.resources[].devices`` and
``rename`` are served as NVIDIA's device map code defines them (NVIDIA's released plugin ignores
them with a warning). gpu-labeller's own settings live under ``labeller``. Every problem is
reported as one line naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from labeller.documents import DocumentError, read_document
from labeller.errors import InputError
from labeller.upstream import Overrides, go_duration, overlay, unhonoured_keys

log = structlog.get_logger(__name__)

MigStrategy = Literal["none", "single", "mixed"]
SharingStrategy = Literal["none", "time-slicing", "mps", "memory"]
MemoryUnit = Literal["GiB", "MiB"]
AmdResourceNaming = Literal["single", "mixed"]

MAX_RESOURCE_NAME_LENGTH = 63
DEFAULT_MPS_ROOT = "/run/nvidia/mps"
# Clients one MPS server accepts from Volta on (16 before): more replicas could never all run.
MPS_MAX_CLIENTS = 48
# Bounds NVIDIA's plugin does not set (it only wants replicas >= 1), so that checking a config stays
# fast and bounded whatever it says; the offer's own bound is labeller.offer.MAX_DEVICES_PER_RESOURCE.
MAX_REPLICAS = 1024  # replicas of one device
MAX_DEVICE_REFS = 1024  # devices one sharing entry may list or count; a node has at most a few hundred
MAX_SHARED_RESOURCES = 256  # entries under resources: every MIG profile and partition of every vendor fits


class ConfigError(InputError, ValueError):
    """A configuration problem, with a message that names the offending key."""


@dataclass(frozen=True)
class ResourceNames:
    """What parsing must know of the registered vendors' resource names: the vendors' facts
    (``labeller.vendor.resource_names``), handed in by the commands as ``vendors.RESOURCE_NAMES``."""

    default_domain: str  # a short name in the sharing config: "gpu" is "<default_domain>/gpu"
    own: tuple[re.Pattern[str], ...]  # names a vendor registers itself: a rename must not take one
    mps_shareable: tuple[re.Pattern[str], ...]  # the resource names MPS can share
    mps_shares: str  # the same, for people: "whole NVIDIA GPUs (nvidia.com/gpu)"
    dra_vendors: tuple[str, ...] = ()  # the vendors with a DRA driver: what labeller.dra.vendors may name

    def advertised_by_a_vendor(self, name: str) -> bool:
        return any(pattern.fullmatch(name) for pattern in self.own)

    def mps_can_share(self, name: str) -> bool:
        return any(pattern.fullmatch(name) for pattern in self.mps_shareable)


@dataclass(frozen=True)
class DeviceSelector:
    """Which devices of a resource a sharing entry replicates (``devices:``): all of them, the first
    ``count`` in the resource's order, or the ones ``refs`` names (GPU index "0", MIG index "0:1",
    GPU-/MIG- UUID, or an AMD device's PCI address)."""

    count: int | None = None
    refs: tuple[str, ...] = ()

    @property
    def all(self) -> bool:
        return self.count is None and not self.refs


@dataclass(frozen=True)
class SharedResource:
    name: str  # fully qualified: "nvidia.com/gpu", "amd.com/gpu"
    replicas: int
    rename: str | None = None  # fully qualified; None: the name, or <name>.shared under renameByDefault
    devices: DeviceSelector = field(default_factory=DeviceSelector)
    where: str = field(default="", compare=False)  # its place in the config, for messages


@dataclass(frozen=True)
class MemorySharing:
    """``sharing.memory``: whole NVIDIA GPUs offered by memory (gpushare's ``aliyun.com/gpu-mem``, one
    device per ``unit`` of each GPU's memory, and ``aliyun.com/gpu-count``) instead of ``nvidia.com/gpu``."""

    unit: MemoryUnit = "GiB"

    @property
    def unit_bytes(self) -> int:
        return 1 << (30 if self.unit == "GiB" else 20)


@dataclass(frozen=True)
class Sharing:
    strategy: SharingStrategy = "none"
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[SharedResource, ...] = ()
    memory: MemorySharing | None = None  # sharing.memory: then strategy is "memory" and resources is empty

    def entry(self, resource: str) -> SharedResource | None:
        """The sharing entry for ``resource``, or None when it is not shared."""
        return next((shared for shared in self.resources if shared.name == resource), None)

    def replicas_for(self, resource: str) -> int:
        """How many replicas each device of ``resource`` is advertised as (1 = not shared)."""
        shared = self.entry(resource)
        return shared.replicas if shared is not None else 1

    def advertised_name(self, resource: str) -> str:
        """The name the replicas of ``resource`` are registered under: ``rename``, else
        ``<name>.shared`` under renameByDefault, else the name itself."""
        shared = self.entry(resource)
        if shared is None:
            return resource
        if shared.rename is not None:
            return shared.rename
        return f"{resource}.shared" if self.rename_by_default else resource


@dataclass(frozen=True)
class PluginFlags:
    device_id_strategy: Literal["uuid", "index"] = "uuid"
    device_list_strategy: tuple[str, ...] = ("envvar",)
    pass_device_specs: bool = False
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    shared_devices_allocation_policy: Literal["distributed", "packed"] = "distributed"
    nvidia_dev_root: str = "/"
    fail_on_init_error: bool = False  # flags.failOnInitError: exit instead of waiting for the driver
    mps_root: str = DEFAULT_MPS_ROOT  # flags.mpsRoot: the host directory of the MPS daemons' pipes and logs
    nvidia_driver_root: str = "/"  # flags.nvidiaDriverRoot: where the driver's files are on the host (CDI specs)
    nvidia_ctk_path: str = "/usr/bin/nvidia-ctk"  # flags.plugin.nvidiaCTKPath: its ldcache hook, when the host has it


@dataclass(frozen=True)
class LabelGroups:
    """Which families of labels to emit."""

    nvidia: bool = True
    amd: bool = True  # amd.com/gpu.<kind>
    amd_beta: bool = True  # beta.amd.com/gpu.<kind>.<value>=<count>
    firmware: bool = False  # beta.amd.com/gpu.firmware.* (20 keys per distinct firmware set)
    machine: bool = True  # nvidia.com/gpu.machine
    # Off by default: a changing timestamp would make every re-probe a write to the API server.
    timestamp: bool = False


DEFAULT_MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"
MIN_SLEEP_INTERVAL_S = 0.01  # as run's --interval


@dataclass(frozen=True)
class GfdFlags:
    """``flags.gfd``, GFD's settings, as ``run`` honours them."""

    oneshot: bool = False  # as --once
    sleep_interval_s: float | None = None  # as --interval
    output_file: str | None = None  # as --features-file
    machine_type_file: str = DEFAULT_MACHINE_TYPE_FILE  # where nvidia.com/gpu.machine is read, under the host root


@dataclass(frozen=True)
class Config:
    mig_strategy: MigStrategy = "none"
    sharing: Sharing = field(default_factory=Sharing)
    plugin: PluginFlags = field(default_factory=PluginFlags)
    labels: LabelGroups = field(default_factory=LabelGroups)
    gfd: GfdFlags = field(default_factory=GfdFlags)
    # labeller.amd.resourceNamingStrategy, as AMD's plugin's -resource_naming_strategy
    amd_resource_naming: AmdResourceNaming = "single"
    # labeller.dra.vendors: the vendors whose GPUs this node serves through DRA (the DRA plugin's
    # ResourceSlices) instead of the device plugin's extended resources; none by default
    dra_vendors: tuple[str, ...] = ()
    # labeller.dra.dynamicMig: MIG devices (AMD: compute partitions) made at prepare, published as
    # partitionable devices drawing on counters of their GPU; off by default
    dra_dynamic_mig: bool = False

    def served_by_dra(self, vendor: str) -> bool:
        return vendor in self.dra_vendors


# --- schema --------------------------------------------------------------------------------------
# A spec is a type (bool, int, str), a tuple of allowed strings, a dict of sub-specs, or IGNORED.
IGNORED = object()
Spec = Any

_PLUGIN_SPEC: dict[str, Spec] = {
    "passDeviceSpecs": bool,
    "deviceListStrategy": IGNORED,  # string or list; checked in _plugin_flags
    "deviceIDStrategy": ("uuid", "index"),
    "cdiAnnotationPrefix": str,
    "nvidiaCTKPath": str,
    "containerDriverRoot": str,
    "sharedDevicesAllocationPolicy": ("distributed", "packed"),
}
_GFD_SPEC: dict[str, Spec] = {
    "oneshot": bool,
    "noTimestamp": bool,
    "sleepInterval": IGNORED,  # a Go duration; checked in _gfd_flags
    "outputFile": str,
    "machineTypeFile": str,
}
_FLAGS_SPEC: dict[str, Spec] = {
    "migStrategy": ("none", "single", "mixed"),
    "failOnInitError": bool,
    "nvidiaDriverRoot": str,
    "nvidiaDevRoot": str,
    "mpsRoot": str,
    "gdrcopyEnabled": bool,
    "gdsEnabled": bool,
    "mofedEnabled": bool,
    "useNodeFeatureAPI": bool,
    "deviceDiscoveryStrategy": ("auto", "nvml", "tegra", "vfio"),
    "plugin": _PLUGIN_SPEC,
    "gfd": _GFD_SPEC,
}
_SHARED_BLOCK_SPEC: dict[str, Spec] = {
    "renameByDefault": bool,
    "failRequestsGreaterThanOne": bool,
    "resources": IGNORED,  # list; checked in _shared_resources
}
_LABELS_SPEC: dict[str, Spec] = {
    "nvidia": bool,
    "amd": bool,
    "amdBeta": bool,
    "firmware": bool,
    "machine": bool,
    "timestamp": bool,
}
_AMD_SPEC: dict[str, Spec] = {
    "resourceNamingStrategy": ("single", "mixed"),
}
_DRA_SPEC: dict[str, Spec] = {
    "vendors": IGNORED,  # list; checked in _dra_vendors
    "dynamicMig": bool,
}
# The keys of one entry of sharing.*.resources (checked in _shared_entry).
SHARED_ENTRY_KEYS = ("devices", "name", "rename", "replicas")
_TOP_SPEC: dict[str, Spec] = {
    "version": ("v1",),
    "flags": _FLAGS_SPEC,
    "resources": IGNORED,  # NVIDIA parses and ignores it too
    "sharing": {"timeSlicing": _SHARED_BLOCK_SPEC, "mps": _SHARED_BLOCK_SPEC, "memory": {"unit": ("GiB", "MiB")}},
    "imex": IGNORED,
    "labeller": {"labels": _LABELS_SPEC, "amd": _AMD_SPEC, "dra": _DRA_SPEC},
}


def _check(value: Any, spec: Spec, path: str) -> None:
    if spec is IGNORED:
        return
    if isinstance(spec, dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: must be a mapping, got {type(value).__name__}")
        for key, sub in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in spec:
                known = ", ".join(sorted(spec))
                raise ConfigError(f"{where}: unknown key (known here: {known})")
            _check(sub, spec[key], where)
    elif isinstance(spec, tuple):
        if value not in spec:
            raise ConfigError(f"{path}: must be one of {', '.join(spec)}, got {value!r}")
    elif spec is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: must be true or false, got {value!r}")
    elif spec is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: must be an integer, got {value!r}")
    elif spec is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: must be a string, got {value!r}")


def _qualified(name: str, path: str, names: ResourceNames) -> str:
    if not name:
        raise ConfigError(f"{path}: must not be empty")
    full = name if "/" in name else f"{names.default_domain}/{name}"
    if len(full) > MAX_RESOURCE_NAME_LENGTH:
        raise ConfigError(f"{path}: resource name {full!r} is longer than {MAX_RESOURCE_NAME_LENGTH} characters")
    if full.count("/") != 1:
        raise ConfigError(f"{path}: resource name {full!r} must be <domain>/<name>")
    return full


# --- sharing -------------------------------------------------------------------------------------
_INDEX = re.compile(r"\d+")
_MIG_INDEX = re.compile(r"\d+:\d+")
_UUID = re.compile(r"(GPU|MIG)-[A-Za-z0-9][A-Za-z0-9/-]*")
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def _device_ref(value: Any, path: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and any(p.fullmatch(value) for p in (_INDEX, _MIG_INDEX, _UUID, _PCI_ADDRESS)):
        return value.lower() if _PCI_ADDRESS.fullmatch(value) else value
    raise ConfigError(f"{path}: {value!r} is not a GPU index (0), a MIG index (0:1), a GPU-/MIG- UUID "
                      "or a PCI address (0000:05:00.1)")


def _device_selector(value: Any, path: str) -> DeviceSelector:
    """NVIDIA's ``devices``: 'all', a positive count, or a non-empty list of device references."""
    if value == "all":
        return DeviceSelector()
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        if value > MAX_DEVICE_REFS:
            raise ConfigError(f"{path}: {value} is more than {MAX_DEVICE_REFS}, the most devices one entry may share")
        return DeviceSelector(count=value)
    if isinstance(value, list) and value:
        if len(value) > MAX_DEVICE_REFS:
            raise ConfigError(f"{path}: {len(value)} entries, more than {MAX_DEVICE_REFS}, the most devices one "
                              "entry may list")
        refs = tuple(_device_ref(v, f"{path}[{i}]") for i, v in enumerate(value))
        seen: set[str] = set()
        for ref in refs:
            if ref in seen:
                raise ConfigError(f"{path}: {ref} is listed twice")
            seen.add(ref)
        return DeviceSelector(refs=refs)
    raise ConfigError(f"{path}: must be 'all', a positive count, or a list of GPU indices or UUIDs, got {value!r}")


def _rename(value: Any, name: str, path: str, names: ResourceNames) -> str:
    """``rename``, qualified with the domain of ``name`` when it has none."""
    if not isinstance(value, str):
        raise ConfigError(f"{path}: must be a string, got {value!r}")
    full = value if "/" in value else f"{name.partition('/')[0]}/{value}"
    full = _qualified(full, path, names)
    if full == name:
        raise ConfigError(f"{path}: {full} is the resource's own name; leave rename out instead")
    if names.advertised_by_a_vendor(full):
        raise ConfigError(f"{path}: {full} is a name the plugin advertises itself; choose another")
    return full


def _shared_entry(entry: Any, where: str, rename_by_default: bool, names: ResourceNames) -> SharedResource:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a mapping with name and replicas")
    unknown = set(entry) - set(SHARED_ENTRY_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key (known here: {', '.join(SHARED_ENTRY_KEYS)})")
    name = entry.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name: required string")
    replicas = entry.get("replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise ConfigError(f"{where}.replicas: required integer, got {replicas!r}")
    if replicas < 2:
        raise ConfigError(f"{where}.replicas: must be at least 2, got {replicas}")
    if replicas > MAX_REPLICAS:
        raise ConfigError(f"{where}.replicas: {replicas} is more than {MAX_REPLICAS}, the most replicas of one device")
    qualified = _qualified(name, f"{where}.name", names)
    rename = _rename(entry["rename"], qualified, f"{where}.rename", names) if "rename" in entry else None
    devices = _device_selector(entry.get("devices", "all"), f"{where}.devices")
    if not devices.all and rename is None and not rename_by_default:
        # One resource holding whole GPUs and replicas: a pod asking for one gets either, and no
        # label can say how many of each there are.
        raise ConfigError(f"{where}.devices: sharing some devices under the resource's own name ({qualified}) "
                          "would mix whole devices and replicas in one resource; add rename, or renameByDefault: true")
    return SharedResource(qualified, replicas, rename, devices, where)


def _shared_resources(block: Mapping[str, Any], path: str, names: ResourceNames) -> tuple[SharedResource, ...]:
    resources = block.get("resources")
    if not isinstance(resources, list) or not resources:
        raise ConfigError(f"{path}.resources: must be a non-empty list")
    if len(resources) > MAX_SHARED_RESOURCES:
        raise ConfigError(f"{path}.resources: {len(resources)} entries, more than {MAX_SHARED_RESOURCES}, the most "
                          "resources one config may share")
    rename_by_default = bool(block.get("renameByDefault", False))
    out: list[SharedResource] = []
    shared_names: set[str] = set()  # the resources listed so far
    registered: set[str] = set()  # every name registered so far: the resources' own and the replicas'
    for i, entry in enumerate(resources):
        where = f"{path}.resources[{i}]"
        shared = _shared_entry(entry, where, rename_by_default, names)
        if shared.name in shared_names:
            raise ConfigError(f"{where}.name: {shared.name} is listed twice")
        advertised = shared.rename or (f"{shared.name}.shared" if rename_by_default else shared.name)
        if advertised != shared.name and (advertised in registered or advertised in shared_names):
            raise ConfigError(f"{where}.rename: {advertised} is already the name of another resource")
        registered |= {shared.name, advertised}
        shared_names.add(shared.name)
        out.append(shared)
    return tuple(out)


def _mps_resources(resources: tuple[SharedResource, ...], mig_strategy: str, names: ResourceNames) -> None:
    """What NVIDIA's plugin refuses for MPS, checked where the config alone decides it."""
    if mig_strategy == "mixed":
        raise ConfigError("sharing.mps: MPS cannot be combined with flags.migStrategy: mixed (NVIDIA's plugin "
                          "refuses it too); use migStrategy none, or sharing.timeSlicing")
    for shared in resources:
        if not names.mps_can_share(shared.name):
            raise ConfigError(f"{shared.where}.name: {shared.name} cannot be shared by MPS: MPS shares "
                              f"{names.mps_shares}")
        if shared.replicas > MPS_MAX_CLIENTS:
            raise ConfigError(f"{shared.where}.replicas: {shared.replicas} is more than the {MPS_MAX_CLIENTS} "
                              "clients an MPS server accepts")


def _memory_sharing(raw: Mapping[str, Any], mig_strategy: str) -> Sharing:
    """``sharing.memory``: alone (one way of sharing per node), and whole GPUs only."""
    others = [key for key in ("timeSlicing", "mps") if raw.get(key) is not None]
    if others:
        raise ConfigError(f"sharing: memory and {others[0]} are both set; a node shares its GPUs one way "
                          f"(by memory: aliyun.com/gpu-mem, or by {others[0]}: replicas); keep one")
    if mig_strategy != "none":
        raise ConfigError(f"sharing.memory: cannot be combined with flags.migStrategy: {mig_strategy}; memory "
                          "sharing offers whole GPUs by their memory (use migStrategy none, or MIG without "
                          "sharing.memory)")
    return Sharing(strategy="memory", memory=MemorySharing(unit=raw["memory"].get("unit", "GiB")))


def _sharing(raw: Mapping[str, Any], mig_strategy: str, names: ResourceNames) -> Sharing:
    if "memory" in raw:
        return _memory_sharing(raw, mig_strategy)
    mps, time_slicing = raw.get("mps"), raw.get("timeSlicing")
    if mps is not None and time_slicing is not None:
        # NVIDIA's plugin then silently uses mps alone: say so instead of ignoring half the file.
        raise ConfigError("sharing: timeSlicing and mps are both set, and only one strategy can be in force "
                          "(NVIDIA's plugin would ignore timeSlicing); keep one")
    block, path, strategy = ((mps, "sharing.mps", "mps") if mps is not None
                             else (time_slicing, "sharing.timeSlicing", "time-slicing"))
    if block is None:
        return Sharing()
    resources = _shared_resources(block, path, names)
    if strategy == "mps":
        _mps_resources(resources, mig_strategy, names)
    # NVIDIA's plugin defaults failRequestsGreaterThanOne to true under MPS: a container's MPS
    # client gets one share of one GPU.
    fail_greater = block.get("failRequestsGreaterThanOne", strategy == "mps")
    return Sharing(
        strategy="mps" if strategy == "mps" else "time-slicing",
        rename_by_default=bool(block.get("renameByDefault", False)),
        fail_requests_greater_than_one=bool(fail_greater),
        resources=resources,
    )


def _plugin_flags(flags: Mapping[str, Any]) -> PluginFlags:
    plugin = flags.get("plugin", {})
    strategies = plugin.get("deviceListStrategy", "envvar")
    if isinstance(strategies, str):
        strategies = [strategies]
    allowed = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
    if not isinstance(strategies, list) or not strategies or any(s not in allowed for s in strategies):
        raise ConfigError(f"flags.plugin.deviceListStrategy: must be one or a list of {', '.join(allowed)}, "
                          f"got {strategies!r}")
    dev_root = flags.get("nvidiaDevRoot") or flags.get("nvidiaDriverRoot") or "/"
    mps_root = flags.get("mpsRoot") or DEFAULT_MPS_ROOT
    if not mps_root.startswith("/"):
        raise ConfigError(f"flags.mpsRoot: must be an absolute path, got {mps_root!r}")
    return PluginFlags(
        device_id_strategy=plugin.get("deviceIDStrategy", "uuid"),
        device_list_strategy=tuple(strategies),
        pass_device_specs=plugin.get("passDeviceSpecs", False),
        cdi_annotation_prefix=plugin.get("cdiAnnotationPrefix", "cdi.k8s.io/"),
        shared_devices_allocation_policy=plugin.get("sharedDevicesAllocationPolicy", "distributed"),
        nvidia_dev_root=dev_root,
        fail_on_init_error=bool(flags.get("failOnInitError", False)),
        mps_root=mps_root.rstrip("/") or "/",
        nvidia_driver_root=flags.get("nvidiaDriverRoot") or "/",
        nvidia_ctk_path=plugin.get("nvidiaCTKPath", "/usr/bin/nvidia-ctk"),
    )


def _gfd_flags(gfd: Mapping[str, Any]) -> GfdFlags:
    interval = gfd.get("sleepInterval")
    seconds = None
    if interval is not None:
        if isinstance(interval, (int, float)) and not isinstance(interval, bool):
            seconds = interval / 1e9  # a bare number is nanoseconds, as GFD reads it
        elif isinstance(interval, str):
            try:
                seconds = go_duration(interval)
            except ValueError:
                pass
        if seconds is None or seconds < MIN_SLEEP_INTERVAL_S:
            raise ConfigError(f"flags.gfd.sleepInterval: must be a duration of at least 10ms such as 60s or 1m30s "
                              f"(a bare number is nanoseconds, as in GFD), got {interval!r}")
    return GfdFlags(oneshot=gfd.get("oneshot", False), sleep_interval_s=seconds,
                    output_file=gfd.get("outputFile") or None,
                    machine_type_file=gfd.get("machineTypeFile") or DEFAULT_MACHINE_TYPE_FILE)


def _timestamp(groups: Mapping[str, Any], gfd: Mapping[str, Any]) -> bool:
    """GFD's noTimestamp: true always drops the timestamp; else labeller.labels.timestamp decides, else
    an explicit noTimestamp: false asks for it (GFD's default); else none."""
    if gfd.get("noTimestamp") is True:
        return False
    if "timestamp" in groups:
        return bool(groups["timestamp"])
    return gfd.get("noTimestamp") is False


def _label_groups(raw: Mapping[str, Any], gfd: Mapping[str, Any]) -> LabelGroups:
    groups = raw.get("labels", {})
    defaults = LabelGroups()
    return LabelGroups(
        nvidia=groups.get("nvidia", defaults.nvidia),
        amd=groups.get("amd", defaults.amd),
        amd_beta=groups.get("amdBeta", defaults.amd_beta),
        firmware=groups.get("firmware", defaults.firmware),
        machine=groups.get("machine", defaults.machine),
        timestamp=_timestamp(groups, gfd),
    )


def _dra_vendors(raw: Mapping[str, Any], names: ResourceNames) -> tuple[str, ...]:
    """``labeller.dra.vendors``: a list of distinct vendors that have a DRA driver (may be empty)."""
    vendors = raw.get("dra", {}).get("vendors", [])
    path = "labeller.dra.vendors"
    known = ", ".join(names.dra_vendors) or "none"
    if not isinstance(vendors, list):
        raise ConfigError(f"{path}: must be a list of vendors (known: {known}), got {vendors!r}")
    for i, vendor in enumerate(vendors):
        if vendor not in names.dra_vendors:
            raise ConfigError(f"{path}[{i}]: {vendor!r} is not a vendor with a DRA driver (known: {known})")
        if vendor in vendors[:i]:
            raise ConfigError(f"{path}[{i}]: {vendor} is listed twice")
    return tuple(vendors)


def parse_config(raw: Any, names: ResourceNames) -> Config:
    """Build a Config from the parsed settings; raise ConfigError naming the first bad key.

    ``raw`` may be a fragment (no ``version``): parse_document checks a whole document. ``names``:
    the registered vendors' resource names (``vendors.RESOURCE_NAMES``)."""
    if raw is None:
        return Config()
    _check(raw, _TOP_SPEC, "")
    flags = raw.get("flags", {})
    mig_strategy = flags.get("migStrategy", "none")
    return Config(
        mig_strategy=mig_strategy,
        sharing=_sharing(raw.get("sharing", {}), mig_strategy, names),
        plugin=_plugin_flags(flags),
        labels=_label_groups(raw.get("labeller", {}), flags.get("gfd", {})),
        gfd=_gfd_flags(flags.get("gfd", {})),
        amd_resource_naming=raw.get("labeller", {}).get("amd", {}).get("resourceNamingStrategy", "single"),
        dra_vendors=_dra_vendors(raw.get("labeller", {}), names),
        dra_dynamic_mig=raw.get("labeller", {}).get("dra", {}).get("dynamicMig", False),
    )


def parse_document(raw: Any, names: ResourceNames, overrides: Overrides = ()) -> Config:
    """A whole config document (a file, a profile's ``config`` section): ``version: v1`` is required.
    ``overrides`` (the upstream flags given: labeller.upstream) are set over it; each key read and not
    honoured is a warning."""
    for line in unhonoured_keys(raw):
        log.warning(line, reason="not-honoured")
    if not isinstance(raw, Mapping):
        got = "an empty document" if raw is None else f"a {type(raw).__name__}"
        raise ConfigError(f"must be a mapping that starts with 'version: v1', got {got}")
    if "version" not in raw:
        raise ConfigError("version: required; add 'version: v1' (the only version)")
    return parse_config(overlay(raw, overrides), names)


def load_config(path: Path | None, names: ResourceNames, overrides: Overrides = ()) -> Config:
    """Read a config file, with ``overrides`` set over it; None gives the defaults (and the overrides)."""
    if path is None:
        return parse_config(overlay(None, overrides), names)
    try:
        raw = read_document(path, "config file")
    except DocumentError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return parse_document(raw, names, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


# --- for people: every key, its kind, default and effect -----------------------------------------
# docs/reference/config.md is generated from config_keys() (docs/gen/reference.py); the schema above says
# which keys exist and what values they take, this table what they do. A key of the schema without a line
# here, or a line for no key, fails tests/core/test_core_config_keys.py, which also checks each default
# against what parse_config makes of a file without the key.

@dataclass(frozen=True)
class _KeyDoc:
    default: str  # as written in a file ("" when there is none: required, or unset)
    doc: str
    kind: str = ""  # for a key the schema does not type (IGNORED): what it takes


_ANY_SHARING = "sharing.{timeSlicing,mps}"
_OWN = "labeller"  # gpu-labeller's section (spelt so, its keys are not taken for module names by the import checks)
_KEY_DOCS: dict[str, _KeyDoc] = {
    "version": _KeyDoc("", "required: a file (or a profile's `config` section) without it is refused"),
    "flags": _KeyDoc("", "NVIDIA's device-plugin and GFD flags"),
    "flags.migStrategy": _KeyDoc("none", "MIG labels and MIG resources: `single` describes MIG devices under the "
                                "`nvidia.com/gpu.*` labels, `mixed` advertises and labels each profile apart"),
    "flags.failOnInitError": _KeyDoc("false", "device plugin: when the driver is not ready at start, exit with 1 (a "
                                    "crash loop, as NVIDIA's plugin) instead of probing again until it is"),
    "flags.nvidiaDriverRoot": _KeyDoc("/", "where CDI specs find the driver's libraries and binaries on the host"),
    "flags.nvidiaDevRoot": _KeyDoc("", "host-path prefix of the device nodes passed with `passDeviceSpecs` and "
                                  "written in CDI specs; unset: `flags.nvidiaDriverRoot`"),
    "flags.mpsRoot": _KeyDoc("/run/nvidia/mps", "host directory (absolute) of the MPS daemons' pipes, logs, shm and "
                            "readiness file"),
    "flags.gdrcopyEnabled": _KeyDoc("false", "NVIDIA's plugin: GDRCopy device nodes in the containers"),
    "flags.gdsEnabled": _KeyDoc("false", "NVIDIA's plugin: GPUDirect Storage (`NVIDIA_GDS=enabled`)"),
    "flags.mofedEnabled": _KeyDoc("false", "NVIDIA's plugin: MOFED in the containers (`NVIDIA_MOFED=enabled`)"),
    "flags.useNodeFeatureAPI": _KeyDoc("false", "GFD: write an NFD NodeFeature object instead of the features file"),
    "flags.deviceDiscoveryStrategy": _KeyDoc("auto", "NVIDIA's plugin: how the GPUs are found"),
    "flags.plugin": _KeyDoc("", "NVIDIA's device-plugin flags"),
    "flags.plugin.passDeviceSpecs": _KeyDoc("false", "pass the `/dev/nvidia*` device nodes (with `envvar` and "
                                           "`volume-mounts`)"),
    "flags.plugin.deviceListStrategy": _KeyDoc("envvar", "how Allocate names the devices to the container runtime",
                                              kind="one or a list of `envvar`, `volume-mounts`, `cdi-annotations`, "
                                                   "`cdi-cri`"),
    "flags.plugin.deviceIDStrategy": _KeyDoc("uuid", "device IDs and `NVIDIA_VISIBLE_DEVICES` values"),
    "flags.plugin.cdiAnnotationPrefix": _KeyDoc("cdi.k8s.io/", "prefix of the CDI annotation key"),
    "flags.plugin.nvidiaCTKPath": _KeyDoc("/usr/bin/nvidia-ctk", "CDI specs add its `update-ldcache` hook when the "
                                         "host has it"),
    "flags.plugin.containerDriverRoot": _KeyDoc("", "NVIDIA's plugin: where the driver's files are in its "
                                                                  "container"),
    "flags.plugin.sharedDevicesAllocationPolicy": _KeyDoc("distributed", "preferred allocation of replicas: spread "
                                                         "over the devices, or packed onto the fewest"),
    "flags.gfd": _KeyDoc("", "GFD's flags, as `run` honours them (read at start; SIGHUP does not change them)"),
    "flags.gfd.oneshot": _KeyDoc("false", "`run`: as `--once` (the flag wins)"),
    "flags.gfd.noTimestamp": _KeyDoc("", "`true` always drops `nvidia.com/gfd.timestamp`; an explicit `false` "
                                    "(GFD's default) writes it unless `labeller.labels.timestamp` is set"),
    "flags.gfd.sleepInterval": _KeyDoc("60s", "`run`: as `--interval` (the flag wins)",
                                      kind="a Go duration (`10s`, `1m30s`; a bare number is nanoseconds, as in GFD), "
                                           "at least 10ms"),
    "flags.gfd.outputFile": _KeyDoc("", "`run`: the path of `--output features-file`, as `--features-file` (the flag "
                                   "wins); unset: `/etc/kubernetes/node-feature-discovery/features.d/gpu-labeller`"),
    "flags.gfd.machineTypeFile": _KeyDoc(DEFAULT_MACHINE_TYPE_FILE, "where `nvidia.com/gpu.machine` is read, under "
                                        "`--host-root`"),
    "resources": _KeyDoc("", "NVIDIA's plugin: resource names of its own", kind="mapping"),
    "sharing": _KeyDoc("", "how the devices are shared: one of `timeSlicing`, `mps`, `memory`, or none"),
    "sharing.timeSlicing": _KeyDoc("", "share each device of the listed resources as `replicas` time-sliced "
                                  "replicas"),
    "sharing.mps": _KeyDoc("", "share by NVIDIA MPS: `nvidia.com/gpu` (and its renames) only, replicas <= "
                          f"{MPS_MAX_CLIENTS}; not beside `timeSlicing`, not with `migStrategy: mixed`"),
    f"{_ANY_SHARING}.renameByDefault": _KeyDoc("false", "register the replicas as `<name>.shared` and drop `-SHARED` "
                                              "from `gpu.product`"),
    f"{_ANY_SHARING}.failRequestsGreaterThanOne": _KeyDoc("false", "reject a container request for more than one "
                                                         "replica; `true` under `mps` unless set, as NVIDIA's"),
    f"{_ANY_SHARING}.resources": _KeyDoc("", f"required: the resources to share, at most {MAX_SHARED_RESOURCES}",
                                        kind="list of mappings"),
    f"{_ANY_SHARING}.resources[].name": _KeyDoc("", "required: `nvidia.com/gpu`, `nvidia.com/mig-<profile>`, "
                                               "`amd.com/gpu`; a bare name means `nvidia.com/<name>`", kind="string"),
    f"{_ANY_SHARING}.resources[].replicas": _KeyDoc("", f"required: replicas of each device, 2 to {MAX_REPLICAS} "
                                                   f"({MPS_MAX_CLIENTS} under `mps`)", kind="integer"),
    f"{_ANY_SHARING}.resources[].devices": _KeyDoc("all", "which devices are replicated: a count takes the first N "
                                                  "by index; the rest stay whole under the plain name. Needs `rename` "
                                                  "or `renameByDefault`",
                                                  kind="`all`, a positive count, or a list of GPU indices (`0`), MIG "
                                                       "indices (`0:1`), GPU-/MIG- UUIDs, AMD PCI addresses"),
    f"{_ANY_SHARING}.resources[].rename": _KeyDoc("", "the name the replicas are registered under (a bare name takes "
                                                 "the resource's domain); never a name the plugin advertises itself; "
                                                 "unset: `<name>.shared` with `renameByDefault`, else the name",
                                                 kind="string"),
    "sharing.memory": _KeyDoc("", "share whole NVIDIA GPUs by memory, as gpushare: `aliyun.com/gpu-mem` (one device "
                             "per unit of each GPU's memory) and `aliyun.com/gpu-count` instead of `nvidia.com/gpu`; "
                             "alone, and not with `migStrategy` `single` or `mixed`"),
    "sharing.memory.unit": _KeyDoc("GiB", "the memory one `aliyun.com/gpu-mem` device stands for"),
    "imex": _KeyDoc("", "NVIDIA's plugin: IMEX channels in the containers", kind="mapping"),
    _OWN: _KeyDoc("", "gpu-labeller's own settings"),
    f"{_OWN}.labels": _KeyDoc("", "the label groups"),
    f"{_OWN}.labels.nvidia": _KeyDoc("true", "NVIDIA's labels, GFD's keys (`nvidia.com/gpu.*`, `cuda.*`, `mig.*`, "
                                     "...) and `nvidia.com/gpu.present`"),
    f"{_OWN}.labels.amd": _KeyDoc("true", "AMD's new-style labels (`amd.com/gpu.*`)"),
    f"{_OWN}.labels.amdBeta": _KeyDoc("true", "AMD's beta-style labels (`beta.amd.com/gpu.*`)"),
    f"{_OWN}.labels.firmware": _KeyDoc("false", "AMD's firmware labels (`beta.amd.com/gpu.firmware.*`), read from "
                                       "debugfs"),
    f"{_OWN}.labels.machine": _KeyDoc("true", "`nvidia.com/gpu.machine`"),
    f"{_OWN}.labels.timestamp": _KeyDoc("false", "`nvidia.com/gfd.timestamp` (off: a changing value would make every "
                                        "restart a write)"),
    f"{_OWN}.amd": _KeyDoc("", "AMD's device-plugin settings"),
    f"{_OWN}.amd.resourceNamingStrategy": _KeyDoc("single", "AMD's plugin's `-resource_naming_strategy`: `mixed` "
                                                  "advertises partitions as `amd.com/<compute>_<memory>`"),
    f"{_OWN}.dra": _KeyDoc("", "Dynamic Resource Allocation"),
    f"{_OWN}.dra.vendors": _KeyDoc("[]", "the vendors whose GPUs this node serves through DRA (the DRA plugin's "
                                   "ResourceSlices) instead of the device plugin's extended resources",
                                   kind="list of vendors with a DRA driver (`nvidia`, `amd`)"),
    f"{_OWN}.dra.dynamicMig": _KeyDoc("false", "publish each MIG-enabled NVIDIA GPU as counters and one device per "
                                      "MIG profile and placement, the MIG device made at prepare and destroyed at "
                                      "unprepare (NVIDIA's DynamicMIG); each AMD GPU that can switch its compute "
                                      "partition as one device per partition of every mode, the mode switched at "
                                      "prepare. Needs Kubernetes' DRAPartitionableDevices; without it, the devices "
                                      "that exist"),
}


@dataclass(frozen=True)
class ConfigKey:
    """One key of the config file, for people: ``path`` dotted (``{a,b}`` where two blocks take the same
    keys, ``[]`` for each entry of a list), ``kind`` what it takes, ``allowed`` its values when they are a fixed
    set, ``default`` as written in a file ("" when none), ``not_honoured`` why gpu-labeller reads it and does
    not act on it ("" when it does)."""

    path: str
    kind: str
    allowed: tuple[str, ...]
    default: str
    doc: str
    not_honoured: str = ""


def _kind(spec: Spec) -> str:
    if isinstance(spec, dict):
        return "mapping"
    if isinstance(spec, tuple):
        return "one of " + ", ".join(f"`{value}`" for value in spec)
    return {bool: "bool", int: "integer", str: "string"}.get(spec, "")


_LIST_ENTRIES = {f"{_ANY_SHARING}.resources": SHARED_ENTRY_KEYS}  # lists of mappings the schema leaves to code


def _schema_paths(spec: dict[str, Spec], prefix: str) -> list[tuple[str, Spec]]:
    """The dotted paths of ``spec`` in its order, each block before its keys; sibling blocks that take the same
    keys (one spec) have them listed once, under ``{a,b}``, after the last of them."""
    out: list[tuple[str, Spec]] = []
    for key, sub in spec.items():
        path = f"{prefix}{key}"
        out.append((path, sub))
        out += [(f"{path}[].{name}", IGNORED) for name in _LIST_ENTRIES.get(path, ())]
        twins = [k for k, s in spec.items() if s is sub]
        if isinstance(sub, dict) and key == twins[-1]:
            block = f"{prefix}{{{','.join(twins)}}}" if len(twins) > 1 else path
            out += _schema_paths(sub, f"{block}.")
    return out


def config_keys() -> list[ConfigKey]:
    """Every key a config file may hold, in file order: the generator of docs/reference/config.md reads this
    (and only this), so that a new schema can stand behind it."""
    from labeller.upstream import NOTHING, UNHONOURED_KEYS

    keys = []
    for path, spec in _schema_paths(_TOP_SPEC, ""):
        doc = _KEY_DOCS[path]
        unhonoured = UNHONOURED_KEYS.get(path)
        why = ""
        if unhonoured is not None:
            neutral, reason = unhonoured
            why = reason if neutral is NOTHING else f"any value but `{str(neutral).lower()}`: {reason}"
        keys.append(ConfigKey(path, doc.kind or _kind(spec), spec if isinstance(spec, tuple) else (), doc.default,
                              doc.doc, why))
    return keys
