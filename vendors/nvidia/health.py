"""NVIDIA device health, as NVIDIA's plugin checks it: XID critical-error events through NVML's
event API, and NVML's GPU-unavailable event (a GPU that fell off the bus: lost; a driver without
that event reports XID 79), plus a poll, while a device is Unhealthy, that sees it answer again (or
marks a GPU that stops answering NVML, lost, Unhealthy; without events, the poll is the only check
and runs always). NVML's MIG configuration change events (GPU or compute instances created or
destroyed) are passed on as a hardware change: the plugin probes.

Application XIDs (13, 31, 43, 45, 68, 109) are ignored; ``DP_DISABLE_HEALTHCHECKS`` and
``DP_ENABLE_HEALTHCHECKS`` work as in NVIDIA's plugin (``HealthPolicy``). A MIG device's event
marks only that MIG device when NVML names its instance.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from labeller.model.offer import PhysicalDevice
from labeller.model.vendor.plugin import Fault, HealthReporter
from vendors.nvidia.devices import NvidiaDevice
from vendors.nvidia.facts import WHOLE_GPU
from vendors.nvidia.nvml import load
from labeller.base.log import get_logger

log = get_logger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# NVML errors that mean the GPU is gone or broken (not: no permission, not supported, ...)
LOST_ERRORS = ("GPU_IS_LOST", "GPU_NOT_FOUND", "NOT_FOUND", "RESET_REQUIRED", "IRQ_ISSUE")


def _xids(value: str) -> frozenset[int]:
    out = set()
    for part in value.split(","):
        part = part.strip()
        if part.isdigit():
            out.add(int(part))
        elif part:
            log.warning("ignoring a health-check XID that is not a number", value=part)
    return frozenset(out)


@dataclass(frozen=True)
class HealthPolicy:
    """Which XIDs count, from NVIDIA's environment switches.

    ``DP_DISABLE_HEALTHCHECKS``: ``all`` or ``xids`` turns XID checks off (with ``all`` the plugin
    runs no checks at all, see labeller.process.health); otherwise a comma list of XIDs to ignore on
    top of the application XIDs. ``DP_ENABLE_HEALTHCHECKS``: a comma list of XIDs that are always
    critical, even when disabled by either list.
    """

    all_xids_disabled: bool = False
    ignored: frozenset[int] = APPLICATION_XIDS
    forced: frozenset[int] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HealthPolicy:
        disable = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
        forced = _xids(env.get("DP_ENABLE_HEALTHCHECKS", ""))
        if disable in ("all", "xids"):
            return cls(all_xids_disabled=True, forced=forced)
        return cls(ignored=APPLICATION_XIDS | _xids(disable), forced=forced)

    def xid_is_critical(self, xid: int) -> bool:
        if xid in self.forced:
            return True
        return not self.all_xids_disabled and xid not in self.ignored

    @property
    def watch_xids(self) -> bool:
        return not self.all_xids_disabled or bool(self.forced)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mig_change(nvml: ModuleType) -> int:
    """NVML's MIG configuration change event type (0 for a pynvml without it)."""
    return int(getattr(nvml, "nvmlEventMigConfigChange", 0))


def _unavailable(nvml: ModuleType) -> int:
    """NVML's GPU-unavailable event type, for a GPU that fell off the bus (0 for a pynvml without it)."""
    return int(getattr(nvml, "nvmlEventTypeGpuUnavailableError", 0))


