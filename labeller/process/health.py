"""Device health, vendor-neutral: the board every check reports into, and the threads that run
the vendors' checkers (vendors/<vendor>/health.py). The device plugin and the DRA plugin share them.

``HealthBoard`` holds the health of every health key (GPU/MIG UUID, ``kfd:<node>``) and a change
counter that ListAndWatch streams wait on. ``HealthMonitor`` polls every checker and, for those
that watch driver events, waits for the events on a thread of its own.

Unlike NVIDIA's plugin, a device returns to Healthy once it has answered normally, with no new
error, for ``recovery_seconds`` (0: never, NVIDIA's behaviour). ``DP_DISABLE_HEALTHCHECKS=all``
(without ``DP_ENABLE_HEALTHCHECKS``) turns every vendor's checks off, as in NVIDIA's plugin.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from labeller.offer import PhysicalDevice
from labeller.vendor import Vendor
from labeller.vendor.plugin import Checker, Fault

log = structlog.get_logger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def checks_enabled(env: Mapping[str, str]) -> bool:
    """False when ``DP_DISABLE_HEALTHCHECKS=all`` and no XID is forced on."""
    disabled = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower() == "all"
    return not disabled or bool(env.get("DP_ENABLE_HEALTHCHECKS", "").strip())


HealthListener = Callable[[str, bool, str], None]  # (health key, healthy, reason)
FaultListener = Callable[[str, str], None]  # (health key, its new reason)


class HealthBoard:
    """Thread-safe health of every key; ``generation`` grows on every change. ``listeners`` are told
    when a key turns Unhealthy or Healthy; ``fault_listeners`` when a key already Unhealthy is marked
    for a fault of a kind it was not marked for yet, or another code of it (``Fault``: an XID, then
    the GPU lost; XID 48, then 79); ``faults`` says the reasons of each unhealthy key, the latest of
    each kind. They are forgotten when the key recovers."""

    def __init__(self, keys: Iterable[str], recovery_seconds: float, clock: Callable[[], float] = time.monotonic):
        self._keys = frozenset(keys)
        self._recovery = recovery_seconds
        self._clock = clock
        self._last_bad: dict[str, float] = {}
        self._faults: dict[str, dict[str, str]] = {}  # unhealthy key -> fault kind -> the latest reason of it
        self._cond = threading.Condition()
        self._closed = False
        self.generation = 0
        self.listeners: list[HealthListener] = []
        self.fault_listeners: list[FaultListener] = []

    def healthy(self, key: str) -> bool:
        return key not in self._last_bad

    def track(self, keys: Iterable[str]) -> None:
        """Follow these keys from now on (the plugin serves new devices): new keys start Healthy,
        kept keys keep their health, dropped keys are forgotten. Wakes every waiting stream."""
        with self._cond:
            self._keys = frozenset(keys)
            for key in set(self._last_bad) - self._keys:
                del self._last_bad[key]
                self._faults.pop(key, None)
            self.generation += 1
            self._cond.notify_all()

    def unhealthy_keys(self) -> frozenset[str]:
        with self._cond:
            return frozenset(self._last_bad)

    def faults(self) -> dict[str, tuple[str, ...]]:
        """Every unhealthy key with its reasons: the latest of each kind of fault, in kind order."""
        with self._cond:
            return {key: tuple(reason for _, reason in sorted(self._faults.get(key, {}).items()))
                    for key in self._last_bad}

    def mark_unhealthy(self, keys: Iterable[str], reason: str) -> None:
        now = self._clock()
        changed, refaulted = [], []
        with self._cond:
            for key in keys:
                if key not in self._keys:
                    continue
                kinds = self._faults.setdefault(key, {})
                kind, code = Fault.kind_of(reason)
                if key not in self._last_bad:
                    changed.append(key)
                elif kind not in kinds or Fault.kind_of(kinds[kind])[1] != code:
                    refaulted.append(key)
                kinds[kind] = reason
                self._last_bad[key] = now
            if changed:
                self.generation += 1
                self._cond.notify_all()
        for key in changed:
            self._tell(key, False, reason)
        for key in refaulted:
            for fault_listener in self.fault_listeners:
                fault_listener(key, reason)

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
                    self._faults.pop(key, None)
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


class HealthMonitor:
    """Runs the checkers: one thread polling them all every ``poll_seconds``, and one per checker
    that waits for driver events."""

    def __init__(self, checkers: Iterable[Checker], poll_seconds: float = 0.25):
        self._checkers = list(checkers)
        self._poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._checkers = [c for c in self._checkers if c.start()]
        if not self._checkers:
            return
        self._spawn(self._poll_loop, "health-poll")
        for checker in self._checkers:
            if checker.watches_events:
                self._spawn(functools.partial(self._event_loop, checker), f"health-events-{type(checker).__name__}")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _poll_loop(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            for checker in self._checkers:
                try:
                    checker.poll()
                except Exception:  # a checker bug must not end health checking
                    log.exception("health poll failed", checker=type(checker).__name__)

    def _event_loop(self, checker: Checker) -> None:
        while not self._stop.is_set():
            try:
                checker.wait_for_event(200)
            except Exception:
                log.exception("driver event handling failed", checker=type(checker).__name__)
                self._stop.wait(1)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        for checker in self._checkers:
            checker.stop()


class HealthChecks:
    """The vendors' health checkers of the physical devices a plugin serves, reporting to ``board``:
    started by ``follow``, and started again only when the devices or the host change."""

    def __init__(self, board: HealthBoard, env: Mapping[str, str], poll_seconds: float) -> None:
        self.board, self.env, self.poll_seconds = board, env, poll_seconds
        self._monitor: HealthMonitor | None = None
        self._watched: tuple[frozenset[PhysicalDevice], Path, tuple[tuple[str, Any], ...]] | None = None

    def follow(self, physical: Iterable[PhysicalDevice], host_root: Path, handles: Mapping[str, Any],
               vendors: Sequence[Vendor]) -> None:
        watched = (frozenset(physical), host_root, tuple(sorted(handles.items())))
        if watched == self._watched:
            return
        self.stop()
        self._monitor = HealthMonitor(self._checkers(list(watched[0]), host_root, handles, vendors),
                                      poll_seconds=self.poll_seconds)
        self._monitor.start()
        self._watched = watched

    def _checkers(self, physical: list[PhysicalDevice], host_root: Path, handles: Mapping[str, Any],
                  vendors: Sequence[Vendor]) -> list[Checker]:
        if not checks_enabled(self.env):
            if physical:
                log.warning("health checks disabled (DP_DISABLE_HEALTHCHECKS=all)")
            return []
        checkers = []
        for vendor in vendors:
            devices = [p for p in physical if p.vendor == vendor.name]
            if devices:
                checker = vendor.devices.plugin_parts().checker(devices, self.board, host_root,
                                                                handles.get(vendor.name), self.env)
                if checker is not None:
                    checkers.append(checker)
        return checkers

    def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.stop()
            self._monitor = None
