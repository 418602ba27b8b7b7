"""The configuration file: NVIDIA device-plugin config v1, plus gpu-labeller's own section.

One ConfigMap serves the labels and the device plugin, and users coming from NVIDIA's plugin can
bring theirs unchanged: ``flags`` and ``sharing`` are read in NVIDIA's format (keys NVIDIA accepts
but that do not matter here are accepted and ignored). ``sharing.*.resources[].devices`` and
``rename`` are served as NVIDIA's device map code defines them (NVIDIA's released plugin ignores
them with a warning). gpu-labeller's own settings live under ``labeller``. Every problem is
reported as one line naming the key.

Each key is declared once, in the config table (``labeller.model.configtable``): the core's here (``CORE``,
and the ``setting`` fields of the classes below), each vendor's in its package (``Vendor.settings``).
The check of a file, the defaults, the upstream flags that set keys and docs/reference/config.md
come from those declarations; what a key means beyond its own value (sharing's rules across keys)
is the code below.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from labeller.model.configtable import ANY, BLOCK, NOTHING, Key, Section, Table, build, key_of, setting, value_at
from labeller.model.configtable import ConfigError as ConfigError  # what parsing raises, for every reader of a config
from labeller.model.documents import DocumentError, read_document
from labeller.model.upstream import (DEVICE_PLUGIN, NO_CONTAINER_ROOT, NOT_DISCOVERY, RUN_AND_LABELS, UNKEYED_FLAGS,
                                     KeyFlag, Overrides, UpstreamFlag, go_duration, overlay)
from labeller.base.log import get_logger

log = get_logger(__name__)
T = TypeVar("T")

MigStrategy = Literal["none", "single", "mixed"]
SharingStrategy = Literal["none", "time-slicing", "mps", "memory"]
MemoryUnit = Literal["GiB", "MiB"]

MAX_RESOURCE_NAME_LENGTH = 63
# Clients one MPS server accepts from Volta on (16 before): more replicas could never all run.
MPS_MAX_CLIENTS = 48
# Bounds NVIDIA's plugin does not set (it only wants replicas >= 1), so that checking a config stays
# fast and bounded whatever it says; the offer's own bound is labeller.model.offer.MAX_DEVICES_PER_RESOURCE.
MAX_REPLICAS = 1024  # replicas of one device
MAX_DEVICE_REFS = 1024  # devices one sharing entry may list or count; a node has at most a few hundred
MAX_SHARED_RESOURCES = 256  # entries under resources: every MIG profile and partition of every vendor fits
DEFAULT_MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"
MIN_SLEEP_INTERVAL_S = 0.01  # as run's --interval
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")


@dataclass(frozen=True)
class ResourceNames:
    """What parsing must know of the registered vendors: their resource names (the vendors' facts,
    ``labeller.model.vendor.resource_names``) and the config keys they declare; handed in by the commands
    as ``vendors.RESOURCE_NAMES``."""

    default_domain: str  # a short name in the sharing config: "gpu" is "<default_domain>/gpu"
    own: tuple[re.Pattern[str], ...]  # names a vendor registers itself: a rename must not take one
    mps_shareable: tuple[re.Pattern[str], ...]  # the resource names MPS can share
    mps_shares: str  # the same, for people: "whole NVIDIA GPUs (nvidia.com/gpu)"
    dra_vendors: tuple[str, ...] = ()  # the vendors with a DRA driver: what labeller.dra.vendors may name
    settings: tuple[Section, ...] = ()  # the vendors' config keys (Vendor.settings)

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

    def advertised_name(self, rename_by_default: bool) -> str:
        """The name its replicas are registered under: ``rename``, else ``<name>.shared`` under
        renameByDefault, else the name itself."""
        if self.rename is not None:
            return self.rename
        return f"{self.name}.shared" if rename_by_default else self.name


_BLOCKS = "sharing.{timeSlicing,mps}"
_OWN = "labeller"  # gpu-labeller's section (spelt so, its keys are not taken for module names by the import checks)


@dataclass(frozen=True)
class MemorySharing:
    """``sharing.memory``: whole NVIDIA GPUs offered by memory (gpushare's ``aliyun.com/gpu-mem``, one
    device per ``unit`` of each GPU's memory, and ``aliyun.com/gpu-count``) instead of ``nvidia.com/gpu``."""

    unit: MemoryUnit = setting("sharing.memory.unit", "GiB", "the memory one `aliyun.com/gpu-mem` device stands for")

    @property
    def unit_bytes(self) -> int:
        return 1 << (30 if self.unit == "GiB" else 20)


@dataclass(frozen=True)
class Sharing:
    strategy: SharingStrategy = "none"
    rename_by_default: bool = setting(f"{_BLOCKS}.renameByDefault", False, "register the replicas as `<name>.shared` "
                                      "and drop `-SHARED` from `gpu.product`")
    fail_requests_greater_than_one: bool = setting(
        f"{_BLOCKS}.failRequestsGreaterThanOne", False,
        "reject a container request for more than one replica; `true` under `mps` unless set, as NVIDIA's")
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
        """The name the replicas of ``resource`` are registered under (the resource's own when not shared)."""
        shared = self.entry(resource)
        return shared.advertised_name(self.rename_by_default) if shared is not None else resource


def _absolute(value: str, path: str) -> str:
    if not value.startswith("/"):
        raise ConfigError(f"{path}: must be an absolute path, got {value!r}")
    return value.rstrip("/") or "/"


def _device_list_strategy(value: Any, path: str) -> tuple[str, ...]:
    strategies = [value] if isinstance(value, str) else value
    if not isinstance(strategies, list) or not strategies or any(s not in DEVICE_LIST_STRATEGIES for s in strategies):
        raise ConfigError(f"{path}: must be one or a list of {', '.join(DEVICE_LIST_STRATEGIES)}, got {strategies!r}")
    return tuple(strategies)


@dataclass(frozen=True)
class PluginFlags:
    """The device plugin's flags that every vendor's plugin reads."""

    device_list_strategy: tuple[str, ...] = setting(
        "flags.plugin.deviceListStrategy", ("envvar",), "how Allocate names the devices to the container runtime",
        kind="one or a list of " + ", ".join(f"`{s}`" for s in DEVICE_LIST_STRATEGIES), shown="envvar",
        check=_device_list_strategy, flag_kind="list",
        flags=(KeyFlag("plugin", ("--device-list-strategy",), ("DEVICE_LIST_STRATEGY",), DEVICE_PLUGIN),))
    cdi_annotation_prefix: str = setting(
        "flags.plugin.cdiAnnotationPrefix", "cdi.k8s.io/", "prefix of the CDI annotation key",
        flags=(KeyFlag("plugin", ("--cdi-annotation-prefix",), ("CDI_ANNOTATION_PREFIX",), DEVICE_PLUGIN),))
    shared_devices_allocation_policy: Literal["distributed", "packed"] = setting(
        "flags.plugin.sharedDevicesAllocationPolicy", "distributed",
        "preferred allocation of replicas: spread over the devices, or packed onto the fewest",
        flags=(KeyFlag("plugin", ("--shared-devices-allocation-policy",), ("SHARED_DEVICES_ALLOCATION_POLICY",),
                       DEVICE_PLUGIN),))
    fail_on_init_error: bool = setting(
        "flags.failOnInitError", False, "device plugin: when the driver is not ready at start, exit with 1 (a crash "
        "loop, as NVIDIA's plugin) instead of probing again until it is",
        flags=(KeyFlag("plugin", ("--fail-on-init-error",), ("FAIL_ON_INIT_ERROR",), DEVICE_PLUGIN,
                       note="the default is false here (true in NVIDIA's plugin): the plugin waits for the driver"),))
    mps_root: str = setting(
        "flags.mpsRoot", "/run/nvidia/mps", "host directory (absolute) of the MPS daemons' pipes, logs, shm and "
        "readiness file", check=_absolute, blank_is_unset=True,
        flags=(KeyFlag("plugin", ("--mps-root",), ("MPS_ROOT",), DEVICE_PLUGIN),))


def _sleep_interval(interval: Any, path: str) -> float | None:
    """GFD's sleepInterval in seconds: a Go duration, or a bare number of nanoseconds."""
    if interval is None:
        return None
    seconds = None
    if isinstance(interval, (int, float)) and not isinstance(interval, bool):
        seconds = interval / 1e9  # a bare number is nanoseconds, as GFD reads it
    elif isinstance(interval, str):
        try:
            seconds = go_duration(interval)
        except ValueError:
            pass
    if seconds is None or seconds < MIN_SLEEP_INTERVAL_S:
        raise ConfigError(f"{path}: must be a duration of at least 10ms such as 60s or 1m30s "
                          f"(a bare number is nanoseconds, as in GFD), got {interval!r}")
    return seconds


@dataclass(frozen=True)
class GfdFlags:
    """``flags.gfd``, GFD's settings, as ``run`` honours them."""

    oneshot: bool = setting("flags.gfd.oneshot", False, "`run`: as `--once` (the flag wins)",
                            flags=(KeyFlag("gfd", ("--oneshot",), ("GFD_ONESHOT",)),))
    sleep_interval_s: float | None = setting(
        "flags.gfd.sleepInterval", None, "`run`: as `--interval` (the flag wins)", shown="60s",
        kind="a Go duration (`10s`, `1m30s`; a bare number is nanoseconds, as in GFD), at least 10ms",
        check=_sleep_interval, flag_kind="duration",
        flags=(KeyFlag("gfd", ("--sleep-interval",), ("GFD_SLEEP_INTERVAL",)),))
    output_file: str | None = setting(
        "flags.gfd.outputFile", None, "`run`: the path of `--output features-file`, as `--features-file` (the flag "
        "wins; with another `--output`, a warning); unset: "
        "`/etc/kubernetes/node-feature-discovery/features.d/gpu-labeller`", takes=str, blank_is_unset=True,
        flags=(KeyFlag("gfd", ("--output-file", "-o"), ("GFD_OUTPUT_FILE",),
                       note="GFD's alias --output is gpu-labeller's --output (where the labels go)"),))
    machine_type_file: str = setting(
        "flags.gfd.machineTypeFile", DEFAULT_MACHINE_TYPE_FILE, "where `nvidia.com/gpu.machine` is read, under "
        "`--host-root`", blank_is_unset=True,
        flags=(KeyFlag("gfd", ("--machine-type-file",), ("GFD_MACHINE_TYPE_FILE",), RUN_AND_LABELS),))


@dataclass(frozen=True)
class Config:
    mig_strategy: MigStrategy = setting(
        "flags.migStrategy", "none", "MIG labels and MIG resources: `single` describes MIG devices under the "
        "`nvidia.com/gpu.*` labels, `mixed` advertises and labels each profile apart",
        flags=(KeyFlag("gfd", ("--mig-strategy",), ("GFD_MIG_STRATEGY", "MIG_STRATEGY"), RUN_AND_LABELS),
               KeyFlag("plugin", ("--mig-strategy",), ("MIG_STRATEGY",), (*DEVICE_PLUGIN, "resources"))))
    sharing: Sharing = field(default_factory=Sharing)
    plugin: PluginFlags = field(default_factory=PluginFlags)
    gfd: GfdFlags = field(default_factory=GfdFlags)
    # the vendors whose GPUs this node serves through DRA instead of the device plugin (checked by _dra_vendors)
    dra_vendors: tuple[str, ...] = setting(
        "labeller.dra.vendors", (), "the vendors whose GPUs this node serves through DRA (the DRA plugin's "
        "ResourceSlices) instead of the device plugin's extended resources",
        kind="list of vendors with a DRA driver (`nvidia`, `amd`)")
    dra_dynamic_mig: bool = setting(
        "labeller.dra.dynamicMig", False, "publish each MIG-enabled NVIDIA GPU as counters and one device per MIG "
        "profile and placement, the MIG device made at prepare and destroyed at unprepare (NVIDIA's DynamicMIG); each "
        "AMD GPU that can switch its compute partition as one device per partition of every mode, the mode switched "
        "at prepare. Needs Kubernetes' DRAPartitionableDevices; without it, the devices that exist")
    # the vendors' settings (Vendor.settings) that differ from their defaults: config.section(cls) reads one
    sections: tuple[object, ...] = ()

    def served_by_dra(self, vendor: str) -> bool:
        return vendor in self.dra_vendors

    def section(self, settings: type[T]) -> T:
        """A vendor's settings (its ``Vendor.settings`` class): as the file gives them, else their defaults."""
        found = next((each for each in self.sections if isinstance(each, settings)), None)
        return found if found is not None else _defaults(settings)

    def with_section(self, settings: object) -> Config:
        """This config with a vendor's settings replaced (held only where they are not all defaults, so that equal
        configs compare equal however they were made)."""
        others = tuple(each for each in self.sections if type(each) is not type(settings))
        return dataclasses.replace(self, sections=others if settings == _defaults(type(settings)) else
                                   (*others, settings))


_DEFAULTS: dict[type, Any] = {}  # each vendor's settings as a file without its keys gives them (frozen: shared)


def _defaults(settings: type[T]) -> T:
    found: T = _DEFAULTS.get(settings) or _DEFAULTS.setdefault(settings, settings())
    return found


# The core's keys that have no field: the blocks, the entries of the sharing lists (read by
# _shared_entry), and NVIDIA's keys that gpu-labeller reads and does not honour.
CORE_KEYS: tuple[Key, ...] = (
    Key("version", "required: a file (or a profile's `config` section) without it is refused", ("v1",)),
    Key("flags", "NVIDIA's device-plugin and GFD flags", BLOCK),
    Key("flags.gdrcopyEnabled", "NVIDIA's plugin: GDRCopy device nodes in the containers", bool, default=False,
        not_honoured=(False, "containers get no GDRCopy device nodes")),
    Key("flags.gdsEnabled", "NVIDIA's plugin: GPUDirect Storage (`NVIDIA_GDS=enabled`)", bool, default=False,
        not_honoured=(False, "containers get no NVIDIA_GDS=enabled")),
    Key("flags.mofedEnabled", "NVIDIA's plugin: MOFED in the containers (`NVIDIA_MOFED=enabled`)", bool,
        default=False, not_honoured=(False, "containers get no NVIDIA_MOFED=enabled")),
    Key("flags.useNodeFeatureAPI", "GFD: write an NFD NodeFeature object instead of the features file", bool,
        default=False, not_honoured=(False, "give run --output nodefeature")),
    Key("flags.deviceDiscoveryStrategy", "NVIDIA's plugin: how the GPUs are found", ("auto", "nvml", "tegra", "vfio"),
        default="auto", not_honoured=("auto", NOT_DISCOVERY)),
    Key("flags.plugin", "NVIDIA's device-plugin flags", BLOCK),
    Key("flags.plugin.containerDriverRoot", "NVIDIA's plugin: where the driver's files are in its container", str,
        not_honoured=(NOTHING, NO_CONTAINER_ROOT)),
    Key("flags.gfd", "GFD's flags, as `run` honours them (read at start; SIGHUP does not change them)", BLOCK),
    Key("resources", "NVIDIA's plugin: resource names of its own", ANY, kind="mapping",
        not_honoured=(NOTHING, "resource names come from the vendors and the sharing config (NVIDIA's plugin "
                               "ignores this section too)")),
    Key("sharing", "how the devices are shared: one of `timeSlicing`, `mps`, `memory`, or none", BLOCK),
    Key("sharing.timeSlicing", "share each device of the listed resources as `replicas` time-sliced replicas", BLOCK),
    Key("sharing.mps", "share by NVIDIA MPS: `nvidia.com/gpu` (and its renames) only, replicas <= "
        f"{MPS_MAX_CLIENTS}; not beside `timeSlicing` (NVIDIA's plugin would silently ignore `timeSlicing`), not with "
        "`migStrategy: mixed`", BLOCK),
    Key(f"{_BLOCKS}.resources", f"required: the resources to share, at most {MAX_SHARED_RESOURCES}", ANY,
        kind="list of mappings"),
    Key(f"{_BLOCKS}.resources[].name", "required: `nvidia.com/gpu`, `nvidia.com/mig-<profile>`, `amd.com/gpu`; a "
        "bare name means `nvidia.com/<name>`", ANY, kind="string"),
    Key(f"{_BLOCKS}.resources[].replicas", f"required: replicas of each device, 2 to {MAX_REPLICAS} "
        f"({MPS_MAX_CLIENTS} under `mps`)", ANY, kind="integer"),
    Key(f"{_BLOCKS}.resources[].devices", "which devices are replicated: a count takes the first N by index; the rest "
        "stay whole under the plain name. Needs `rename` or `renameByDefault`. A device the node lacks is one line "
        "naming it: exit 2 (`labels`, `resources`), a failed probe (`run`), not served (`device-plugin`)", ANY,
        shown="all",
        kind="`all`, a positive count, or a list of GPU indices (`0`), MIG indices (`0:1`), GPU-/MIG- UUIDs, AMD PCI "
             "addresses"),
    Key(f"{_BLOCKS}.resources[].rename", "the name the replicas are registered under (a bare name takes the "
        "resource's domain); never a name the plugin advertises itself, nor another entry's; unset: `<name>.shared` "
        "with `renameByDefault`, else the name", ANY, kind="string"),
    Key("sharing.memory", "share whole NVIDIA GPUs by memory, as gpushare: `aliyun.com/gpu-mem` (one device per unit "
        "of each GPU's memory) and `aliyun.com/gpu-count` instead of `nvidia.com/gpu`; alone, and not with "
        "`migStrategy` `single` or `mixed`", BLOCK),
    Key("imex", "NVIDIA's plugin: IMEX channels in the containers", ANY, kind="mapping",
        not_honoured=(NOTHING, "containers get no IMEX channels")),
    Key(_OWN, "gpu-labeller's own settings", BLOCK),
    Key(f"{_OWN}.labels", "the label groups, each vendor's", BLOCK),
    Key(f"{_OWN}.dra", "Dynamic Resource Allocation", BLOCK),
)
CORE = Section(keys=CORE_KEYS)
_CORE_SETTINGS = (Section(Config), Section(PluginFlags), Section(GfdFlags), Section(Sharing), Section(MemorySharing))


@functools.lru_cache(maxsize=8)
def config_table(names: ResourceNames) -> Table:
    """Every key of the config file: the core's and those of the vendors ``names`` holds."""
    return Table((CORE, *_CORE_SETTINGS, *names.settings))


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
    known = config_table(names).entries(f"{_BLOCKS}.resources")
    unknown = set(entry) - set(known)
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key (known here: {', '.join(known)})")
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
    rename_by_default = bool(block.get("renameByDefault", Sharing.rename_by_default))
    out: list[SharedResource] = []
    shared_names: set[str] = set()  # the resources listed so far
    registered: set[str] = set()  # every name registered so far: the resources' own and the replicas'
    for i, entry in enumerate(resources):
        where = f"{path}.resources[{i}]"
        shared = _shared_entry(entry, where, rename_by_default, names)
        if shared.name in shared_names:
            raise ConfigError(f"{where}.name: {shared.name} is listed twice")
        advertised = shared.advertised_name(rename_by_default)
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


def _memory_sharing(document: Mapping[str, Any], mig_strategy: str) -> Sharing:
    """``sharing.memory``: alone (one way of sharing per node), and whole GPUs only."""
    raw = document["sharing"]
    others = [key for key in ("timeSlicing", "mps") if raw.get(key) is not None]
    if others:
        raise ConfigError(f"sharing: memory and {others[0]} are both set; a node shares its GPUs one way "
                          f"(by memory: aliyun.com/gpu-mem, or by {others[0]}: replicas); keep one")
    if mig_strategy != "none":
        raise ConfigError(f"sharing.memory: cannot be combined with flags.migStrategy: {mig_strategy}; memory "
                          "sharing offers whole GPUs by their memory (use migStrategy none, or MIG without "
                          "sharing.memory)")
    return Sharing(strategy="memory", memory=build(MemorySharing, document))


def _sharing(document: Mapping[str, Any], mig_strategy: str, names: ResourceNames) -> Sharing:
    raw = document.get("sharing", {})
    if "memory" in raw:
        return _memory_sharing(document, mig_strategy)
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
        rename_by_default=bool(block.get("renameByDefault", Sharing.rename_by_default)),
        fail_requests_greater_than_one=bool(fail_greater),
        resources=resources,
    )