def _address(handle: Any) -> int | None:
    """What a pynvml device handle points at (two handles of one GPU are two ctypes objects); None
    for a handle that is not a pointer (the simulated NVML's)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class NvmlChecker:
    """XID events and lost-GPU polling through a pynvml-API module (real or simulated)."""

    def __init__(self, nvml: ModuleType, devices: Iterable[PhysicalDevice], board: HealthReporter,
                 policy: HealthPolicy):
        self._nvml, self._board, self._policy = nvml, board, policy
        self._keys_of_gpu: dict[str, list[str]] = {}
        self._mig: dict[tuple[str, int, int], str] = {}
        for device in devices:
            if not isinstance(device, NvidiaDevice):
                continue
            uuid = device.nvml_gpu.uuid
            self._keys_of_gpu.setdefault(uuid, []).append(device.health_key)
            if device.mig_ids is not None:
                self._mig[(uuid, *device.mig_ids)] = device.health_key
        self._handles: dict[str, Any] = {}
        self._event_set: Any = None
        self._initialised = False

    def start(self) -> bool:
        """Initialise NVML; False when NVML cannot be used at all."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            log.error("NVML unavailable; continuing with health checks disabled", error=str(exc))
            return False
        self._initialised = True
        return True

    @property
    def wants_events(self) -> bool:
        return self._initialised and self._policy.watch_xids

    def watch(self) -> bool:
        """Register for XID, GPU-unavailable and MIG-change events. NVML creates no event set while
        another thread waits on one (a monitor being replaced): this waits for that wait to end, on
        the event thread, while the poll looks after the devices."""
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.error("cannot create an NVML event set; XID health checks disabled", error=str(exc))
            return False
        wanted = nvml.nvmlEventTypeXidCriticalError | _mig_change(nvml) | _unavailable(nvml)
        handles: dict[str, Any] = {}
        for uuid, keys in self._keys_of_gpu.items():
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                mask = wanted & nvml.nvmlDeviceGetSupportedEventTypes(handle)
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                if not mask & nvml.nvmlEventTypeXidCriticalError:
                    log.warning("GPU does not report XID events", device=uuid)
                handles[uuid] = handle
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                    log.warning("GPU does not support NVML events", device=uuid)
                else:
                    self._board.mark_unhealthy(keys, Fault(f"cannot register for NVML events: {exc}",
                                                           Fault.UNMONITORED))
        self._handles, self._event_set = handles, event_set
        return True

    def stop(self) -> None:
        nvml = self._nvml
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError:
                pass
            self._event_set = None
        if self._initialised:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass
            self._initialised = False

    @property
    def watches_events(self) -> bool:
        return self._event_set is not None

    @property
    def polling(self) -> bool:
        """Without events, the poll is the check; with them, only while a device is Unhealthy."""
        return self._initialised and (not self.watches_events
                                      or not all(self._board.healthy(key) for key in self._all_keys()))

    def wait_for_event(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for one NVML event and act on it."""
        nvml = self._nvml
        try:
            event = nvml.nvmlEventSetWait(self._event_set, timeout_ms)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                return
            lost = getattr(exc, "value", None) in self._lost_errors()
            self._board.mark_unhealthy(self._all_keys(), Fault(f"NVML event wait failed: {exc}",
                                                               Fault.LOST if lost else Fault.UNMONITORED))
            time.sleep(timeout_ms / 1000)
            return
        if event.eventType & _mig_change(nvml):
            device = self._name(event.device)
            log.info("MIG configuration changed; probing again", reason="hardware-changed", device=device)
            self._board.hardware_changed(f"MIG configuration changed on {device}")
            return
        if event.eventType & _unavailable(nvml):
            try:
                keys = list(self._keys_of_gpu.get(self._uuid_of(event.device), ())) or self._all_keys()
            except nvml.NVMLError:
                keys = self._all_keys()
            self._board.mark_unhealthy(keys, Fault("GPU unavailable (NVML event)", Fault.LOST))
            return
        if not event.eventType & nvml.nvmlEventTypeXidCriticalError:
            log.debug("non-XID NVML event ignored", event_type=int(event.eventType))
            return
        xid = int(event.eventData)
        try:
            uuid = self._uuid_of(event.device)
        except nvml.NVMLError as exc:
            self._board.mark_unhealthy(self._all_keys(),
                                       Fault(f"XID {xid} on a GPU NVML cannot name: {exc}", Fault.XID, xid))
            return
        if not self._policy.xid_is_critical(xid):
            log.info("XID ignored (application error or disabled)", device=uuid, xid=xid)
            return
        keys = self._keys_for_event(uuid, int(event.gpuInstanceId), int(event.computeInstanceId))
        if not keys:
            self._board.mark_unhealthy(self._all_keys(), Fault(f"XID {xid} on unknown GPU {uuid}", Fault.XID, xid))
            return
        self._board.mark_unhealthy(keys, Fault(f"XID {xid}", Fault.XID, xid))

    def _uuid_of(self, device: Any) -> str:
        """The UUID of an event's device: NVML's answer, else the GPU whose handle it is (a GPU that fell
        off the bus may not answer even that); NVMLError when neither."""
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(device))
        except self._nvml.NVMLError:
            address = _address(device)
            for uuid, handle in self._handles.items():
                if handle is device or (address is not None and _address(handle) == address):
                    return uuid
            raise

    def _name(self, device: Any) -> str:
        try:
            return self._uuid_of(device)
        except self._nvml.NVMLError:
            return "a GPU NVML cannot name"

    def _keys_for_event(self, uuid: str, gi: int, ci: int) -> list[str]:
        if gi == WHOLE_GPU:
            return list(self._keys_of_gpu.get(uuid, ()))
        return [key for (gpu, g, c), key in self._mig.items()
                if gpu == uuid and g == gi and (ci == WHOLE_GPU or c == ci)] or list(self._keys_of_gpu.get(uuid, ()))

    def _all_keys(self) -> list[str]:
        return [key for keys in self._keys_of_gpu.values() for key in keys]

    def poll(self) -> None:
        """A GPU that NVML calls lost (or not found, or needing a reset) is Unhealthy; one that
        answers may recover. Other errors (permissions, unsupported) prove nothing either way.
        While XID events are watched and every device is Healthy, nothing is asked: the events say
        what goes wrong."""
        nvml = self._nvml
        if not self.polling:
            return
        gone = self._lost_errors()
        for uuid, keys in self._keys_of_gpu.items():
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) in gone:
                    self._board.mark_unhealthy(keys, Fault(f"GPU does not answer NVML: {exc}", Fault.LOST))
                else:
                    log.debug("NVML health poll inconclusive", device=uuid, error=str(exc))
                continue
            self._board.answering(keys)

    def _lost_errors(self) -> set[Any]:
        return {getattr(self._nvml, f"NVML_ERROR_{name}", None) for name in LOST_ERRORS} - {None}




def checker(devices: Sequence[PhysicalDevice], board: HealthReporter, host_root: Path, handle: Any,
            env: Mapping[str, str]) -> NvmlChecker:
    """The NVIDIA checker for ``devices`` (``handle``: a simulation's pynvml, else the real one)."""
    return NvmlChecker(load(handle), devices, board, HealthPolicy.from_env(env))
