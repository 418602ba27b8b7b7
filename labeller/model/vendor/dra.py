"""What a vendor publishes through Dynamic Resource Allocation (role 4, optional).

``devices`` turns the inventory into the ``DraDevice`` objects of the vendor's DRA driver
(``labeller.model.resourceslices``): the names, attributes and capacities the vendor's own DRA driver
publishes, so a DeviceClass or CEL selector written for theirs selects the same devices on ours.
A value the inventory does not hold is left out, never made up. ``attribute_docs`` says, per
attribute and capacity, what it means and which upstream driver defines it (``gpu-labeller explain``).

Where the node makes partitions at prepare (``labeller.dra.dynamicMig``), ``devices`` publishes
counter sets and devices that draw on them (``DraDevice.consumes``) and is told what the DRA plugin
made (``DraState``); ``maker`` loads the vendor's ``DeviceMaker``, which makes such a device at
prepare (a MIG device through NVML, a compute partition mode through sysfs) and undoes it at
unprepare.

``configs`` loads the vendor's opaque config API (``ConfigApi``), for the DRA plugin alone: how a
claim's ``opaque.parameters`` for this driver are decoded (strictly, as the vendor's own driver's
decoder: an unknown apiVersion, kind or field, or a value out of range, is ``ConfigRefused``), which
devices a config may apply to, and the ``ConfigHandler`` that applies a decoded config to a claim's
devices on the node, undoes it when the claim is unprepared, and finds what it applied again after a
restart (from what the checkpoint recorded). ``labeller.apps.draplugin.configs`` collects the configs of a
claim in Kubernetes' order and hands them over.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import Offer, PhysicalDevice
from labeller.model.resourceslices import DraDevice


@dataclass(frozen=True)
class DraState:
    """What the DRA plugin knows besides the inventory. ``made``: the names of the devices it made
    for claims (a MIG device that exists because a claim asked for it), which are published as the
    partitions they were made as, not as devices someone else made; ``counters``: whether the API
    server keeps shared counters (the DRA plugin's gate-off detection, ``labeller.apps.draplugin.gates``:
    without DRAPartitionableDevices it drops them, and then the devices that exist are published, as
    without ``labeller.dra.dynamicMig``)."""

    made: frozenset[str] = frozenset()
    counters: bool = True


# (inventory, offer, config, state) -> the vendor's DRA devices, in a stable order. The offer is there
# for a vendor whose devices depend on what the device plugin serves; neither built-in vendor reads it.
DraDevices = Callable[[Inventory, Offer, Config, DraState], list[DraDevice]]


@dataclass(frozen=True)
class AttributeDoc:
    """One attribute or capacity family of a driver, for people. ``name`` as published; ``<i>``
    stands for any text (``memorySlice<i>``)."""

    name: str
    kind: str  # the API's attribute type ("string", "int", "bool", "version"), or "capacity"
    meaning: str  # what it holds and where its value comes from
    upstream: str  # which upstream driver publishes it, and how ours differs where it does
    # A name this driver published before and no longer does: the attribute it became, for claims
    # written against the old name (``explain`` says so; completion does not offer it).
    renamed_to: str | None = None


class ConfigRefused(ValueError):
    """A config the driver cannot honour, or could not apply: one line naming the key and the value."""


@dataclass(frozen=True)
class DeviceConfig:
    """One decoded config: its kind and its settings, normalized (defaults filled in) and JSON-able."""

    kind: str
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Applied:
    """What applying a config to some devices of a claim did. ``record`` (JSON-able) goes into the
    claim's checkpoint record and is what ``undo`` and ``recover`` are given back; ``edits`` are CDI
    containerEdits (``env``, ``mounts``) the claim's spec gives each of those devices."""

    record: Mapping[str, Any]
    edits: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Share:
    """What a claim holds of a device it shares with other claims (consumable capacity: the device
    allows multiple allocations): the bytes of its memory the claim's shares consume, and the other
    claims that hold the device now (their UIDs)."""

    memory: int
    others: tuple[str, ...] = ()


class ConfigHandler(Protocol):
    """Applies one driver's configs on the node. Calls for one claim never overlap; calls for
    different claims may (it guards what claims share, such as a GPU's time slice)."""

    def apply(self, claim_uid: str, config: DeviceConfig, devices: Sequence[DraDevice],
              shares: Mapping[str, Share] | None = None) -> Applied:
        """Apply ``config`` to ``devices`` of the claim; ConfigRefused (nothing left applied) when it
        cannot. ``shares``: the devices (by name) the claim holds as shares, and what of them."""
        ...

    def blocked(self, claim_uid: str, devices: Sequence[DraDevice]) -> str | None:
        """Why the claim cannot be given ``devices`` without a config now (what another claim's config
        made of them), or None."""
        ...

    def undo(self, claim_uid: str, applied: Applied) -> None:
        """Undo what ``apply`` did (again is fine); ConfigRefused when part of it cannot be undone now."""
        ...

    def recover(self, claim_uid: str, applied: Applied) -> None:
        """After a restart: know again what a prepared claim applied, and find (or restart) what runs for it."""
        ...

    def forget(self, claim_uid: str) -> None:
        """A claim unprepared with no record of what it applied (a plugin killed between applying a
        config and recording it): undo what can still be found of it; ConfigRefused as ``undo``."""
        ...


