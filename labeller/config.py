"""The configuration file: NVIDIA device-plugin config v1, plus gpu-labeller's own section.

One ConfigMap serves the labels and the device plugin, and users coming from NVIDIA's plugin can
bring theirs unchanged: ``flags`` and ``sharing`` are read in NVIDIA's format (keys NVIDIA accepts
but that do not matter here are accepted and ignored; ``sharing.mps`` is refused until MPS is
served). gpu-labeller's own settings live under ``labeller``. Every problem is reported as one line
naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from labeller.documents import DocumentError, read_document

MigStrategy = Literal["none", "single", "mixed"]
SharingStrategy = Literal["none", "time-slicing", "mps"]

MAX_RESOURCE_NAME_LENGTH = 63


class ConfigError(ValueError):
    """A configuration problem, with a message that names the offending key."""


@dataclass(frozen=True)
class SharedResource:
    name: str  # fully qualified: "nvidia.com/gpu", "amd.com/gpu"
    replicas: int


@dataclass(frozen=True)
class Sharing:
    strategy: SharingStrategy = "none"
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[SharedResource, ...] = ()

    def replicas_for(self, resource: str) -> int:
        """How many replicas each device of ``resource`` is advertised as (1 = not shared)."""
        for shared in self.resources:
            if shared.name == resource:
                return shared.replicas
        return 1

    def advertised_name(self, resource: str) -> str:
        """The resource name the plugin registers: ``<name>.shared`` under renameByDefault."""
        if self.rename_by_default and self.replicas_for(resource) > 1:
            return f"{resource}.shared"
        return resource


@dataclass(frozen=True)
class PluginFlags:
    device_id_strategy: Literal["uuid", "index"] = "uuid"
    device_list_strategy: tuple[str, ...] = ("envvar",)
    pass_device_specs: bool = False
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    shared_devices_allocation_policy: Literal["distributed", "packed"] = "distributed"
    nvidia_dev_root: str = "/"
    fail_on_init_error: bool = False  # flags.failOnInitError: exit instead of waiting for the driver


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


@dataclass(frozen=True)
class Config:
    mig_strategy: MigStrategy = "none"
    sharing: Sharing = field(default_factory=Sharing)
    plugin: PluginFlags = field(default_factory=PluginFlags)
    labels: LabelGroups = field(default_factory=LabelGroups)


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
    "sleepInterval": IGNORED,
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
_TOP_SPEC: dict[str, Spec] = {
    "version": ("v1",),
    "flags": _FLAGS_SPEC,
    "resources": IGNORED,  # NVIDIA parses and ignores it too
    "sharing": {"timeSlicing": _SHARED_BLOCK_SPEC, "mps": _SHARED_BLOCK_SPEC},
    "imex": IGNORED,
    "labeller": {"labels": _LABELS_SPEC},
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


def _qualified(name: str, path: str) -> str:
    if not name:
        raise ConfigError(f"{path}: must not be empty")
    full = name if "/" in name else f"nvidia.com/{name}"
    if len(full) > MAX_RESOURCE_NAME_LENGTH:
        raise ConfigError(f"{path}: resource name {full!r} is longer than {MAX_RESOURCE_NAME_LENGTH} characters")
    if full.count("/") != 1:
        raise ConfigError(f"{path}: resource name {full!r} must be <domain>/<name>")
    return full


def _only_all_devices(value: Any, path: str) -> None:
    """``devices`` other than ``all`` is refused: replicating every device instead of the listed
    ones would advertise what the config says is not shared."""
    if value == "all":
        return
    if (isinstance(value, int) and not isinstance(value, bool) and value > 0) or (
            isinstance(value, list) and value and all(isinstance(v, (str, int)) for v in value)):
        raise ConfigError(f"{path}: sharing a subset of a resource's devices is not served yet; "
                          "use 'all' (every device of the resource is shared)")
    raise ConfigError(f"{path}: must be 'all', a positive count, or a list of GPU indices or UUIDs, got {value!r}")


def _shared_resources(block: Mapping[str, Any], path: str) -> tuple[SharedResource, ...]:
    resources = block.get("resources")
    if not isinstance(resources, list) or not resources:
        raise ConfigError(f"{path}.resources: must be a non-empty list")
    out: list[SharedResource] = []
    for i, entry in enumerate(resources):
        where = f"{path}.resources[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: must be a mapping with name and replicas")
        unknown = set(entry) - {"name", "replicas", "rename", "devices"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key (known here: devices, name, rename, replicas)")
        name = entry.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"{where}.name: required string")
        replicas = entry.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise ConfigError(f"{where}.replicas: required integer, got {replicas!r}")
        if replicas < 2:
            raise ConfigError(f"{where}.replicas: must be at least 2, got {replicas}")
        qualified = _qualified(name, f"{where}.name")
        if any(r.name == qualified for r in out):
            raise ConfigError(f"{where}.name: {qualified} is listed twice")
        _only_all_devices(entry.get("devices", "all"), f"{where}.devices")
        if "rename" in entry:
            raise ConfigError(f"{where}.rename: not served yet; renameByDefault: true registers <name>.shared")
        out.append(SharedResource(qualified, replicas))
    return tuple(out)


def _sharing(raw: Mapping[str, Any]) -> Sharing:
    if raw.get("mps") is not None:
        # The labels must never claim what the plugin does not serve, and the plugin runs no MPS
        # control daemon yet: refuse rather than label MPS and hand out time-sliced replicas.
        raise ConfigError("sharing.mps: MPS is not served yet (the device plugin runs no MPS control daemon); "
                          "use sharing.timeSlicing to share GPUs")
    block = raw.get("timeSlicing")
    if block is None:
        return Sharing()
    return Sharing(
        strategy="time-slicing",
        rename_by_default=bool(block.get("renameByDefault", False)),
        fail_requests_greater_than_one=bool(block.get("failRequestsGreaterThanOne", False)),
        resources=_shared_resources(block, "sharing.timeSlicing"),
    )


def _plugin_flags(flags: Mapping[str, Any]) -> PluginFlags:
    plugin = flags.get("plugin", {})
    strategies = plugin.get("deviceListStrategy", "envvar")
    if isinstance(strategies, str):
        strategies = [strategies]
    allowed = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
    if not isinstance(strategies, list) or not strategies or any(s not in allowed for s in strategies):
        raise ConfigError(f"flags.plugin.deviceListStrategy: must be one or a list of {', '.join(allowed)}, got {strategies!r}")
    dev_root = flags.get("nvidiaDevRoot") or flags.get("nvidiaDriverRoot") or "/"
    return PluginFlags(
        device_id_strategy=plugin.get("deviceIDStrategy", "uuid"),
        device_list_strategy=tuple(strategies),
        pass_device_specs=plugin.get("passDeviceSpecs", False),
        cdi_annotation_prefix=plugin.get("cdiAnnotationPrefix", "cdi.k8s.io/"),
        shared_devices_allocation_policy=plugin.get("sharedDevicesAllocationPolicy", "distributed"),
        nvidia_dev_root=dev_root,
        fail_on_init_error=bool(flags.get("failOnInitError", False)),
    )


def _label_groups(raw: Mapping[str, Any]) -> LabelGroups:
    groups = raw.get("labels", {})
    defaults = LabelGroups()
    return LabelGroups(
        nvidia=groups.get("nvidia", defaults.nvidia),
        amd=groups.get("amd", defaults.amd),
        amd_beta=groups.get("amdBeta", defaults.amd_beta),
        firmware=groups.get("firmware", defaults.firmware),
        machine=groups.get("machine", defaults.machine),
        timestamp=groups.get("timestamp", defaults.timestamp),
    )


def parse_config(raw: Any) -> Config:
    """Build a Config from the parsed settings; raise ConfigError naming the first bad key.

    ``raw`` may be a fragment (no ``version``): parse_document checks a whole document."""
    if raw is None:
        return Config()
    _check(raw, _TOP_SPEC, "")
    flags = raw.get("flags", {})
    return Config(
        mig_strategy=flags.get("migStrategy", "none"),
        sharing=_sharing(raw.get("sharing", {})),
        plugin=_plugin_flags(flags),
        labels=_label_groups(raw.get("labeller", {})),
    )


def parse_document(raw: Any) -> Config:
    """A whole config document (a file, a profile's ``config`` section): ``version: v1`` is required."""
    if not isinstance(raw, Mapping):
        got = "an empty document" if raw is None else f"a {type(raw).__name__}"
        raise ConfigError(f"must be a mapping that starts with 'version: v1', got {got}")
    if "version" not in raw:
        raise ConfigError("version: required; add 'version: v1' (the only version)")
    return parse_config(raw)


def load_config(path: Path | None) -> Config:
    """Read a config file; None gives the defaults."""
    if path is None:
        return Config()
    try:
        raw = read_document(path, "config file")
    except DocumentError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return parse_document(raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
