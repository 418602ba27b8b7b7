"""The flags and environment variables of the tools gpu-labeller replaces: NVIDIA's GPU Feature
Discovery (GFD), NVIDIA's device plugin and AMD's k8s-node-labeller, and what each means here.

A flag either sets a config key (``key``: a flag or its env var beats the config file, as upstream),
or is gpu-labeller's own option under another name (``alias_of``), or asks for something
gpu-labeller does not do: then a warning names it, unless its value asks for what gpu-labeller
does anyway (``neutral``). Plain data: the command line declares the options from it
(labeller/commands/upstream.py), docs/migrating.md lists it and a test holds the two together.
Also here: the config keys of NVIDIA's format that are read and not honoured, and Go durations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Tool = Literal["gfd", "plugin", "amd"]
TOOL_NAMES: dict[Tool, str] = {"gfd": "GFD", "plugin": "NVIDIA's device plugin", "amd": "AMD's k8s-node-labeller"}
# A value kind: bool, str, a list of strings, a Go duration ("10s", "1m30s"), or one of some strings.
Kind = Literal["bool", "str", "list", "duration"] | tuple[str, ...]
Overrides = tuple[tuple[str, Any], ...]  # (dotted config key, value), applied over the config file


@dataclass(frozen=True)
class UpstreamFlag:
    tool: Tool
    names: tuple[str, ...]  # as upstream spells them, first the main one: ("--output-file", "-o")
    env: tuple[str, ...] = ()
    kind: Kind = "bool"
    key: str | None = None  # the config key it sets: "flags.migStrategy"
    alias_of: str | None = None  # or: gpu-labeller's own option it is another name of
    commands: tuple[str, ...] = ("run",)  # the gpu-labeller commands that take it
    neutral: Any = None  # a flag not honoured, given this value, asks for what gpu-labeller does: no warning
    note: str = ""  # the difference, for the warning and docs/migrating.md

    @property
    def honoured(self) -> bool:
        return self.key is not None or self.alias_of is not None

    @property
    def dest(self) -> str:
        """The Python name of its option: ``upstream_<tool>_<main name>``."""
        return f"upstream_{self.tool}_" + self.names[0].lstrip("-").replace("-", "_")

    def warning(self, value: Any) -> str | None:
        """The one line a value of a flag gpu-labeller does not honour gets; None when honoured or neutral."""
        if self.honoured or value is None or value == self.neutral:
            return None
        shown = (str(value).lower() if isinstance(value, bool)
                 else ",".join(value) if isinstance(value, tuple) else value)
        return f"{self.names[0]}={shown} ({TOOL_NAMES[self.tool]}) is not honoured by gpu-labeller: {self.note}"


def _amd_kind(kind: str) -> UpstreamFlag:
    return UpstreamFlag("amd", (f"-{kind}", f"--{kind}"), commands=("run", "labels"), neutral=True,
                        note="gpu-labeller writes every AMD label kind it can read; labeller.labels.amd and "
                             "amdBeta turn whole families off")


_RUN_AND_LABELS = ("run", "labels")
_NOT_DISCOVERY = "gpu-labeller finds NVIDIA GPUs through NVML and the PCI scan (as 'auto')"
_NO_CONTAINER_ROOT = "gpu-labeller reads the driver's files under --host-root and flags.nvidiaDriverRoot"

UPSTREAM_FLAGS: tuple[UpstreamFlag, ...] = (
    # --- GFD (cmd/gpu-feature-discovery/main.go): gpu-labeller run
    UpstreamFlag("gfd", ("--mig-strategy",), ("GFD_MIG_STRATEGY", "MIG_STRATEGY"), ("none", "single", "mixed"),
                 key="flags.migStrategy", commands=_RUN_AND_LABELS),
    UpstreamFlag("gfd", ("--fail-on-init-error",), ("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"), neutral=False,
                 note="run never exits on a failed probe: it logs it, keeps the labels it can vouch for and probes "
                      "again (--once exits 1 instead)"),
    UpstreamFlag("gfd", ("--oneshot",), ("GFD_ONESHOT",), key="flags.gfd.oneshot"),
    UpstreamFlag("gfd", ("--no-timestamp",), ("GFD_NO_TIMESTAMP",), key="flags.gfd.noTimestamp",
                 commands=_RUN_AND_LABELS),
    UpstreamFlag("gfd", ("--sleep-interval",), ("GFD_SLEEP_INTERVAL",), "duration", key="flags.gfd.sleepInterval"),
    UpstreamFlag("gfd", ("--output-file", "-o"), ("GFD_OUTPUT_FILE",), "str", key="flags.gfd.outputFile",
                 note="GFD's alias --output is gpu-labeller's --output (where the labels go)"),
    UpstreamFlag("gfd", ("--machine-type-file",), ("GFD_MACHINE_TYPE_FILE",), "str", key="flags.gfd.machineTypeFile",
                 commands=_RUN_AND_LABELS),
    UpstreamFlag("gfd", ("--config-file",), ("CONFIG_FILE",), "str", alias_of="--config", commands=_RUN_AND_LABELS),
    UpstreamFlag("gfd", ("--use-node-feature-api",), ("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"),
                 neutral=False, note="give --output nodefeature"),
    UpstreamFlag("gfd", ("--device-discovery-strategy",), ("DEVICE_DISCOVERY_STRATEGY",),
                 ("auto", "nvml", "tegra", "vfio"), neutral="auto", note=_NOT_DISCOVERY),
    UpstreamFlag("gfd", ("--driver-root-ctr-path", "--container-driver-root"),
                 ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"), "str", neutral="/driver-root",
                 note=_NO_CONTAINER_ROOT),
    # --- NVIDIA's device plugin (cmd/nvidia-device-plugin/main.go): gpu-labeller device-plugin
    UpstreamFlag("plugin", ("--mig-strategy",), ("MIG_STRATEGY",), ("none", "single", "mixed"),
                 key="flags.migStrategy", commands=("device-plugin", "resources")),
    UpstreamFlag("plugin", ("--fail-on-init-error",), ("FAIL_ON_INIT_ERROR",), key="flags.failOnInitError",
                 commands=("device-plugin",),
                 note="the default is false here (true in NVIDIA's plugin): the plugin waits for the driver"),
    UpstreamFlag("plugin", ("--driver-root", "--nvidia-driver-root"), ("NVIDIA_DRIVER_ROOT",), "str",
                 key="flags.nvidiaDriverRoot", commands=("device-plugin",)),
    UpstreamFlag("plugin", ("--dev-root", "--nvidia-dev-root"), ("NVIDIA_DEV_ROOT",), "str",
                 key="flags.nvidiaDevRoot", commands=("device-plugin",)),
    UpstreamFlag("plugin", ("--pass-device-specs",), ("PASS_DEVICE_SPECS",), key="flags.plugin.passDeviceSpecs",
                 commands=("device-plugin",)),
    UpstreamFlag("plugin", ("--device-list-strategy",), ("DEVICE_LIST_STRATEGY",), "list",
                 key="flags.plugin.deviceListStrategy", commands=("device-plugin",)),
    UpstreamFlag("plugin", ("--device-id-strategy",), ("DEVICE_ID_STRATEGY",), ("uuid", "index"),
                 key="flags.plugin.deviceIDStrategy", commands=("device-plugin",)),
    UpstreamFlag("plugin", ("--cdi-annotation-prefix",), ("CDI_ANNOTATION_PREFIX",), "str",
                 key="flags.plugin.cdiAnnotationPrefix", commands=("device-plugin",)),
    UpstreamFlag("plugin", ("--nvidia-cdi-hook-path", "--nvidia-ctk-path"), ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
                 "str", key="flags.plugin.nvidiaCTKPath", commands=("device-plugin",)),
    UpstreamFlag("plugin", ("--mps-root",), ("MPS_ROOT",), "str", key="flags.mpsRoot", commands=("device-plugin",)),
    UpstreamFlag("plugin", ("--config-file",), ("CONFIG_FILE",), "str", alias_of="--config",
                 commands=("device-plugin",)),
    UpstreamFlag("plugin", ("--gdrcopy-enabled",), ("GDRCOPY_ENABLED",), commands=("device-plugin",), neutral=False,
                 note="containers get no GDRCopy device nodes"),
    UpstreamFlag("plugin", ("--gds-enabled",), ("GDS_ENABLED",), commands=("device-plugin",), neutral=False,
                 note="containers get no NVIDIA_GDS=enabled"),
    UpstreamFlag("plugin", ("--mofed-enabled",), ("MOFED_ENABLED",), commands=("device-plugin",), neutral=False,
                 note="containers get no NVIDIA_MOFED=enabled"),
    UpstreamFlag("plugin", ("--driver-root-ctr-path", "--container-driver-root"),
                 ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"), "str", commands=("device-plugin",),
                 neutral="/driver-root", note=_NO_CONTAINER_ROOT),
    UpstreamFlag("plugin", ("--device-discovery-strategy",), ("DEVICE_DISCOVERY_STRATEGY",), ("auto", "nvml", "tegra"),
                 commands=("device-plugin",), neutral="auto", note=_NOT_DISCOVERY),
    UpstreamFlag("plugin", ("--resource-name-prefix",), ("RESOURCE_NAME_PREFIX",), "str", commands=("device-plugin",),
                 neutral="nvidia.com", note="resources are named nvidia.com/...; rename them with the sharing config"),
    UpstreamFlag("plugin", ("--imex-channel-ids",), ("IMEX_CHANNEL_IDS",), "list", commands=("device-plugin",),
                 neutral=(), note="containers get no IMEX channels"),
    UpstreamFlag("plugin", ("--imex-required",), ("IMEX_REQUIRED",), commands=("device-plugin",), neutral=False,
                 note="containers get no IMEX channels"),
    UpstreamFlag("plugin", ("--cdi-feature-flags",), ("CDI_FEATURE_FLAGS",), "list", commands=("device-plugin",),
                 neutral=(), note="the CDI specs are written with no feature flags"),
    # --- AMD's k8s-node-labeller (cmd/k8s-node-labeller/main.go, Go flags: -vram): gpu-labeller run
    UpstreamFlag("amd", ("-firmware", "--firmware"), key="labeller.labels.firmware", commands=_RUN_AND_LABELS),
    *(_amd_kind(kind) for kind in ("family", "driver-version", "driver-src-version", "device-id", "product-name",
                                   "vram", "simd-count", "cu-count", "compute-memory-partition",
                                   "compute-partitioning-supported", "memory-partitioning-supported")),
    UpstreamFlag("amd", (), ("DS_NODE_NAME",), "str", alias_of="--node-name"),
)


def flags_for(command: str) -> tuple[UpstreamFlag, ...]:
    """The upstream flags ``command`` declares (not the ones that are another name of its own options)."""
    return tuple(f for f in UPSTREAM_FLAGS if command in f.commands and f.alias_of is None)


def overrides_and_warnings(given: Mapping[UpstreamFlag, Any]) -> tuple[Overrides, list[str]]:
    """What the given upstream flags (None: not given) set over the config file, and one warning line
    for each that asks for something gpu-labeller does not do."""
    overrides: list[tuple[str, Any]] = []
    warnings: list[str] = []
    for flag, value in given.items():
        if value is None:
            continue
        if flag.key is not None:
            overrides.append((flag.key, tuple(value) if isinstance(value, list) else value))
        elif (line := flag.warning(value)) is not None:
            warnings.append(line)
    return tuple(overrides), warnings


def overlay(raw: Any, overrides: Overrides) -> Any:
    """The config document ``raw`` (None: empty) with each dotted key of ``overrides`` set; a key's
    value that is not a mapping on the way is left for the config check to name."""
    if not overrides:
        return raw
    document: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    for dotted, value in overrides:
        *parents, last = dotted.split(".")
        where = document
        for part in parents:
            child = where.get(part)
            child = dict(child) if isinstance(child, Mapping) else {}
            where[part] = child
            where = child
        where[last] = list(value) if isinstance(value, tuple) else value
    return document


# --- config keys of NVIDIA's format that gpu-labeller reads and does not honour ---------------------
# key -> (the value that asks for what gpu-labeller does anyway, or NOTHING, and why)
NOTHING = object()  # no value is neutral: any value is a warning
UNHONOURED_KEYS: dict[str, tuple[Any, str]] = {
    "flags.gdrcopyEnabled": (False, "containers get no GDRCopy device nodes"),
    "flags.gdsEnabled": (False, "containers get no NVIDIA_GDS=enabled"),
    "flags.mofedEnabled": (False, "containers get no NVIDIA_MOFED=enabled"),
    "flags.useNodeFeatureAPI": (False, "give run --output nodefeature"),
    "flags.deviceDiscoveryStrategy": ("auto", _NOT_DISCOVERY),
    "flags.plugin.containerDriverRoot": (NOTHING, _NO_CONTAINER_ROOT),
    "resources": (NOTHING, "resource names come from the vendors and the sharing config (NVIDIA's plugin ignores "
                           "this section too)"),
    "imex": (NOTHING, "containers get no IMEX channels"),
}


def _value_at(raw: Mapping[str, Any], dotted: str) -> Any:
    """The value of the dotted key in ``raw``; None when it is not there."""
    where: Any = raw
    for part in dotted.split("."):
        if not isinstance(where, Mapping):
            return None
        where = where.get(part)
    return where


def unhonoured_keys(raw: Any) -> list[str]:
    """One line for each key of the config document ``raw`` that gpu-labeller reads and does not honour."""
    if not isinstance(raw, Mapping):
        return []
    return [f"{key}: not honoured by gpu-labeller: {why}" for key, (neutral, why) in UNHONOURED_KEYS.items()
            if (value := _value_at(raw, key)) is not None and value != neutral]


# --- Go durations (GFD's sleepInterval) -----------------------------------------------------------
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def go_duration(text: str) -> float:
    """Seconds from a Go duration (``10s``, ``1m30s``, ``500ms``, ``1.5h``); ValueError otherwise."""
    parts = _GO_PART.findall(text)
    if not text or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"{text!r} is not a duration like 60s, 1m30s or 500ms")
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)