class MakeRefused(RuntimeError):
    """A device could not be made (or unmade): one line naming the device and what refused it."""


@dataclass(frozen=True)
class Made:
    """What making a device did: ``record`` (JSON-able) is kept in the plugin's ledger until the
    device is unmade, and is what ``unmake`` is given back; ``physical`` is the unit made, what
    the claim's CDI spec is built from (a MIG device with its UUID and instance ids)."""

    record: Mapping[str, Any]
    physical: PhysicalDevice


class DeviceMaker(Protocol):
    """Makes the devices a vendor publishes before they exist (``DraDevice.make``). Calls for one
    device never overlap; calls for different devices may."""

    def make(self, device: DraDevice) -> Made:
        """Make ``device`` (MakeRefused, nothing left made, when it cannot be)."""
        ...

    def unmake(self, record: Mapping[str, Any]) -> None:
        """Undo what ``make`` recorded; gone already is fine. MakeRefused when it cannot be undone now
        (the unit is busy); a unit that is no longer the one made (another UUID) is left alone."""
        ...

    def abandon(self, plan: Mapping[str, Any]) -> None:
        """A device whose making was started and never recorded (a plugin killed meanwhile): undo
        what can be found of it at its place (``DraDevice.make``), and nothing else."""
        ...


@dataclass(frozen=True)
class ConfigSettings:
    """What a handler may need from the DRA plugin's flags."""

    mps_root: Path  # the host directory of the claims' MPS control daemons
    mps_control: str = "nvidia-cuda-mps-control"
    nvidia_smi: str = "nvidia-smi"


@dataclass(frozen=True)
class ConfigApi:
    """A vendor's opaque config API (``resource.nvidia.com/v1beta1``, ``gpu.resource.amd.com/v1alpha1``)."""

    api_version: str
    kinds: tuple[str, ...]  # the kinds applied; for people
    decode: Callable[[Mapping[str, Any]], DeviceConfig]  # ConfigRefused
    # (config, device) -> None when the config may apply to the device, else the device's type
    # ("mig"): a config that names the device's request is then refused, one for every request skipped.
    fits: Callable[[DeviceConfig, DraDevice], str | None]
    handler: Callable[[ConfigSettings], ConfigHandler]
    # (a checkpoint's record, the claim's UID) -> what it says was applied; ValueError when it is not one
    read_applied: Callable[[Mapping[str, Any], str], Applied]


# --- strict decoding, as Kubernetes' strict JSON decoder of a config API reads an object ---------

def shown(value: Any, limit: int = 60) -> str:
    """A value for a one-line message: JSON, cut at ``limit`` characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def type_meta(parameters: Mapping[str, Any], api_version: str, applied: Collection[str],
              unsupported: Mapping[str, str] | None = None) -> str:
    """The object's kind, once its apiVersion is ``api_version`` and its kind one of ``applied``;
    a kind of the API that is ``unsupported`` (kind -> what it configures) is refused saying so."""
    given = parameters.get("apiVersion")
    if given != api_version:
        raise ConfigRefused(f"apiVersion: {shown(given)} is not {api_version}")
    kind = parameters.get("kind")
    if isinstance(kind, str) and kind in (unsupported or {}):
        raise ConfigRefused(f"kind: {kind} ({(unsupported or {})[kind]}) is not supported by gpu-labeller's driver")
    if kind not in applied:
        raise ConfigRefused(f"kind: {shown(kind)} is not a kind of {api_version} ({', '.join(applied)})")
    return str(kind)


def fields(value: Any, path: str, allowed: Collection[str]) -> Mapping[str, Any]:
    """``value`` as an object with no field but ``allowed`` (names are case-sensitive), nulls left
    out as Go leaves an omitted pointer."""
    if not isinstance(value, Mapping):
        raise ConfigRefused(f"{path}: {shown(value)} is not an object")
    for key in value:
        if key not in allowed:
            name = str(key)[:60].encode("unicode_escape").decode("ascii")
            raise ConfigRefused(f"{path + '.' if path else ''}{name}: unknown field "
                                f"(known: {', '.join(sorted(allowed)) or 'none'})")
    return {key: item for key, item in value.items() if item is not None}


@dataclass(frozen=True)
class Dra:
    driver: str  # the DRA driver name: "gpu.nvidia.com"; also the attributes' domain
    upstream: str  # for people: the vendor's own DRA driver, "NVIDIA k8s-dra-driver-gpu"
    devices: DraDevices
    attribute_docs: tuple[AttributeDoc, ...]
    served_label: str  # "nvidia.com/gpu.dra": "true" on a node whose GPUs of this vendor DRA serves
    # Its opaque config API, loaded on first use (the DRA plugin's alone); None: every config for the
    # driver is refused.
    configs: Callable[[], ConfigApi] | None = None
    # The device taint key of each kind of health fault (labeller.model.vendor.plugin.Fault: xid, lost,
    # unmonitored), in the driver's domain; a kind missing here is tainted <driver>/unhealthy.
    taint_keys: Mapping[str, str] = field(default_factory=dict)
    # Its maker of the devices it publishes before they exist, loaded on first use (the DRA plugin's
    # alone), given the host root and the host's vendor handles (a simulation's NVML); None: it
    # publishes none.
    maker: Callable[[Path, Mapping[str, Any]], DeviceMaker] | None = None
