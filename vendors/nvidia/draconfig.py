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
- ``MPS`` on a GPU the claim holds as a memory share (``sharing.memory``: consumable capacity, the
  allocation's ``consumedCapacity``): the GPU's shared control daemon, ``<mps root>/shares-<12+5 hex
  digits of the GPU UUID's SHA-256>`` (``gpu.json`` there names the GPU), started for its first such
  share and stopped after its last, serves every share of that GPU; each claim's containers are told
  their limit, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M`` (the share, or a lower limit the config
  gives; a higher one is refused), and the config's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, as MPS
  clients that share one server (as ECS's MPS sharing does). One GPU per config (a client reaches one
  daemon). A share without MPS on a GPU under an MPS daemon (EXCLUSIVE_PROCESS: only MPS clients
  run) is refused, and so is MPS for a GPU that claims without MPS share (``blocked``, ``Share.others``):
  give the MPS config to the DeviceClass so that every claim of a node's shared GPUs has it.

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

from labeller.base import ownfiles
from labeller.model import quantity
from labeller.model.resourceslices import DraDevice
from labeller.model.vendor.dra import (Applied, ConfigApi, ConfigRefused, ConfigSettings, DeviceConfig, Share, fields,
                                 shown, type_meta)
from vendors.nvidia import mps
from vendors.nvidia.devices import NvidiaDevice
from vendors.nvidia.facts import MIB
from vendors.nvidia.mpscontrol import CommandFailed, Daemon, Plan, Tools, set_timeslice
from labeller.base.log import get_logger

log = get_logger(__name__)

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
MPS_SHARES = "MPS shares"  # a use of a GPU: memory shares under the GPU's shared control daemon
GPU_FILE = "gpu.json"  # in a shared daemon's directory: the GPU it serves
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}  # NVIDIA's TimeSliceInterval.Int()
MPS_FIELDS = ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit")
CLAIM_FILE = "claim.json"  # in a daemon's directory: what it was started for (its checkpoint entry)
CLAIM_FILE_LIMIT = 16 * 1024
CONTAINER_PIPE = "/tmp/nvidia-mps"  # where a claim's containers see the daemon's pipe directory (NVIDIA's)
MOUNT_OPTIONS = ["rw", "nosuid", "nodev", "bind"]
_DAEMON = re.compile(r"[0-9A-Za-z][-0-9A-Za-z]{0,127}-[0-9a-f]{5}")
_UUID = re.compile(r"(GPU|MIG)-[-0-9A-Za-z/]{1,120}")
_SHARES_DAEMON = re.compile(r"shares-[0-9a-f]{12}-[0-9a-f]{5}")


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


def shares_daemon_id(uuid: str) -> str:
    """The shared control daemon of a GPU's memory shares: ``shares-`` and 12 + 5 hex digits of the
    GPU UUID's SHA-256 (the form of a claim's daemon ID, which ends in 5 hex digits)."""
    digest = hashlib.sha256(uuid.encode()).hexdigest()
    return f"shares-{digest[:12]}-{digest[12:17]}"