def _dra_vendors(document: Mapping[str, Any], names: ResourceNames) -> tuple[str, ...]:
    """``labeller.dra.vendors``: a list of distinct vendors that have a DRA driver (may be empty)."""
    path = key_of(Config, "dra_vendors").path
    vendors = value_at(document, path, [])
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
    the registered vendors' resource names and keys (``vendors.RESOURCE_NAMES``)."""
    if raw is None:
        return Config()
    config_table(names).check(raw)
    mig_strategy = key_of(Config, "mig_strategy").value(raw)
    config = Config(
        mig_strategy=mig_strategy,
        sharing=_sharing(raw, mig_strategy, names),
        plugin=build(PluginFlags, raw),
        gfd=build(GfdFlags, raw),
        dra_vendors=_dra_vendors(raw, names),
        dra_dynamic_mig=key_of(Config, "dra_dynamic_mig").value(raw),
    )
    for section in names.settings:
        if section.settings is not None:
            config = config.with_section(build(section.settings, raw))
    return config


def parse_document(raw: Any, names: ResourceNames, overrides: Overrides = ()) -> Config:
    """A whole config document (a file, a profile's ``config`` section): ``version: v1`` is required.
    ``overrides`` (the upstream flags given: labeller.model.upstream) are set over it; each key read and not
    honoured is a warning."""
    for line in config_table(names).warnings(raw):
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


def upstream_flags(names: ResourceNames) -> tuple[UpstreamFlag, ...]:
    """Every upstream flag and env var gpu-labeller takes: those that set a key (declared with it), then the others."""
    return (*config_table(names).flags(), *UNKEYED_FLAGS)


# --- for people: every key, its kind, default and effect -----------------------------------------

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


def config_keys(names: ResourceNames) -> list[ConfigKey]:
    """Every key a config file may hold, in file order: docs/reference/config.md is generated from this."""
    keys = []
    for key in config_table(names).keys:
        why = ""
        if key.not_honoured is not None:
            neutral, reason = key.not_honoured
            why = reason if neutral is NOTHING else f"any value but `{str(neutral).lower()}`: {reason}"
        keys.append(ConfigKey(key.path, key.kind_text, key.takes if isinstance(key.takes, tuple) else (),
                              key.shown_default, key.doc, why))
    return keys
