"""A vendor's device-plugin parts (role 2, second half): Allocate, health checks and the CDI spec.

Only the device plugin runs them, and their modules import device-only code (NVML's event API,
sysfs device nodes), so a vendor hands them over through ``Devices.plugin_parts``: a function
that imports those modules when the plugin first calls it. The dry run never does.

Everything here is plain data, so the plugin turns a vendor's answer into gRPC messages without
knowing the vendor, and no vendor needs grpc.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from labeller.model.config import Config
from labeller.model.offer import PhysicalDevice, Resource

DEVICE_PERMISSIONS = "rwm"  # "rw" without "m" breaks some frameworks (PyTorch on AMD), see docs/device-plugin.md


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True)
class DeviceNode:
    host_path: str
    container_path: str
    permissions: str = DEVICE_PERMISSIONS


@dataclass
class ContainerEdits:
    """What the container runtime must give one container: the Allocate answer, vendor-neutral."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[DeviceNode] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)  # fully qualified CDI names


CDI_STRATEGIES = ("cdi-annotations", "cdi-cri")


def name_cdi_devices(edits: ContainerEdits, names: Sequence[str], strategies: Sequence[str], prefix: str,
                     owner: str) -> None:
    """The CDI device-list strategies: ``cdi-annotations`` adds one ``<prefix><owner>_<digest>``
    annotation naming the devices (NVIDIA uses a random suffix; a digest of the names is as unique
    per container and reproducible), ``cdi-cri`` fills ``cdi_devices``."""
    if "cdi-annotations" in strategies:
        suffix = hashlib.sha256(",".join(names).encode()).hexdigest()[:16]
        edits.annotations[f"{prefix}{owner}_{suffix}"] = ",".join(names)
    if "cdi-cri" in strategies:
        edits.cdi_devices.extend(names)


class Fault(str):
    """Why a checker marked a device Unhealthy: the text it logs, and which kind of fault that is, for
    whoever says more than "unhealthy" (the DRA plugin's device taints: a key per kind, the XID as value).

    ``kind`` is one of ``KINDS``: ``xid`` (a critical XID; ``code`` is its number), ``lost`` (the
    device stopped answering, or its KFD node is gone), ``unmonitored`` (its events cannot be watched,
    so its health is unknown). A plain ``str`` reason is a fault of no particular kind (``kind_of``)."""

    kind: str
    code: int | None

    XID, LOST, UNMONITORED, OTHER = "xid", "lost", "unmonitored", "other"
    KINDS = (XID, LOST, UNMONITORED, OTHER)

    def __new__(cls, text: str, kind: str, code: int | None = None) -> Fault:
        if kind not in cls.KINDS:
            raise ValueError(f"fault kind {kind!r} is not one of {', '.join(cls.KINDS)}")
        fault = super().__new__(cls, text)
        fault.kind, fault.code = kind, code
        return fault

    @staticmethod
    def kind_of(reason: str) -> tuple[str, int | None]:
        """(kind, code) of any reason a checker gave."""
        return (reason.kind, reason.code) if isinstance(reason, Fault) else (Fault.OTHER, None)


class HealthReporter(Protocol):
    """Where health checks report (the plugin's health board); ``reason`` is a ``Fault`` where the
    checker knows the kind."""

    def healthy(self, key: str) -> bool: ...

    def all_healthy(self) -> bool: ...

    def mark_unhealthy(self, keys: Iterable[str], reason: str) -> None: ...

    def answering(self, keys: Iterable[str]) -> None: ...

    def hardware_changed(self, reason: str) -> None:
        """The driver says the devices changed (a MIG reconfiguration): the plugin probes again now."""


class Checker(Protocol):
    """A vendor's health check of the devices it was given. ``poll`` runs every second while
    ``polling`` and must be cheap: a checker whose driver events tell it what went wrong only needs
    to ask the devices while one is unhealthy (to see it recover). A checker that ``wants_events``
    is given a thread of its own: there ``watch`` registers for the driver's events (it may block:
    NVML creates no event set while another thread of the process waits on one, a real H200 showed),
    then ``wait_for_event`` (when ``watches_events``) blocks for the next one, for a few seconds at
    most; that thread is the one that calls ``stop`` once it is done waiting."""

    def start(self) -> bool: ...  # False: the driver cannot be asked at all; checks stay off

    @property
    def wants_events(self) -> bool:
        """Started, it would watch driver events (``watch`` runs on a thread of its own)."""

    def watch(self) -> bool: ...  # register for driver events; False: none (it is polled instead)

    def poll(self) -> None: ...

    @property
    def polling(self) -> bool:
        """``poll`` has something to do now (else it is not called until a device's health changes)."""

    @property
    def watches_events(self) -> bool: ...

    def wait_for_event(self, timeout_ms: int) -> None: ...

    def stop(self) -> None: ...


# One container's devices -> what the container gets; built once per served resource.
Allocate = Callable[[Sequence[PhysicalDevice]], ContainerEdits]
AllocatorFactory = Callable[[Config, Path, Resource], Allocate]
# (devices, reporter, host root, simulation handle, environment) -> a checker, or None when off.
HealthFactory = Callable[[Sequence[PhysicalDevice], HealthReporter, Path, Any, Mapping[str, str]], Checker | None]
# (the devices the plugin serves, config, host root) -> the vendor's CDI spec (a JSON-ready dict), or
# None when it writes none for them (labeller/apps/plugin/cdi.py writes it).
CdiSpec = Callable[[Sequence[PhysicalDevice], Config, Path], "dict[str, Any] | None"]


@dataclass(frozen=True)
class PluginParts:
    """What the device plugin asks a vendor for, besides its device groups."""

    allocator: AllocatorFactory  # per served resource: the function that answers Allocate
    checker: HealthFactory
    cdi_spec: CdiSpec
