"""Device health: NVML XID events and lost GPUs, vanished KFD nodes, and recovery.

``HealthBoard`` holds the health of every health key (GPU/MIG UUID, ``kfd:<node>``) and a change
counter that ListAndWatch streams wait on. Checkers report into it:

- ``NvmlChecker``: XID critical-error events through the pynvml event API (application XIDs
  13, 31, 43, 45, 68, 109 ignored; ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` as in
  NVIDIA's plugin), and a poll that marks a GPU that stops answering NVML (lost) Unhealthy.
- ``KfdChecker``: an AMD compute node whose KFD topology node disappears is Unhealthy.

Unlike NVIDIA's plugin, a device returns to Healthy once it has answered normally, with no new
error, for ``recovery_seconds`` (0: never, NVIDIA's behaviour).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog

from labeller.plugin.resources import PhysicalDevice

log = structlog.get_logger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
WHOLE_GPU = 0xFFFFFFFF
# NVML errors that mean the GPU is gone or broken (not: no permission, not supported, ...)
LOST_ERRORS = ("GPU_IS_LOST", "GPU_NOT_FOUND", "NOT_FOUND", "RESET_REQUIRED", "IRQ_ISSUE")
KFD_TOPOLOGY_DIRS = ("sys/class/kfd/kfd/topology", "sys/devices/virtual/kfd/kfd/topology")


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
    """Which checks run, from NVIDIA's environment switches.

    ``DP_DISABLE_HEALTHCHECKS``: ``all`` turns every check off (devices stay Healthy); ``xids``
    turns XID checks off (lost GPUs and KFD nodes are still watched); otherwise a comma list of
    XIDs to ignore on top of the application XIDs. ``DP_ENABLE_HEALTHCHECKS``: a comma list of XIDs
    that are always critical, even when disabled by either list.
    """

    checks: bool = True
    all_xids_disabled: bool = False
    ignored: frozenset[int] = APPLICATION_XIDS
    forced: frozenset[int] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> HealthPolicy:
        disable = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
        forced = _xids(env.get("DP_ENABLE_HEALTHCHECKS", ""))
        if disable in ("all", "xids"):
            return cls(checks=disable == "xids" or bool(forced), all_xids_disabled=True, forced=forced)
        return cls(ignored=APPLICATION_XIDS | _xids(disable), forced=forced)

    def xid_is_critical(self, xid: int) -> bool:
        if xid in self.forced:
            return True
        return not self.all_xids_disabled and xid not in self.ignored

    @property
    def watch_xids(self) -> bool:
        return self.checks and (not self.all_xids_disabled or bool(self.forced))


HealthListener = Callable[[str, bool, str], None]  # (health key, healthy, reason)


class HealthBoard:
    """Thread-safe health of every key; ``generation`` grows on every change."""

    def __init__(self, keys: Iterable[str], recovery_seconds: float, clock: Callable[[], float] = time.monotonic):
        self._keys = frozenset(keys)
        self._recovery = recovery_seconds
        self._clock = clock
        self._last_bad: dict[str, float] = {}
        self._cond = threading.Condition()
        self._closed = False
        self.generation = 0
        self.listeners: list[HealthListener] = []

    def healthy(self, key: str) -> bool:
        return key not in self._last_bad

    def track(self, keys: Iterable[str]) -> None:
        """Follow these keys from now on (the plugin serves new devices): new keys start Healthy,
        kept keys keep their health, dropped keys are forgotten. Wakes every waiting stream."""
        with self._cond:
            self._keys = frozenset(keys)
            for key in set(self._last_bad) - self._keys:
                del self._last_bad[key]
            self.generation += 1
            self._cond.notify_all()

    def unhealthy_keys(self) -> frozenset[str]:
        with self._cond:
            return frozenset(self._last_bad)

    def mark_unhealthy(self, keys: Iterable[str], reason: str) -> None:
        now = self._clock()
        changed = []
        with self._cond:
            for key in keys:
                if key not in self._keys:
                    continue
                if key not in self._last_bad:
                    changed.append(key)
                self._last_bad[key] = now
            if changed:
                self.generation += 1
                self._cond.notify_all()
        for key in changed:
            self._tell(key, False, reason)

    def answering(self, keys: Iterable[str]) -> None:
        """The devices answered normally: recover those that have been quiet long enough."""
        if self._recovery <= 0:
            return
        now = self._clock()
        recovered = []
        with self._cond:
            for key in keys:
                since = self._last_bad.get(key)
                if since is not None and now - since >= self._recovery:
                    del self._last_bad[key]
                    recovered.append(key)
            if recovered:
                self.generation += 1
                self._cond.notify_all()
        for key in recovered:
            self._tell(key, True, f"answered normally for {self._recovery:g}s")

    def wait(self, generation: int, timeout: float, stop: Callable[[], bool] = lambda: False) -> int:
        """Block until the generation differs from ``generation``, the board closes, ``stop()`` is
        true when woken (``wake``), or timeout."""
        with self._cond:
            self._cond.wait_for(lambda: self.generation != generation or self._closed or stop(), timeout)
            return self.generation

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _tell(self, key: str, healthy: bool, reason: str) -> None:
        for listener in self.listeners:
            listener(key, healthy, reason)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlChecker:
    """XID events and lost-GPU polling through a pynvml-API module (real or simulated)."""

    def __init__(self, nvml: ModuleType, devices: Iterable[PhysicalDevice], board: HealthBoard, policy: HealthPolicy):
        self._nvml, self._board, self._policy = nvml, board, policy
        self._keys_of_gpu: dict[str, list[str]] = {}
        self._mig: dict[tuple[str, int, int], str] = {}
        for device in devices:
            if device.gpu_uuid is None:
                continue
            self._keys_of_gpu.setdefault(device.gpu_uuid, []).append(device.health_key)
            if device.mig is not None:
                self._mig[(device.gpu_uuid, *device.mig)] = device.health_key
        self._handles: dict[str, Any] = {}
        self._event_set: Any = None
        self._initialised = False

    def start(self) -> bool:
        """Initialise NVML and register for XID events; False when NVML cannot be used at all."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            log.error("NVML unavailable; continuing with health checks disabled", error=str(exc))
            return False
        self._initialised = True
        if not self._policy.watch_xids:
            return True
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.error("cannot create an NVML event set; XID health checks disabled", error=str(exc))
            return True
        for uuid, keys in self._keys_of_gpu.items():
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                mask = nvml.nvmlEventTypeXidCriticalError & nvml.nvmlDeviceGetSupportedEventTypes(handle)
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
                else:
                    log.warning("GPU does not report XID events", device=uuid)
                self._handles[uuid] = handle
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                    log.warning("GPU does not support NVML events", device=uuid)
                else:
                    self._board.mark_unhealthy(keys, f"cannot register for NVML events: {exc}")
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
    def watching_events(self) -> bool:
        return self._event_set is not None

    def wait_for_event(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for one NVML event and act on it."""
        nvml = self._nvml
        try:
            event = nvml.nvmlEventSetWait(self._event_set, timeout_ms)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                return
            self._board.mark_unhealthy(self._all_keys(), f"NVML event wait failed: {exc}")
            time.sleep(timeout_ms / 1000)
            return
        if not event.eventType & nvml.nvmlEventTypeXidCriticalError:
            log.debug("non-XID NVML event ignored", event_type=int(event.eventType))
            return
        xid = int(event.eventData)
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
        except nvml.NVMLError as exc:
            self._board.mark_unhealthy(self._all_keys(), f"XID {xid} on a GPU NVML cannot name: {exc}")
            return
        if not self._policy.xid_is_critical(xid):
            log.info("XID ignored (application error or disabled)", device=uuid, xid=xid)
            return
        keys = self._keys_for_event(uuid, int(event.gpuInstanceId), int(event.computeInstanceId))
        if not keys:
            self._board.mark_unhealthy(self._all_keys(), f"XID {xid} on unknown GPU {uuid}")
            return
        self._board.mark_unhealthy(keys, f"XID {xid}")

    def _keys_for_event(self, uuid: str, gi: int, ci: int) -> list[str]:
        if gi == WHOLE_GPU:
            return list(self._keys_of_gpu.get(uuid, ()))
        return [key for (gpu, g, c), key in self._mig.items()
                if gpu == uuid and g == gi and (ci == WHOLE_GPU or c == ci)] or list(self._keys_of_gpu.get(uuid, ()))

    def _all_keys(self) -> list[str]:
        return [key for keys in self._keys_of_gpu.values() for key in keys]

    def poll(self) -> None:
        """A GPU that NVML calls lost (or not found, or needing a reset) is Unhealthy; one that
        answers may recover. Other errors (permissions, unsupported) prove nothing either way."""
        nvml = self._nvml
        if not self._initialised:
            return
        gone = {getattr(nvml, f"NVML_ERROR_{name}", None) for name in LOST_ERRORS} - {None}
        for uuid, keys in self._keys_of_gpu.items():
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) in gone:
                    self._board.mark_unhealthy(keys, f"GPU does not answer NVML: {exc}")
                else:
                    log.debug("NVML health poll inconclusive", device=uuid, error=str(exc))
                continue
            self._board.answering(keys)


class KfdChecker:
    """An AMD compute node is there while its KFD topology node directory is."""

    def __init__(self, host_root: Path, devices: Iterable[PhysicalDevice], board: HealthBoard):
        self._board = board
        self._nodes = {d.health_key: d.kfd_node for d in devices if d.kfd_node is not None}
        self._roots = [host_root / rel / "nodes" for rel in KFD_TOPOLOGY_DIRS]

    def _present(self, node: int) -> bool:
        return any((root / str(node) / "properties").exists() for root in self._roots)

    def poll(self) -> None:
        for key, node in self._nodes.items():
            if self._present(node):
                self._board.answering([key])
            else:
                self._board.mark_unhealthy([key], f"KFD node {node} disappeared")


class HealthMonitor:
    """Runs the checkers: one thread waiting for NVML events, one polling every ``poll_seconds``."""

    def __init__(self, board: HealthBoard, nvml: NvmlChecker | None, kfd: KfdChecker | None,
                 poll_seconds: float = 0.25):
        self.board = board
        self._nvml, self._kfd = nvml, kfd
        self._poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if self._nvml is not None and not self._nvml.start():
            self._nvml = None
        if self._nvml is None and self._kfd is None:
            return
        self._spawn(self._poll_loop, "health-poll")
        if self._nvml is not None and self._nvml.watching_events:
            self._spawn(self._event_loop, "health-nvml-events")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _poll_loop(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            try:
                if self._nvml is not None:
                    self._nvml.poll()
                if self._kfd is not None:
                    self._kfd.poll()
            except Exception:  # a checker bug must not end health checking
                log.exception("health poll failed")

    def _event_loop(self) -> None:
        assert self._nvml is not None
        while not self._stop.is_set():
            try:
                self._nvml.wait_for_event(200)
            except Exception:
                log.exception("NVML event handling failed")
                self._stop.wait(1)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        if self._nvml is not None:
            self._nvml.stop()
