"""The flags and environment variables of the tools gpu-labeller replaces, and what each means here:
NVIDIA's GPU Feature Discovery (GFD) and device plugin, AMD's k8s-node-labeller and device plugin,
gpushare's device plugin, scheduler extender and kubectl plugin, NVIDIA's and AMD's DRA drivers.

A flag either sets a config key (``key``: a flag or its env var beats the config file, as upstream),
or is gpu-labeller's own option under another name (``alias_of``), or asks for something
gpu-labeller does not do: then a warning names it, unless its value asks for what gpu-labeller
does anyway (``neutral``). A flag that sets a key is declared with the key (``KeyFlag``, in the
config table: labeller.model.configtable), the others here (``UNKEYED_FLAGS``). Plain data: the command
line declares the options from both (labeller/cli/commands/upstream.py), docs/migrating.md lists them
and a test holds the two together. Also here: Go durations.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Tool = Literal["gfd", "plugin", "amd", "amd-plugin", "glog", "gpushare", "gpushare-extender", "gpushare-inspect",
               "dra", "nvidia-dra", "klog"]
TOOL_NAMES: dict[Tool, str] = {
    "gfd": "GFD", "plugin": "NVIDIA's device plugin", "amd": "AMD's k8s-node-labeller",
    "amd-plugin": "AMD's device plugin", "glog": "glog, in AMD's and gpushare's device plugins",
    "gpushare": "gpushare's device plugin", "gpushare-extender": "gpushare's scheduler extender",
    "gpushare-inspect": "kubectl-inspect-gpushare", "dra": "NVIDIA's and AMD's DRA drivers",
    "nvidia-dra": "NVIDIA's DRA driver", "klog": "klog, in NVIDIA's and AMD's DRA drivers",
}
# A value kind: bool (--flag, --flag=false), switch (a Go bool given alone, before arguments: -d NODE),
# str, int, a list of strings, a Go duration ("10s", "1m30s"), or one of some strings.
Kind = Literal["bool", "switch", "str", "int", "list", "duration"] | tuple[str, ...]
Overrides = tuple[tuple[str, Any], ...]  # (dotted config key, value), applied over the config file
Neutral = Callable[[Any], bool]  # a value asks for what gpu-labeller does anyway


def anything(value: Any) -> bool:
    """Every value is neutral: the flag is context (the pod's namespace), not a request."""
    return True


def positive(value: Any) -> bool:
    return isinstance(value, int) and value > 0


def glog_info(value: Any) -> bool:
    """glog's -stderrthreshold asking for INFO and up on stderr, as gpu-labeller logs by default."""
    return str(value).strip().upper() in ("INFO", "0")


@dataclass(frozen=True)
class UpstreamFlag:
    tool: Tool
    names: tuple[str, ...]  # as upstream spells them, first the main one: ("--output-file", "-o"); () env only
    env: tuple[str, ...] = ()
    kind: Kind = "bool"
    key: str | None = None  # the config key it sets: "flags.migStrategy"
    alias_of: str | None = None  # or: gpu-labeller's own option it is another name of
    commands: tuple[str, ...] = ("run",)  # the gpu-labeller commands that take it
    # a flag not honoured, given this value (or a value this predicate holds for), asks for what
    # gpu-labeller does: no warning
    neutral: Any = None
    note: str = ""  # the difference, for the warning and docs/migrating.md

    @property
    def honoured(self) -> bool:
        return self.key is not None or self.alias_of is not None

    @property
    def dest(self) -> str:
        """The Python name of its option: ``upstream_<tool>_<main name>``."""
        main = self.names[0] if self.names else self.env[0].lower()
        return (f"upstream_{self.tool}_" + main.lstrip("-")).replace("-", "_")

    @property
    def shown(self) -> str:
        """How a warning names it: its main flag, or its env var."""
        return self.names[0] if self.names else self.env[0]

    def is_neutral(self, value: Any) -> bool:
        return bool(self.neutral(value)) if callable(self.neutral) else value == self.neutral

    def warning(self, value: Any) -> str | None:
        """The one line a value of a flag gpu-labeller does not honour gets; None when honoured or neutral."""
        if self.honoured or value is None or self.is_neutral(value):
            return None
        shown = (str(value).lower() if isinstance(value, bool)
                 else ",".join(value) if isinstance(value, tuple) else value)
        return f"{self.shown}={shown} ({TOOL_NAMES[self.tool]}) is not honoured by gpu-labeller: {self.note}"


@dataclass(frozen=True)
class KeyFlag:
    """An upstream flag or env var that sets a config key, declared with the key, which gives it its kind."""

    tool: Tool
    names: tuple[str, ...]
    env: tuple[str, ...] = ()
    commands: tuple[str, ...] = ("run",)
    note: str = ""

    def bound(self, key: str, kind: Kind) -> UpstreamFlag:
        return UpstreamFlag(self.tool, self.names, self.env, kind, key=key, commands=self.commands, note=self.note)


def go_names(name: str) -> tuple[str, str]:
    """A flag of Go's flag package: -name, also --name (-name=value, -name value)."""
    return f"-{name}", f"--{name}"


def _amd_kind(kind: str) -> UpstreamFlag:
    return UpstreamFlag("amd", go_names(kind), commands=RUN_AND_LABELS, neutral=True,
                        note="gpu-labeller writes every AMD label kind it can read; labeller.labels.amd and "
                             "amdBeta turn whole families off")


def _go(tool: Tool, name: str, commands: tuple[str, ...], kind: Kind = "bool", neutral: Any = None,
        note: str = "") -> UpstreamFlag:
    """A flag of Go's flag package that sets no key."""
    return UpstreamFlag(tool, go_names(name), (), kind, commands=commands, neutral=neutral, note=note)


RUN_AND_LABELS = ("run", "labels")  # the commands that take GFD's and AMD's labeller's flags
DEVICE_PLUGIN = ("device-plugin",)
DRA_PLUGIN = ("dra-plugin",)
NOT_DISCOVERY = "gpu-labeller finds NVIDIA GPUs through NVML and the PCI scan (as 'auto')"
NO_CONTAINER_ROOT = "gpu-labeller reads the driver's files under --host-root and flags.nvidiaDriverRoot"
_LOGS = "gpu-labeller logs to stderr; the root options --log-level and --log-format set what and how"
_VERBOSITY = "give the root option --log-level debug (gpu-labeller --log-level debug <command>)"
_NO_KUBELET_QUERY = "the plugin reads the pods bound to its node from the API server, not the kubelet"
_HEALTH_HTTP = "gpu-labeller serves /healthz, /readyz and /metrics over HTTP on --metrics-bind:--metrics-port"
_NOT_RATE_LIMITED = "the client is not rate limited (a few requests a minute)"

# The flags that set no config key (those that do are declared with their key).
UNKEYED_FLAGS: tuple[UpstreamFlag, ...] = (
    # --- GFD (cmd/gpu-feature-discovery/main.go): gpu-labeller run
    UpstreamFlag("gfd", ("--fail-on-init-error",), ("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"), neutral=False,
                 note="run never exits on a failed probe: it logs it, keeps the labels it can vouch for and probes "
                      "again (--once exits 1 instead)"),
    UpstreamFlag("gfd", ("--config-file",), ("CONFIG_FILE",), "str", alias_of="--config", commands=RUN_AND_LABELS),
    UpstreamFlag("gfd", ("--use-node-feature-api",), ("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"),
                 neutral=False, note="give --output nodefeature"),
    UpstreamFlag("gfd", ("--device-discovery-strategy",), ("DEVICE_DISCOVERY_STRATEGY",),
                 ("auto", "nvml", "tegra", "vfio"), neutral="auto", note=NOT_DISCOVERY),
    UpstreamFlag("gfd", ("--driver-root-ctr-path", "--container-driver-root"),
                 ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"), "str", neutral="/driver-root",
                 note=NO_CONTAINER_ROOT),
    UpstreamFlag("gfd", ("--pod-name",), ("POD_NAME",), "str",
                 note="the NodeFeature object gets no owner reference: cleanup removes it"),
    UpstreamFlag("gfd", ("--kube-api-qps",), ("KUBE_API_QPS",), "str", note=_NOT_RATE_LIMITED),
    UpstreamFlag("gfd", ("--kube-api-burst",), ("KUBE_API_BURST",), "int", note=_NOT_RATE_LIMITED),
    # --- NVIDIA's device plugin (cmd/nvidia-device-plugin/main.go): gpu-labeller device-plugin
    UpstreamFlag("plugin", ("--kubelet-socket",), ("KUBELET_SOCKET",), "str", alias_of="--kubelet-socket",
                 commands=DEVICE_PLUGIN),
    UpstreamFlag("plugin", ("--config-file",), ("CONFIG_FILE",), "str", alias_of="--config", commands=DEVICE_PLUGIN),
    UpstreamFlag("plugin", ("--gdrcopy-enabled",), ("GDRCOPY_ENABLED",), commands=DEVICE_PLUGIN, neutral=False,
                 note="containers get no GDRCopy device nodes"),
    UpstreamFlag("plugin", ("--gds-enabled",), ("GDS_ENABLED",), commands=DEVICE_PLUGIN, neutral=False,
                 note="containers get no NVIDIA_GDS=enabled"),
    UpstreamFlag("plugin", ("--mofed-enabled",), ("MOFED_ENABLED",), commands=DEVICE_PLUGIN, neutral=False,
                 note="containers get no NVIDIA_MOFED=enabled"),
    UpstreamFlag("plugin", ("--driver-root-ctr-path", "--container-driver-root"),
                 ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"), "str", commands=DEVICE_PLUGIN,
                 neutral="/driver-root", note=NO_CONTAINER_ROOT),
    UpstreamFlag("plugin", ("--device-discovery-strategy",), ("DEVICE_DISCOVERY_STRATEGY",), ("auto", "nvml", "tegra"),
                 commands=DEVICE_PLUGIN, neutral="auto", note=NOT_DISCOVERY),
    UpstreamFlag("plugin", ("--resource-name-prefix",), ("RESOURCE_NAME_PREFIX",), "str", commands=DEVICE_PLUGIN,
                 neutral="nvidia.com", note="resources are named nvidia.com/...; rename them with the sharing config"),
    UpstreamFlag("plugin", ("--imex-channel-ids",), ("IMEX_CHANNEL_IDS",), "list", commands=DEVICE_PLUGIN,
                 neutral=(), note="containers get no IMEX channels"),
    UpstreamFlag("plugin", ("--imex-required",), ("IMEX_REQUIRED",), commands=DEVICE_PLUGIN, neutral=False,
                 note="containers get no IMEX channels"),
    UpstreamFlag("plugin", ("--cdi-feature-flags",), ("CDI_FEATURE_FLAGS",), "list", commands=DEVICE_PLUGIN,
                 neutral=(), note="the CDI specs are written with no feature flags"),
    UpstreamFlag("plugin", ("--cdi-disable-hooks",), ("CDI_DISABLE_HOOKS",), "list", commands=DEVICE_PLUGIN,
                 neutral=(), note="the CDI specs carry one hook, nvidia-ctk's update-ldcache, when the host has "
                                  "flags.plugin.nvidiaCTKPath"),
    # --- AMD's k8s-node-labeller (cmd/k8s-node-labeller/main.go, Go flags: -vram): gpu-labeller run
    *(_amd_kind(kind) for kind in ("family", "driver-version", "driver-src-version", "device-id", "product-name",
                                   "vram", "simd-count", "cu-count", "compute-memory-partition",
                                   "compute-partitioning-supported", "memory-partitioning-supported")),
    UpstreamFlag("amd", (), ("DS_NODE_NAME",), "str", alias_of="--node-name"),
    # --- AMD's device plugin (cmd/k8s-device-plugin/main.go, Go flags): gpu-labeller device-plugin
    _go("amd-plugin", "pulse", DEVICE_PLUGIN, "int", neutral=positive,
        note="gpu-labeller always checks device health (AMD's 0 turns its checks off); DP_DISABLE_HEALTHCHECKS=all "
             "turns every check off"),
    # --- glog's flags (github.com/golang/glog), which AMD's and gpushare's device plugins parse
    _go("glog", "logtostderr", DEVICE_PLUGIN, neutral=True, note=_LOGS),
    _go("glog", "alsologtostderr", DEVICE_PLUGIN, neutral=True, note=_LOGS),
    _go("glog", "stderrthreshold", DEVICE_PLUGIN, "str", neutral=glog_info, note=_LOGS),
    UpstreamFlag("glog", ("-v", "--v"), kind="int", commands=DEVICE_PLUGIN, neutral=0, note=_VERBOSITY),
    _go("glog", "vmodule", DEVICE_PLUGIN, "str", note=_LOGS),
    _go("glog", "log_dir", DEVICE_PLUGIN, "str", neutral="", note=_LOGS),
    _go("glog", "log_link", DEVICE_PLUGIN, "str", neutral="", note=_LOGS),
    _go("glog", "logbuflevel", DEVICE_PLUGIN, "int", note=_LOGS),
    _go("glog", "log_backtrace_at", DEVICE_PLUGIN, "str", neutral="", note=_LOGS),
    # --- gpushare's device plugin (cmd/nvidia/main.go, Go flags): gpu-labeller device-plugin
    _go("gpushare", "memory-unit", DEVICE_PLUGIN, ("GiB", "MiB"),
        note="gpu-labeller shares GPUs by memory when the config says sharing.memory (unit: GiB or MiB; the chart's "
             "devicePlugin.memorySharing)"),
    _go("gpushare", "mps", DEVICE_PLUGIN, neutral=False, note="MPS is the config's sharing.mps"),
    _go("gpushare", "health-check", DEVICE_PLUGIN, neutral=True, note="gpu-labeller always checks device health"),
    _go("gpushare", "query-kubelet", DEVICE_PLUGIN, neutral=False, note=_NO_KUBELET_QUERY),
    _go("gpushare", "kubelet-address", DEVICE_PLUGIN, "str", neutral="0.0.0.0", note=_NO_KUBELET_QUERY),
    _go("gpushare", "kubelet-port", DEVICE_PLUGIN, "int", neutral=10250, note=_NO_KUBELET_QUERY),
    _go("gpushare", "client-cert", DEVICE_PLUGIN, "str", neutral="", note=_NO_KUBELET_QUERY),
    _go("gpushare", "client-key", DEVICE_PLUGIN, "str", neutral="", note=_NO_KUBELET_QUERY),
    _go("gpushare", "token", DEVICE_PLUGIN, "str", neutral="", note=_NO_KUBELET_QUERY),
    _go("gpushare", "timeout", DEVICE_PLUGIN, "int", neutral=10, note=_NO_KUBELET_QUERY),
    # --- gpushare's scheduler extender (cmd/main.go, env only): gpu-labeller scheduler-extender
    UpstreamFlag("gpushare-extender", (), ("PORT",), "int", alias_of="--port", commands=("scheduler-extender",)),
    UpstreamFlag("gpushare-extender", (), ("LOG_LEVEL",), "str", commands=("scheduler-extender",), note=_VERBOSITY),
    UpstreamFlag("gpushare-extender", (), ("THREADNESS",), "str", commands=("scheduler-extender",),
                 note="the extender's caches are fed by watches, with no worker count to set"),
    # --- kubectl-inspect-gpushare (cmd/inspect/main.go): gpu-labeller inspect
    UpstreamFlag("gpushare-inspect", ("-d",), kind="switch", commands=("inspect",), neutral=True,
                 note="inspect always lists each GPU's pods"),
    # --- NVIDIA's and AMD's DRA drivers (cmd/gpu-kubelet-plugin, cmd/gpu-kubeletplugin): gpu-labeller dra-plugin
    UpstreamFlag("dra", ("--cdi-root",), ("CDI_ROOT",), "str", alias_of="--cdi-spec-dir", commands=DRA_PLUGIN),
    UpstreamFlag("dra", ("--kubelet-registrar-directory-path",), ("KUBELET_REGISTRAR_DIRECTORY_PATH",), "str",
                 alias_of="--registry-dir", commands=DRA_PLUGIN),
    UpstreamFlag("dra", ("--kubelet-plugins-directory-path",), ("KUBELET_PLUGINS_DIRECTORY_PATH",), "str",
                 alias_of="--plugins-dir", commands=DRA_PLUGIN),
    UpstreamFlag("dra", ("--healthcheck-port",), ("HEALTHCHECK_PORT",), "int", commands=DRA_PLUGIN, neutral=-1,
                 note=_HEALTH_HTTP),
    UpstreamFlag("dra", ("--kube-api-qps",), ("KUBE_API_QPS",), "str", commands=DRA_PLUGIN, note=_NOT_RATE_LIMITED),
    UpstreamFlag("dra", ("--kube-api-burst",), ("KUBE_API_BURST",), "int", commands=DRA_PLUGIN, note=_NOT_RATE_LIMITED),
    UpstreamFlag("dra", ("--feature-gates",), ("FEATURE_GATES",), "str", commands=DRA_PLUGIN, neutral="",
                 note="gpu-labeller has no feature gates: what it serves follows the config"),
    UpstreamFlag("nvidia-dra", ("--container-driver-root",), ("DRIVER_ROOT_CTR_PATH",), "str", commands=DRA_PLUGIN,
                 neutral="/driver-root", note=NO_CONTAINER_ROOT),
    UpstreamFlag("nvidia-dra", ("--namespace",), ("NAMESPACE",), "str", commands=DRA_PLUGIN, neutral=anything,
                 note="the DRA plugin creates no namespaced objects"),
    UpstreamFlag("nvidia-dra", ("--image-name",), ("IMAGE_NAME",), "str", commands=DRA_PLUGIN,
                 note="the DRA plugin starts no other pods (NVIDIA's uses its image for ComputeDomain daemons)"),
    UpstreamFlag("nvidia-dra", ("--additional-xids-to-ignore",), ("ADDITIONAL_XIDS_TO_IGNORE",), "str",
                 commands=DRA_PLUGIN, neutral="",
                 note="give the XIDs to ignore in DP_DISABLE_HEALTHCHECKS (a comma list), as for the device plugin"),
    UpstreamFlag("nvidia-dra", ("--http-endpoint",), ("HTTP_ENDPOINT",), "str", commands=DRA_PLUGIN, neutral="",
                 note=_HEALTH_HTTP),
    UpstreamFlag("nvidia-dra", ("--metrics-path",), ("METRICS_PATH",), "str", commands=DRA_PLUGIN, neutral="/metrics",
                 note=_HEALTH_HTTP),
    # --- klog's flags (k8s.io/component-base/logs), which both DRA drivers take, each with an env var
    UpstreamFlag("klog", ("-v", "--v"), ("V",), "int", commands=DRA_PLUGIN, neutral=0, note=_VERBOSITY),
    UpstreamFlag("klog", ("--vmodule",), ("VMODULE",), "str", commands=DRA_PLUGIN, neutral="", note=_LOGS),
    UpstreamFlag("klog", ("--logging-format",), ("LOGGING_FORMAT",), "str", commands=DRA_PLUGIN, note=_LOGS),
    UpstreamFlag("klog", ("--log-flush-frequency",), ("LOG_FLUSH_FREQUENCY",), "str", commands=DRA_PLUGIN,
                 note="every log line is written at once"),
    UpstreamFlag("klog", ("--log-text-split-stream",), ("LOG_TEXT_SPLIT_STREAM",), commands=DRA_PLUGIN, neutral=False,
                 note=_LOGS),
    UpstreamFlag("klog", ("--log-text-info-buffer-size",), ("LOG_TEXT_INFO_BUFFER_SIZE",), "str", commands=DRA_PLUGIN,
                 neutral="0", note="every log line is written at once"),
    UpstreamFlag("klog", ("--log-json-split-stream",), ("LOG_JSON_SPLIT_STREAM",), commands=DRA_PLUGIN, neutral=False,
                 note=_LOGS),
    UpstreamFlag("klog", ("--log-json-info-buffer-size",), ("LOG_JSON_INFO_BUFFER_SIZE",), "str", commands=DRA_PLUGIN,
                 neutral="0", note="every log line is written at once"),
)


def flags_for(command: str, flags: Iterable[UpstreamFlag]) -> tuple[UpstreamFlag, ...]:
    """The ``flags`` ``command`` declares (not the ones that are another name of its own options)."""
    return tuple(f for f in flags if command in f.commands and f.alias_of is None)


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


# --- Go durations (GFD's sleepInterval) -----------------------------------------------------------
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def go_duration(text: str) -> float:
    """Seconds from a Go duration (``10s``, ``1m30s``, ``500ms``, ``1.5h``); ValueError otherwise."""
    parts = _GO_PART.findall(text)
    if not text or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"{text!r} is not a duration like 60s, 1m30s or 500ms")
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)
