"""The contract a vendor package fulfils, as NFD's feature sources do: one package per vendor.

``vendors/<name>/__init__.py`` builds one ``Vendor`` out of its own functions (probe, label rules,
device groups, allocation, health) and ``vendors.VENDORS`` registers it. The model never imports a
vendor package; the commands hand the registry to it. Adding a vendor means adding a package and
one line in the registry.

Everything a vendor returns is plain data of this module or ``labeller.offer``, so the device
plugin turns it into gRPC messages without knowing the vendor, and the dry run needs no grpc.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from labeller.inventory import BackendReport, Inventory, PciGpu, VendorPart
from labeller.labels import KeyDoc, Labeler

if TYPE_CHECKING:
    from labeller.config import Config
    from labeller.offer import DeviceGroup, PhysicalDevice, Resource

DEVICE_PERMISSIONS = "rwm"  # "rw" without "m" breaks some frameworks (PyTorch on AMD), see the README


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


class HealthReporter(Protocol):
    """Where health checks report (the plugin's health board)."""

    def mark_unhealthy(self, keys: Iterable[str], reason: str) -> None: ...

    def answering(self, keys: Iterable[str]) -> None: ...


class Checker(Protocol):
    """A vendor's health check of the devices it was given. ``poll`` runs every few hundred ms;
    ``wait_for_event`` (when ``watches_events``) blocks for the next driver event."""

    def start(self) -> bool: ...  # False: the driver cannot be asked at all; checks stay off

    def poll(self) -> None: ...

    @property
    def watches_events(self) -> bool: ...

    def wait_for_event(self, timeout_ms: int) -> None: ...

    def stop(self) -> None: ...


# (host root, the GPUs on the PCI bus, config, simulation handle) -> (the vendor's part, its report).
# Never raises: a failure is the report.
Prober = Callable[[Path, tuple[PciGpu, ...], "Config", Any], tuple[VendorPart | None, BackendReport]]
# The resources a vendor offers before sharing is applied (see labeller.offer).
DeviceGroups = Callable[[Inventory, "Config"], "list[DeviceGroup]"]
# One container's devices -> what the container gets; built once per served resource.
Allocate = Callable[["Sequence[PhysicalDevice]"], ContainerEdits]
AllocatorFactory = Callable[["Config", Path, "Resource"], Allocate]
# (devices, reporter, host root, simulation handle, environment) -> a checker, or None when off.
HealthFactory = Callable[["Sequence[PhysicalDevice]", HealthReporter, Path, Any, Mapping[str, str]], Checker | None]


# (inventory, a resource with MPS replicas) -> why the vendor cannot serve it by MPS now, and whether
# that may change (True: its MPS control daemon is not ready yet), or None when it can (labeller.offer).
MpsCheck = Callable[[Inventory, "Resource"], "tuple[str, bool] | None"]
# (the devices the plugin serves, config, host root) -> the vendor's CDI spec (a JSON-ready dict), or
# None when the vendor writes none; loaded on first use like the allocator (labeller/plugin/cdi.py writes it).
CdiSpec = Callable[["Sequence[PhysicalDevice]", "Config", Path], "dict[str, Any] | None"]
# (config) -> a cheap fingerprint of what the offer reads besides the hardware probe (NVIDIA: the MPS
# control daemon's readiness file); the plugin probes again when it changes.
OfferInputs = Callable[["Config"], object]


def no_mps(inventory: Inventory, resource: Resource) -> tuple[str, bool] | None:
    return f"{resource.base} cannot be shared by MPS (NVIDIA GPUs only)", False


def no_inputs(config: Config) -> object:
    return None


# Allocation and health checks serve only the device plugin: a vendor names their modules, imported
# on first use, so that the dry run never loads them.
def allocator_in(module: str) -> AllocatorFactory:
    """``module.allocator``, imported when the first allocator is made."""
    def make(config: Config, host_root: Path, resource: Resource) -> Allocate:
        factory: AllocatorFactory = importlib.import_module(module).allocator
        return factory(config, host_root, resource)
    return make


def cdi_in(module: str) -> CdiSpec:
    """``module.spec``, imported when the first CDI spec is made."""
    def make(devices: Sequence[PhysicalDevice], config: Config, host_root: Path) -> dict[str, Any] | None:
        spec: CdiSpec = importlib.import_module(module).spec
        return spec(devices, config, host_root)
    return make


def no_cdi(devices: Sequence[PhysicalDevice], config: Config, host_root: Path) -> dict[str, Any] | None:
    return None


def checker_in(module: str) -> HealthFactory:
    """``module.checker``, imported when the first checker is made."""
    def make(devices: Sequence[PhysicalDevice], reporter: HealthReporter, host_root: Path, handle: Any,
             env: Mapping[str, str]) -> Checker | None:
        factory: HealthFactory = importlib.import_module(module).checker
        return factory(devices, reporter, host_root, handle, env)
    return make


@dataclass(frozen=True)
class Vendor:
    name: str  # "nvidia": also the profile section and the backend report's name
    pci_vendor_id: int
    pci_classes: tuple[int, ...]  # PCI base classes that are this vendor's GPUs (0x03 display, 0x12 accelerator)
    presence_label: str  # "nvidia.com/gpu.present"
    labels_enabled: Callable[[Config], bool]  # whether any of its label groups is on
    probe: Prober
    labelers: tuple[Labeler, ...]
    device_groups: DeviceGroups
    allocator: AllocatorFactory
    health: HealthFactory
    health_source: str  # for people: what marks this vendor's devices Unhealthy
    simulator: str  # module with build(section, root, base_dir) and absent(): imported only to simulate
    mps: MpsCheck = no_mps
    offer_inputs: OfferInputs = no_inputs
    cdi: CdiSpec = no_cdi
    key_docs: tuple[KeyDoc, ...] = ()  # every key family its labelers write, for people (gpu-labeller explain)
