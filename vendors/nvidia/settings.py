"""NVIDIA's keys of the config file: where the driver's files and device nodes are on the host, how
Allocate names the devices, and GFD's label groups. Declared once here (``labeller.model.configtable``),
registered through ``Vendor.settings``; the code reads them as ``config.section(NvidiaSettings)``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from labeller.model.configtable import UNSET, Key, Section, setting, value_at
from labeller.model.upstream import DEVICE_PLUGIN, DRA_PLUGIN, RUN_AND_LABELS, KeyFlag

_NO_TIMESTAMP = "flags.gfd.noTimestamp"
_DRIVER_ROOT = "flags.nvidiaDriverRoot"


def _dev_root(document: Mapping[str, Any], path: str) -> str:
    """``flags.nvidiaDevRoot``, else ``flags.nvidiaDriverRoot``, else /; "" is unset, as in NVIDIA's plugin."""
    return str(value_at(document, path, "") or value_at(document, _DRIVER_ROOT, "") or "/")


def _timestamp(document: Mapping[str, Any], path: str) -> bool:
    """GFD's noTimestamp: true always drops the timestamp; else ``labeller.labels.timestamp`` decides, else an
    explicit noTimestamp: false asks for it (GFD's default); else none."""
    no_timestamp = value_at(document, _NO_TIMESTAMP, None)
    if no_timestamp is True:
        return False
    given = value_at(document, path)
    return bool(given) if given is not UNSET else no_timestamp is False


@dataclass(frozen=True)
class NvidiaSettings:
    driver_root: str = setting(
        _DRIVER_ROOT, "/", "where CDI specs find the driver's libraries and binaries on the host", blank_is_unset=True,
        flags=(KeyFlag("plugin", ("--driver-root", "--nvidia-driver-root"), ("NVIDIA_DRIVER_ROOT",), DEVICE_PLUGIN),
               KeyFlag("nvidia-dra", ("--nvidia-driver-root", "--host_driver-root"),
                       ("NVIDIA_DRIVER_ROOT", "HOST_DRIVER_ROOT"), DRA_PLUGIN)))
    dev_root: str = setting(
        "flags.nvidiaDevRoot", "/", "host-path prefix of the device nodes passed with `passDeviceSpecs` and written "
        "in CDI specs; unset: `flags.nvidiaDriverRoot`", shown="", read=_dev_root,
        flags=(KeyFlag("plugin", ("--dev-root", "--nvidia-dev-root"), ("NVIDIA_DEV_ROOT",), DEVICE_PLUGIN),))
    pass_device_specs: bool = setting(
        "flags.plugin.passDeviceSpecs", False, "pass the `/dev/nvidia*` device nodes (with `envvar` and "
        "`volume-mounts`)", flags=(KeyFlag("plugin", ("--pass-device-specs",), ("PASS_DEVICE_SPECS",), DEVICE_PLUGIN),))
    device_id_strategy: Literal["uuid", "index"] = setting(
        "flags.plugin.deviceIDStrategy", "uuid", "device IDs and `NVIDIA_VISIBLE_DEVICES` values",
        flags=(KeyFlag("plugin", ("--device-id-strategy",), ("DEVICE_ID_STRATEGY",), DEVICE_PLUGIN),))
    ctk_path: str = setting(
        "flags.plugin.nvidiaCTKPath", "/usr/bin/nvidia-ctk", "CDI specs add its `update-ldcache` hook when the host "
        "has it",
        flags=(KeyFlag("plugin", ("--nvidia-cdi-hook-path", "--nvidia-ctk-path"),
                       ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"), DEVICE_PLUGIN),
               KeyFlag("nvidia-dra", ("--nvidia-cdi-hook-path",), ("NVIDIA_CDI_HOOK_PATH",), DRA_PLUGIN)))
    labels: bool = setting("labeller.labels.nvidia", True, "NVIDIA's labels, GFD's keys (`nvidia.com/gpu.*`, `cuda.*`, "
                           "`mig.*`, ...) and `nvidia.com/gpu.present`")
    machine_label: bool = setting("labeller.labels.machine", True, "`nvidia.com/gpu.machine`")
    timestamp_label: bool = setting(
        "labeller.labels.timestamp", False, "`nvidia.com/gfd.timestamp` (off: a changing value would make every "
        "restart a write)", read=_timestamp)


SETTINGS = Section(NvidiaSettings, keys=(
    Key(_NO_TIMESTAMP, "`true` always drops `nvidia.com/gfd.timestamp`; an explicit `false` (GFD's default) writes "
        "it unless `labeller.labels.timestamp` is set", bool,
        flags=(KeyFlag("gfd", ("--no-timestamp",), ("GFD_NO_TIMESTAMP",), RUN_AND_LABELS),)),
))