def _shares_plan(uuid: str) -> Plan:
    """The shared daemon of a GPU: no default limits (each client is told its own), its GPU alone."""
    return Plan(shares_daemon_id(uuid), (uuid,), (), None, (("CUDA_VISIBLE_DEVICES", uuid),))


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

    def apply(self, claim_uid: str, config: DeviceConfig, devices: Sequence[DraDevice],
              shares: Mapping[str, Share] | None = None) -> Applied:
        sharing = config.settings.get("sharing")
        if not sharing or (sharing["strategy"] == TIME_SLICING and config.kind == MIG_CONFIG):
            return Applied({"kind": config.kind, **({"strategy": sharing["strategy"]} if sharing else {})})
        if sharing["strategy"] == TIME_SLICING:
            return self._time_slice(claim_uid, sorted(_uuid(d) for d in devices), sharing["interval"])
        if shares and any(d.name in shares for d in devices):
            return self._mps_shares(claim_uid, config, devices, sharing, shares)
        return self._mps(claim_uid, config, devices, sharing)

    def blocked(self, claim_uid: str, devices: Sequence[DraDevice]) -> str | None:
        """A device under another claim's MPS daemon runs MPS clients only (EXCLUSIVE_PROCESS)."""
        with self._lock:
            for device in devices:
                uuid = _uuid(device)
                users = self._users.get(uuid, {})
                under = sorted(o for o, use in users.items() if o != claim_uid and use.startswith(MPS))
                if under:
                    return (f"device {device.name} ({uuid}) runs under the MPS control daemon of claim(s) "
                            f"{', '.join(under[:3])} (compute mode EXCLUSIVE_PROCESS): a claim sharing it needs an MPS "
                            "config too (a GpuConfig with sharing.strategy MPS, on the claim or its DeviceClass)")
        return None

    def _mps_shares(self, claim_uid: str, config: DeviceConfig, devices: Sequence[DraDevice],
                    sharing: Mapping[str, Any], shares: Mapping[str, Share]) -> Applied:
        """MPS for the claim's share of one GPU: the GPU's shared daemon, the share as the client's limit."""
        if len(devices) != 1 or devices[0].name not in shares:
            raise ConfigRefused(f"sharing.strategy: MPS over memory shares: one GPU per config (a client reaches one "
                                f"control daemon, one per GPU), not {', '.join(d.name for d in devices)}")
        device, share = devices[0], shares[devices[0].name]
        uuid = _uuid(device)
        mib = _pinned(sharing, [uuid], {uuid: share.memory}, "the claim's share of device").get(
            uuid, share.memory // MIB)
        daemon_name = shares_daemon_id(uuid)
        record: dict[str, Any] = {"kind": config.kind, "strategy": MPS, "shares": True, "daemon": daemon_name,
                  "devices": [uuid], "gpus": [uuid], "pinnedMemoryLimitsMiB": {uuid: mib},
                  "defaultActiveThreadPercentage": sharing.get("defaultActiveThreadPercentage")}
        with self._lock:
            plain = sorted(o for o in share.others if o not in self._users.get(uuid, {}))
            if plain:
                raise ConfigRefused(f"sharing.strategy: MPS: device {device.name} ({uuid}) is shared by claim(s) "
                                    f"{', '.join(plain[:3])} without MPS; its GPU cannot be put under an MPS control "
                                    "daemon (EXCLUSIVE_PROCESS) while they hold it")
            self._take(claim_uid, [uuid], MPS_SHARES)
            daemon = Daemon(_shares_plan(uuid), self.root, self.tools)
            try:
                Path(mps.shm_dir(self.root)).mkdir(mode=0o755, parents=True, exist_ok=True)
                with ownfiles.directory(Path(self.root), daemon_name) as fd:
                    ownfiles.replace(fd, GPU_FILE, json.dumps({"gpu": uuid}).encode(), 0o600)
                started = daemon.healthy() or daemon.repair()
            except OSError as exc:
                started, daemon.problem = False, f"{exc.filename or self.root}: {exc.strerror or exc}"
            if not started:
                self._leave_shares(claim_uid, uuid)
                raise ConfigRefused(f"sharing.strategy: MPS: the control daemon for the shares of {uuid} did not "
                                    f"start: {daemon.problem}")
        log.info("MPS control daemon serves the claim's memory share", claim_uid=claim_uid, daemon=record["daemon"],
                 device=uuid, pinned_mib=mib, thread_percentage=record["defaultActiveThreadPercentage"])
        edits = self._edits(record)
        edits["env"] = [*edits["env"], f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mib}M",
                        *([f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={record['defaultActiveThreadPercentage']}"]
                          if record["defaultActiveThreadPercentage"] is not None else [])]
        return Applied(record, edits)

    def _leave_shares(self, claim_uid: str, uuid: str) -> str | None:
        """The claim no longer shares ``uuid`` under MPS (lock held); after the last share, its daemon
        quits and the GPU's compute mode is DEFAULT again. What could not be done, or None."""
        self._release(claim_uid, [uuid])
        if any(use == MPS_SHARES for use in self._users.get(uuid, {}).values()):
            return None
        return self._quit(_shares_plan(uuid))

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
        problem = self._quit(_plan(record))
        with self._lock:
            self._release(claim_uid, record["devices"])
        return problem

    def _quit(self, plan: Plan) -> str | None:
        """The daemon quits, its GPUs' compute mode back to DEFAULT, its directory removed."""
        problem = Daemon(plan, self.root, self.tools).stop()
        directory = Path(mps.resource_dir(self.root, plan.name))
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("MPS daemon's directory not removed", path=str(directory), reason=exc.strerror or str(exc))
        return problem

    def undo(self, claim_uid: str, applied: Applied) -> None:
        record = applied.record
        if record.get("shares"):
            with self._lock:
                problem = self._leave_shares(claim_uid, record["devices"][0])
        elif record.get("strategy") == MPS:
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
            found = os.listdir(self.root)
        except OSError:
            return  # no root: no daemon ever ran
        self._forget_shares([n for n in found if _SHARES_DAEMON.fullmatch(n)])
        names = [n for n in found if _DAEMON.fullmatch(n) and n.startswith(claim_uid + "-")]
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

    def _forget_shares(self, names: Sequence[str]) -> None:
        """Shared daemons no prepared claim uses (a plugin killed between starting one for a GPU's first
        share and recording it, and that claim unprepared since) quit."""
        for name in names:
            try:
                with ownfiles.directory(Path(self.root), name, create=False) as fd:
                    uuid = json.loads(ownfiles.read(fd, GPU_FILE, CLAIM_FILE_LIMIT) or b"null")["gpu"]
                if not (isinstance(uuid, str) and _UUID.fullmatch(uuid) and shares_daemon_id(uuid) == name):
                    raise ValueError(f"{GPU_FILE} names {shown(uuid)}")
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("a shared MPS daemon's directory without a readable note of its GPU; left alone",
                            daemon=name, reason=str(exc))
                continue
            with self._lock:
                if not any(use == MPS_SHARES for use in self._users.get(uuid, {}).values()):
                    log.warning("a shared MPS daemon no prepared claim uses; stopping it", daemon=name, device=uuid)
                    problem = self._quit(_shares_plan(uuid))
                    if problem:
                        raise ConfigRefused(problem)

    def recover(self, claim_uid: str, applied: Applied) -> None:
        record = applied.record
        if record.get("shares"):
            uuid = record["devices"][0]
            with self._lock:
                self._users.setdefault(uuid, {})[claim_uid] = MPS_SHARES
                daemon = Daemon(_shares_plan(uuid), self.root, self.tools)
                if not daemon.healthy() and not daemon.repair():
                    log.error("the shared MPS control daemon of a prepared claim's GPU cannot be started again",
                              claim_uid=claim_uid, daemon=record["daemon"], reason=daemon.problem)
            return
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


def _pinned(sharing: Mapping[str, Any], visible: list[str], memory: Mapping[str, int], of: str = "device"
            ) -> dict[str, int]:
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
            raise ConfigRefused(f"{where}: {size // MIB}Mi is more than the {memory[uuid] // MIB}Mi of {of} {uuid}")
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
        known |= {"daemon", "devices", "gpus", "defaultActiveThreadPercentage", "pinnedMemoryLimitsMiB", "shares"}
        daemon, devices, gpus = record.get("daemon"), record.get("devices"), record.get("gpus")
        percentage, limits = record.get("defaultActiveThreadPercentage"), record.get("pinnedMemoryLimitsMiB")
        if record.get("shares", False) is not False:
            if not (record["shares"] is True and _uuids(devices) and len(devices) == 1  # type: ignore[arg-type]
                    and gpus == devices and daemon == shares_daemon_id(devices[0])):  # type: ignore[index]
                raise ValueError(f"shares of {shown(devices)} under daemon {shown(daemon)}")
        elif not (isinstance(daemon, str) and _DAEMON.fullmatch(daemon) and daemon.startswith(claim_uid + "-")):
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
