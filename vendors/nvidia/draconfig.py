"""NVIDIA's opaque device configs (``resource.nvidia.com/v1beta1``, NVIDIA k8s-dra-driver-gpu's
``api/nvidia.com/resource/v1beta1``), decoded as strictly as its ``StrictDecoder`` and applied as its
``cmd/gpu-kubelet-plugin/sharing.go`` applies them (docs/dra.md, "Opaque configs").

``GpuConfig`` (whole GPUs) and ``MigDeviceConfig`` (MIG devices) carry an optional ``sharing``:

- ``TimeSlicing`` (``GpuConfig`` only: ``timeSlicingConfig.interval`` Default, Short, Medium or
  Long, Default when left out): ``nvidia-smi compute-policy -i <UUID> --set-timeslice <0-3>`` on each
  GPU, back to 0 once no prepared claim that set one uses the GPU. Claims that share a GPU (both
  allocations carry a shareID) must ask for the same interval: a second claim asking for another is
  refused, naming the claim whose interval is in force (NVIDIA's driver sets whatever the later
  claim asks, under the earlier one). On MIG devices it sets nothing, as NVIDIA's (the time slice
  is a whole GPU's).
- ``MPS`` (``mpsConfig``: ``defaultActiveThreadPercentage`` 1-100, ``defaultPinnedDeviceMemoryLimit``,
  ``defaultPerDevicePinnedMemoryLimit`` by device UUID or index among the config's devices, in UUID
  order): one control daemon per config of a claim, ``<mps root>/<claim UID>-<5 hex digits of its
  devices' UUIDs' SHA-256>/{pipe,log}`` (NVIDIA's daemon ID; ``claim.json`` there says what it is
  before it starts, so that a daemon a killed plugin never recorded is still stopped as it should
  be when its claim is unprepared), started with ``CUDA_VISIBLE_DEVICES``
  set to the devices, its whole GPUs in EXCLUSIVE_PROCESS compute mode, told the limits (in whole
  MiB, per device UUID) and the percentage; the claim's containers get ``CUDA_MPS_PIPE_DIRECTORY`` and
  the pipe directory and ``<mps root>/shm`` (the MPS server's ``/dev/shm``) mounted. A limit above a
  device's memory, or naming a device not in the config's, is refused. A GPU another prepared claim
  uses with a sharing config is not given MPS (it would be EXCLUSIVE_PROCESS under that claim).

Unsupported kinds of the API (``VfioDeviceConfig``, the ComputeDomain kinds) are refused by name.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from labeller import ownfiles, quantity
from labeller.resourceslices import DraDevice
from labeller.vendor.dra import (Applied, ConfigApi, ConfigRefused, ConfigSettings, DeviceConfig, fields, shown,
                                 type_meta)
from vendors.nvidia import mps
from vendors.nvidia.devices import NvidiaDevice
from vendors.nvidia.facts import MIB
from vendors.nvidia.mpscontrol import CommandFailed, Daemon, Plan, Tools, set_timeslice

log = structlog.get_logger(__name__)

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG, MIG_CONFIG = "GpuConfig", "MigDeviceConfig"
UNSUPPORTED = {
    "VfioDeviceConfig": "passing a GPU through to a virtual machine with vfio-pci",
    "ComputeDomainChannelConfig": "an IMEX channel of a ComputeDomain (NVIDIA's compute-domain.nvidia.com driver)",
    "ComputeDomainDaemonConfig": "an IMEX daemon of a ComputeDomain (NVIDIA's compute-domain.nvidia.com driver)",
    "ComputeDomain": "a ComputeDomain object, not a device config",
    "ComputeDomainClique": "a ComputeDomainClique object, not a device config",
}
TIME_SLICING, MPS = "TimeSlicing", "MPS"
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}  # NVIDIA's TimeSliceInterval.Int()
MPS_FIELDS = ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit")
CLAIM_FILE = "claim.json"  # in a daemon's directory: what it was started for (its checkpoint entry)
CLAIM_FILE_LIMIT = 16 * 1024
CONTAINER_PIPE = "/tmp/nvidia-mps"  # where a claim's containers see the daemon's pipe directory (NVIDIA's)
MOUNT_OPTIONS = ["rw", "nosuid", "nodev", "bind"]
_DAEMON = re.compile(r"[0-9A-Za-z][-0-9A-Za-z]{0,127}-[0-9a-f]{5}")
_UUID = re.compile(r"(GPU|MIG)-[-0-9A-Za-z/]{1,120}")


# --- decoding ------------------------------------------------------------------------------------

def decode(parameters: Mapping[str, Any]) -> DeviceConfig:
    """A ``GpuConfig`` or ``MigDeviceConfig`` with its defaults filled in; ConfigRefused otherwise."""
    kind = type_meta(parameters, API_VERSION, (GPU_CONFIG, MIG_CONFIG), UNSUPPORTED)
    top = fields(parameters, "", ("apiVersion", "kind", "sharing"))
    if "sharing" not in top:
        return DeviceConfig(kind)
    return DeviceConfig(kind, {"sharing": _sharing(kind, top["sharing"])})


def _sharing(kind: str, value: Any) -> dict[str, Any]:
    allowed = ("strategy", "timeSlicingConfig", "mpsConfig") if kind == GPU_CONFIG else ("strategy", "mpsConfig")
    sharing = fields(value, "sharing", allowed)
    strategy = sharing.get("strategy")
    if strategy == TIME_SLICING:
        if "mpsConfig" in sharing:
            raise ConfigRefused(f"sharing.mpsConfig: {shown(sharing['mpsConfig'])}: an MPS config with the "
                                "TimeSlicing strategy")
        if kind == MIG_CONFIG:
            return {"strategy": TIME_SLICING}
        slicing = fields(sharing.get("timeSlicingConfig", {}), "sharing.timeSlicingConfig", ("interval",))
        interval = slicing.get("interval", "Default")
        if interval not in INTERVALS:
            raise ConfigRefused(f"sharing.timeSlicingConfig.interval: {shown(interval)} is not one of "
                                f"{', '.join(INTERVALS)}")
        return {"strategy": TIME_SLICING, "interval": interval}
    if strategy == MPS:
        if "timeSlicingConfig" in sharing:
            raise ConfigRefused(f"sharing.timeSlicingConfig: {shown(sharing['timeSlicingConfig'])}: a time-slicing "
                                "config with the MPS strategy")
        return {"strategy": MPS, **_mps(fields(sharing.get("mpsConfig", {}), "sharing.mpsConfig", MPS_FIELDS))}
    raise ConfigRefused(f"sharing.strategy: {shown(strategy)} is not {TIME_SLICING} or {MPS}")


def _mps(config: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    percentage = config.get("defaultActiveThreadPercentage")
    if percentage is not None:
        if type(percentage) is not int or not 1 <= percentage <= 100:
            raise ConfigRefused(f"sharing.mpsConfig.defaultActiveThreadPercentage: {shown(percentage)} is not a "
                                "whole number from 1 to 100")
        out["defaultActiveThreadPercentage"] = percentage
    if "defaultPinnedDeviceMemoryLimit" in config:
        out["defaultPinnedDeviceMemoryLimit"] = _limit("sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
                                                       config["defaultPinnedDeviceMemoryLimit"])
    if "defaultPerDevicePinnedMemoryLimit" in config:
        path = "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"
        per_device = config["defaultPerDevicePinnedMemoryLimit"]
        if not isinstance(per_device, Mapping):
            raise ConfigRefused(f"{path}: {shown(per_device)} is not an object (device UUID or index: quantity)")
        out["defaultPerDevicePinnedMemoryLimit"] = {str(key): _limit(f"{path}[{shown(key, 60)}]", value)
                                                     for key, value in per_device.items()}
    return out


def _limit(path: str, value: Any) -> int:
    """A pinned memory limit in bytes (a quantity rounded up, as ``Quantity.Value()``), at least 1 MiB
    (NVIDIA's driver refuses less: the daemon is told whole MiB)."""
    parsed = quantity.parse(value) if isinstance(value, (str, int)) else None
    if parsed is None:
        raise ConfigRefused(f"{path}: {shown(value)} is not a quantity (10Gi, 512Mi)")
    size = math.ceil(parsed)
    if size < MIB:
        raise ConfigRefused(f"{path}: {shown(value)} is less than 1Mi")
    return size


def fits(config: DeviceConfig, device: DraDevice) -> str | None:
    """``GpuConfig`` applies to whole GPUs, ``MigDeviceConfig`` to MIG devices (NVIDIA's rule)."""
    physical = device.physical
    is_mig = isinstance(physical, NvidiaDevice) and physical.mig is not None
    if is_mig == (config.kind == MIG_CONFIG):
        return None
    return "mig" if is_mig else "gpu"


# --- applying ------------------------------------------------------------------------------------

def _uuid(device: DraDevice) -> str:
    return device.health_key  # a GPU's or a MIG device's UUID


def _memory(device: DraDevice) -> int:
    physical = device.physical
    if isinstance(physical, NvidiaDevice) and physical.mig is not None:
        return physical.mig.memory_mib * MIB
    return physical.memory_bytes


def daemon_id(claim_uid: str, uuids: Sequence[str]) -> str:
    """NVIDIA's MPS control daemon ID: the claim's UID and 5 hex digits of its devices' UUIDs' SHA-256."""
    return f"{claim_uid}-{hashlib.sha256(','.join(uuids).encode()).hexdigest()[:5]}"


class NvidiaConfigs:
    """The ``ConfigHandler`` of ``gpu.nvidia.com``: time slices and MPS control daemons, and which
    claims use each GPU with which of them (``_users``: GPU or MIG UUID -> claim UID -> "TimeSlicing
    Long" or "MPS"), known again after a restart from the claims' records (``recover``)."""

    def __init__(self, settings: ConfigSettings) -> None:
        self.root = str(settings.mps_root)
        self.tools = Tools(mps_control=settings.mps_control, nvidia_smi=settings.nvidia_smi)
        self._lock = threading.Lock()  # the users; time slices are set and reset under it
        self._users: dict[str, dict[str, str]] = {}

    # -- the claims using each device

    def _take(self, claim_uid: str, uuids: Sequence[str], use: str) -> None:
        """Record ``use`` of ``uuids`` by the claim (lock held); ConfigRefused when another claim's use conflicts."""
        for uuid in uuids:
            for other, theirs in self._users.get(uuid, {}).items():
                if other != claim_uid and (use == MPS or theirs != use):
                    raise ConfigRefused(f"sharing: {use} asked for {uuid}, which prepared claim {other} shares "
                                        f"with {theirs} (claims that share a GPU must ask for the same time slice, "
                                        "and cannot share it under MPS)")
        for uuid in uuids:
            self._users.setdefault(uuid, {})[claim_uid] = use

    def _release(self, claim_uid: str, uuids: Sequence[str]) -> list[str]:
        """Forget the claim's use of ``uuids`` (lock held); those no claim time-slices any more."""
        idle = []
        for uuid in uuids:
            users = self._users.get(uuid, {})
            users.pop(claim_uid, None)
            if not any(use.startswith(TIME_SLICING) for use in users.values()):
                idle.append(uuid)
            if not users:
                self._users.pop(uuid, None)
        return idle

    # -- ConfigHandler

    def apply(self, claim_uid: str, config: DeviceConfig, devices: Sequence[DraDevice]) -> Applied:
        sharing = config.settings.get("sharing")
        if not sharing or (sharing["strategy"] == TIME_SLICING and config.kind == MIG_CONFIG):
            return Applied({"kind": config.kind, **({"strategy": sharing["strategy"]} if sharing else {})})
        if sharing["strategy"] == TIME_SLICING:
            return self._time_slice(claim_uid, sorted(_uuid(d) for d in devices), sharing["interval"])
        return self._mps(claim_uid, config, devices, sharing)

    def _time_slice(self, claim_uid: str, gpus: list[str], interval: str) -> Applied:
        with self._lock:
            self._take(claim_uid, gpus, f"{TIME_SLICING} {interval}")
            try:
                set_timeslice(gpus, INTERVALS[interval], self.tools)
            except CommandFailed as exc:
                idle = self._release(claim_uid, gpus)
                self._reset(idle)
                raise ConfigRefused(f"sharing.timeSlicingConfig.interval: {interval} not set: {exc}") from None
        return Applied({"kind": GPU_CONFIG, "strategy": TIME_SLICING, "interval": interval, "gpus": gpus})

    def _reset(self, gpus: list[str]) -> str | None:
        try:
            set_timeslice(gpus, INTERVALS["Default"], self.tools)
        except CommandFailed as exc:
            log.warning("time slice not set back to Default", gpus=gpus, reason=str(exc))
            return f"time slice not set back to Default: {exc}"
        return None

    def _mps(self, claim_uid: str, config: DeviceConfig, devices: Sequence[DraDevice],
             sharing: Mapping[str, Any]) -> Applied:
        whole = sorted(_uuid(d) for d in devices if fits(DeviceConfig(GPU_CONFIG), d) is None)
        visible = whole + sorted(_uuid(d) for d in devices if _uuid(d) not in whole)
        limits = _pinned(sharing, visible, {_uuid(d): _memory(d) for d in devices})
        record: dict[str, Any] = {
            "kind": config.kind, "strategy": MPS, "daemon": daemon_id(claim_uid, visible), "devices": visible,
            "gpus": whole, "defaultActiveThreadPercentage": sharing.get("defaultActiveThreadPercentage"),
            "pinnedMemoryLimitsMiB": limits}
        with self._lock:
            self._take(claim_uid, visible, MPS)
        daemon = Daemon(_plan(record), self.root, self.tools)
        try:
            Path(mps.shm_dir(self.root)).mkdir(mode=0o755, parents=True, exist_ok=True)
            with ownfiles.directory(Path(self.root), record["daemon"]) as fd:
                ownfiles.replace(fd, CLAIM_FILE, json.dumps(record).encode(), 0o600)
            started = daemon.repair()
        except OSError as exc:
            started, daemon.problem = False, f"{exc.filename or self.root}: {exc.strerror or exc}"
        if not started:
            problem = daemon.problem
            self._stop(claim_uid, record)
            raise ConfigRefused(f"sharing.strategy: MPS: the control daemon for {', '.join(visible)} did not start: "
                                f"{problem}")
        log.info("MPS control daemon serves the claim", claim_uid=claim_uid, daemon=record["daemon"],
                 devices=visible, thread_percentage=record["defaultActiveThreadPercentage"], pinned_mib=limits)
        return Applied(record, self._edits(record))

    def _edits(self, record: Mapping[str, Any]) -> dict[str, Any]:
        return {"env": [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE}"],
                "mounts": [{"hostPath": mps.pipe_dir(self.root, record["daemon"]), "containerPath": CONTAINER_PIPE,
                            "options": MOUNT_OPTIONS},
                           {"hostPath": mps.shm_dir(self.root), "containerPath": mps.CONTAINER_SHM,
                            "options": MOUNT_OPTIONS}]}

    def _stop(self, claim_uid: str, record: Mapping[str, Any]) -> str | None:
        problem = Daemon(_plan(record), self.root, self.tools).stop()
        directory = Path(mps.resource_dir(self.root, record["daemon"]))
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("MPS daemon's directory not removed", path=str(directory), reason=exc.strerror or str(exc))
        with self._lock:
            self._release(claim_uid, record["devices"])
        return problem

    def undo(self, claim_uid: str, applied: Applied) -> None:
        record = applied.record
        if record.get("strategy") == MPS:
            problem = self._stop(claim_uid, record)
        elif "interval" in record:
            with self._lock:
                problem = self._reset(self._release(claim_uid, record["gpus"]))
        else:
            return
        if problem:
            raise ConfigRefused(problem)

    def forget(self, claim_uid: str) -> None:
        """Stop the MPS daemons of the claim that its directories' ``claim.json`` name (a plugin killed
        after starting one and before recording it); one without a readable note is told to quit and
        its directory removed, its GPUs' compute mode left as it is (logged)."""
        try:
            names = [n for n in os.listdir(self.root) if _DAEMON.fullmatch(n) and n.startswith(claim_uid + "-")]
        except OSError:
            return  # no root: no daemon ever ran
        for name in names:
            try:
                with ownfiles.directory(Path(self.root), name, create=False) as fd:
                    data = ownfiles.read(fd, CLAIM_FILE, CLAIM_FILE_LIMIT)
                record = read_applied(json.loads(data or b"null"), claim_uid).record
                if record.get("daemon") != name:
                    raise ValueError(f"{CLAIM_FILE} names daemon {shown(record.get('daemon'))}")
            except (OSError, ValueError, AttributeError) as exc:
                log.warning("an MPS daemon of a claim with no record, and no note of its GPUs: told to quit, its "
                            "GPUs' compute mode left as it is", claim_uid=claim_uid, daemon=name, reason=str(exc))
                record = {"daemon": name, "devices": [], "gpus": [], "pinnedMemoryLimitsMiB": {}}
            else:
                log.warning("an MPS daemon of a claim with no record (a plugin killed while preparing it); "
                            "stopping it", claim_uid=claim_uid, daemon=name)
            problem = self._stop(claim_uid, record)
            if problem:
                raise ConfigRefused(problem)

    def recover(self, claim_uid: str, applied: Applied) -> None:
        record = applied.record
        if "interval" in record:
            with self._lock:
                for gpu in record["gpus"]:
                    self._users.setdefault(gpu, {})[claim_uid] = f"{TIME_SLICING} {record['interval']}"
        if record.get("strategy") != MPS:
            return
        with self._lock:
            for uuid in record["devices"]:
                self._users.setdefault(uuid, {})[claim_uid] = MPS
        daemon = Daemon(_plan(record), self.root, self.tools)
        if daemon.healthy():
            log.info("MPS control daemon of a prepared claim found", claim_uid=claim_uid, daemon=record["daemon"])
        elif daemon.repair():
            log.warning("MPS control daemon of a prepared claim was gone; started again", claim_uid=claim_uid,
                        daemon=record["daemon"])
        else:
            log.error("MPS control daemon of a prepared claim cannot be started again", claim_uid=claim_uid,
                      daemon=record["daemon"], reason=daemon.problem)


def _pinned(sharing: Mapping[str, Any], visible: list[str], memory: Mapping[str, int]) -> dict[str, int]:
    """MiB per device UUID: the default limit on every device, then the per-device ones (by UUID, or
    by index among ``visible``); ConfigRefused for a device not among them, or a limit above its memory."""
    path = "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"
    limits = dict.fromkeys(visible, sharing["defaultPinnedDeviceMemoryLimit"]) \
        if "defaultPinnedDeviceMemoryLimit" in sharing else {}
    for key, size in sharing.get("defaultPerDevicePinnedMemoryLimit", {}).items():
        if key in memory:
            limits[key] = size
        elif key.isdigit() and int(key) < len(visible):
            limits[visible[int(key)]] = size
        else:
            raise ConfigRefused(f"{path}[{shown(key)}]: names no device of this config (its devices: "
                                f"{', '.join(visible)}, or their index 0-{len(visible) - 1})")
    for uuid, size in limits.items():
        if memory[uuid] and size > memory[uuid]:
            where = "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit" \
                if size == sharing.get("defaultPinnedDeviceMemoryLimit") else f"{path}[{shown(uuid)}]"
            raise ConfigRefused(f"{where}: {size // MIB}Mi is more than the {memory[uuid] // MIB}Mi of device {uuid}")
    return {uuid: size // MIB for uuid, size in sorted(limits.items())}


def _plan(record: Mapping[str, Any]) -> Plan:
    percentage = record.get("defaultActiveThreadPercentage")
    return Plan(record["daemon"], tuple(record["gpus"]), tuple(sorted(record["pinnedMemoryLimitsMiB"].items())),
                percentage, (("CUDA_VISIBLE_DEVICES", ",".join(record["devices"])),))


def read_applied(record: Mapping[str, Any], claim_uid: str) -> Applied:
    """What a checkpoint record says was applied; ValueError unless it is what ``apply`` records for the claim."""
    kind, strategy = record.get("kind"), record.get("strategy")
    if kind not in (GPU_CONFIG, MIG_CONFIG) or strategy not in (None, TIME_SLICING, MPS):
        raise ValueError(f"kind {shown(kind)} strategy {shown(strategy)} is not an NVIDIA config this plugin applies")
    known = {"kind", "strategy"}
    if strategy == TIME_SLICING and kind == GPU_CONFIG:
        known |= {"interval", "gpus"}
        if record.get("interval") not in INTERVALS or not _uuids(record.get("gpus")):
            raise ValueError(f"time slice {shown(record.get('interval'))} of {shown(record.get('gpus'))}")
    if strategy == MPS:
        known |= {"daemon", "devices", "gpus", "defaultActiveThreadPercentage", "pinnedMemoryLimitsMiB"}
        daemon, devices, gpus = record.get("daemon"), record.get("devices"), record.get("gpus")
        percentage, limits = record.get("defaultActiveThreadPercentage"), record.get("pinnedMemoryLimitsMiB")
        if not (isinstance(daemon, str) and _DAEMON.fullmatch(daemon) and daemon.startswith(claim_uid + "-")):
            raise ValueError(f"daemon {shown(daemon)} is not one of the claim's")
        if not _uuids(devices) or not (isinstance(gpus, list) and set(gpus) <= set(devices)):  # type: ignore[arg-type]
            raise ValueError(f"devices {shown(devices)} gpus {shown(gpus)}")
        if percentage is not None and not (type(percentage) is int and 1 <= percentage <= 100):
            raise ValueError(f"defaultActiveThreadPercentage {shown(percentage)}")
        if not (isinstance(limits, dict) and all(k in devices and type(v) is int and v > 0  # type: ignore[operator]
                                                 for k, v in limits.items())):
            raise ValueError(f"pinnedMemoryLimitsMiB {shown(limits)}")
    if set(record) - known:
        raise ValueError(f"unknown field(s) {', '.join(sorted(set(record) - known))}")
    return Applied(dict(record))


def _uuids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(u, str) and _UUID.fullmatch(u) for u in value)


API = ConfigApi(api_version=API_VERSION, kinds=(GPU_CONFIG, MIG_CONFIG), decode=decode, fits=fits,
                handler=NvidiaConfigs, read_applied=read_applied)
