"""The CDI spec of the NVIDIA devices the plugin serves (``deviceListStrategy`` cdi-annotations or
cdi-cri), under the kind its Allocate names: ``k8s.device-plugin.nvidia.com/gpu`` (NVIDIA's plugin's,
which keeps clear of the ``nvidia.com/gpu`` spec nvidia-ctk writes for the same GPUs).

Each device (named by its ID: UUID, or index "0" / "1:0") gets its ``/dev/nvidia<minor>`` (and a
MIG device its ``nvidia-caps`` nodes); every container of the kind gets the control nodes, the
driver's libraries and binaries found under ``flags.nvidiaDriverRoot`` on the host root, mounted
read-only where they are, and ``NVIDIA_VISIBLE_DEVICES=void`` (so that a legacy runtime hook does
not inject devices a second time). Libraries are looked for where nvidia-ctk looks: its library
directories (Debian's ``nvidia/current`` among them), then those the driver root's linker cache
lists the driver's libraries in (GKE's ``/usr/local/nvidia/lib64``). A library's soname links
(``libcuda.so.1``) are mounted from their target, since a bind mount cannot carry a link; when the
host has ``nvidia-ctk`` (``flags.plugin.nvidiaCTKPath``) its ``update-ldcache`` hook runs for the
library directories.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labeller.model.config import Config
from labeller.model.offer import PhysicalDevice
from vendors.nvidia.allocate import CDI_KIND, HostNodes
from vendors.nvidia.devices import NvidiaDevice
from vendors.nvidia.ldcache import driver_library_dirs
from vendors.nvidia.settings import NvidiaSettings

CDI_VERSION = "0.5.0"  # device nodes with hostPath, names starting with a digit: read by containerd 1.7 and CRI-O 1.28
# nvidia-ctk's search list (and /usr/lib); Debian's driver packages install under nvidia/current
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib/x86_64-linux-gnu/nvidia/current",
                "usr/lib/aarch64-linux-gnu/nvidia/current", "usr/lib64", "lib64", "usr/lib")
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")
BIN_DIRS = ("usr/bin", "usr/local/bin")
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "bind"]
_VERSIONED = re.compile(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)")


def _host(driver_root: str, relative: str) -> str:
    return f"{driver_root.rstrip('/')}/{relative}"


def driver_files(host_root: Path, driver_root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(host path, container path) of every driver library and binary under the driver root, and
    the library directories they are in (host paths)."""
    base = host_root / driver_root.lstrip("/")
    mounts: list[tuple[str, str]] = []
    directories: list[str] = []
    cached = [d for d in driver_library_dirs(base) if d not in LIBRARY_DIRS]  # /usr/local/nvidia/lib64 (GKE)
    for relative in (*LIBRARY_DIRS, *cached):
        directory = base / relative
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        versions = {m.group(1) for n in names if (m := _VERSIONED.fullmatch(n)) and not (directory / n).is_symlink()}
        libraries = [n for n in names for v in versions if n.endswith(f".so.{v}") and (directory / n).is_file()
                     and not (directory / n).is_symlink()]
        if not libraries:
            continue
        directories.append(_host(driver_root, relative))
        for name in libraries:
            mounts.append((_host(driver_root, f"{relative}/{name}"), f"/{relative}/{name}"))
        for name in names:  # soname links: libcuda.so.1 -> libcuda.so.550.54.15
            target = directory / name
            if target.is_symlink() and os.readlink(target) in libraries:
                mounts.append((_host(driver_root, f"{relative}/{os.readlink(target)}"), f"/{relative}/{name}"))
    for relative in BIN_DIRS:
        for name in BINARIES:
            if (base / relative / name).is_file():
                mounts.append((_host(driver_root, f"{relative}/{name}"), f"/{relative}/{name}"))
    return mounts, directories


def _node(path: str, dev_root: str) -> dict[str, str]:
    node = {"path": path, "permissions": "rwm"}
    if dev_root.rstrip("/"):
        node["hostPath"] = dev_root.rstrip("/") + path
    return node


def spec(devices: Sequence[PhysicalDevice], config: Config, host_root: Path) -> dict[str, Any] | None:
    gpus = [d for d in devices if isinstance(d, NvidiaDevice)]
    if not gpus:
        return None
    settings = config.section(NvidiaSettings)
    nodes = HostNodes(host_root)
    mounts, directories = driver_files(host_root, settings.driver_root)
    common: dict[str, Any] = {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [_node(p, settings.dev_root) for p in nodes.control],
    }
    if mounts:
        common["mounts"] = [{"hostPath": h, "containerPath": c, "options": MOUNT_OPTIONS} for h, c in mounts]
    if directories and (host_root / settings.ctk_path.lstrip("/")).is_file():
        args = [settings.ctk_path, "hook", "update-ldcache", *(a for d in directories for a in ("--folder", d))]
        common["hooks"] = [{"hookName": "createContainer", "path": settings.ctk_path, "args": args}]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": d.visible_id,
                     "containerEdits": {"deviceNodes": [_node(p, settings.dev_root) for p in nodes.of(d)]}}
                    for d in gpus],
        "containerEdits": common,
    }
