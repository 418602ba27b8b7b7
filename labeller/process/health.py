"""Device health, vendor-neutral: the board every check reports into, and the threads that run
the vendors' checkers (vendors/<vendor>/health.py). The device plugin and the DRA plugin share them.

``HealthBoard`` holds the health of every health key (GPU/MIG UUID, ``kfd:<node>``) and a change
counter that ListAndWatch streams wait on; it is also told when the devices themselves may have
changed (``hardware_changed``: a MIG reconfiguration NVML reports; ``look_again``: a vendor's
hardware stamp that moved), which the DRA plugin answers with a probe. ``HealthMonitor`` polls the checkers that have
something to poll (``Checker.polling``) every ``POLL_SECONDS``, each poll cheap, and the vendors'
hardware stamps when asked to (``Discovery.changes``); with nothing to poll (NVIDIA's devices all
Healthy: its events say what goes wrong) its thread sleeps until the board changes. For the
checkers that watch driver events it waits for them on a thread of its own, a few seconds per wait,
as NVIDIA's plugin does.

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

from labeller.model.offer import PhysicalDevice
from labeller.model.vendor import Vendor
from labeller.model.vendor.plugin import Checker, Fault
from labeller.base.log import get_logger

log = get_logger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
POLL_SECONDS = 1.0  # what cannot be watched (a KFD node that goes) is seen within a second
RECOVERY_POLL_SECONDS = 0.25  # while a device is Unhealthy: it is seen answering again soon after its quiet period
EVENT_WAIT_MS = 5000  # NVIDIA's plugin waits as long; a stopping monitor does not wait for it (see stop)


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
        self.hardware_changes = 0  # grows with every ``hardware_changed``
        self.hardware_listeners: list[Callable[[str], None]] = []

    def healthy(self, key: str) -> bool:
        return key not in self._last_bad

    def all_healthy(self) -> bool:
        """No key is Unhealthy (what a poll asks every second: one look, whatever the number of keys)."""
        return not self._last_bad

    def hardware_changed(self, reason: str) -> None:
        """The driver says the devices changed (``reason``: who and how): count it, tell the listeners."""
        with self._cond:
            self.hardware_changes += 1
        self.look_again(reason)

    def look_again(self, reason: str) -> None:
        """A hardware stamp may have moved: tell the listeners, who compare it with what they last read."""
        for listener in self.hardware_listeners:
            listener(reason)

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


Stamps = Mapping[str, Callable[[], object]]  # vendor -> its hardware stamp, read (Discovery.changes)


class HealthMonitor:
    """Runs the checkers: one thread polling those with something to poll, and the ``stamps``,
    every ``poll_seconds`` (every ``RECOVERY_POLL_SECONDS`` while ``recovering()``; with nothing to
    poll, sleeping until ``nudge``), and one per checker that waits for
    driver events, ``event_wait_ms`` at a time. A stamp that differs from ``seen`` (what the last
    poll read, kept by the caller across monitors), or read for the first time, is reported to
    ``changed``: the caller compares it with what it read when it last probed.

    ``stop`` does not wait for an event wait to end: a driver's wait cannot be interrupted (NVML's
    is not), and freeing what it waits on under it is not allowed, so the thread that waits stops
    its checker itself once its wait returns; a checker without events is stopped at once. ``start``
    does not wait either: a checker registers for events (``Checker.watch``) on its event thread,
    since NVML makes no event set while the monitor being replaced still waits on its own (up to
    ``event_wait_ms``), and until then it is polled."""

    def __init__(self, checkers: Iterable[Checker], poll_seconds: float = POLL_SECONDS,
                 event_wait_ms: int = EVENT_WAIT_MS, stamps: Stamps | None = None,
                 seen: dict[str, object] | None = None, changed: Callable[[str], None] = lambda reason: None,
                 recovering: Callable[[], bool] = lambda: False):
        self._checkers = list(checkers)
        self._poll_seconds = poll_seconds
        self._recovering = recovering  # a device is Unhealthy: poll every RECOVERY_POLL_SECONDS
        self._event_wait_ms = event_wait_ms
        self._stamps, self._seen, self._changed = dict(stamps or {}), seen if seen is not None else {}, changed
        self._stop = threading.Event()
        self._nudged = threading.Event()
        self._poller: threading.Thread | None = None
        self._waiting: list[Checker] = []  # the checkers an event thread stops
        self._owners = threading.Lock()  # who stops a checker whose registration failed: its thread or stop

    def start(self) -> None:
        self._checkers = [c for c in self._checkers if c.start()]
        if not self._checkers and not self._stamps:
            return
        self._poller = self._spawn(self._poll_loop, "health-poll")
        for checker in self._checkers:
            if checker.wants_events:
                self._waiting.append(checker)
                self._spawn(functools.partial(self._event_loop, checker), f"health-events-{type(checker).__name__}")

    @staticmethod
    def _spawn(target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def nudge(self) -> None:
        """Something changed (a device's health): poll now, and go on polling while there is something to."""
        self._nudged.set()

    def _busy(self) -> bool:
        return bool(self._stamps) or any(checker.polling for checker in self._checkers)

    def _poll_loop(self) -> None:
        while True:
            if self._busy():
                recovering = self._recovering()
                self._nudged.wait(min(self._poll_seconds, RECOVERY_POLL_SECONDS) if recovering else self._poll_seconds)
            else:
                self._nudged.wait()
            self._nudged.clear()
            if self._stop.is_set():
                return
            for checker in self._checkers:
                try:
                    checker.poll()
                except Exception:  # a checker bug must not end health checking
                    log.exception("health poll failed", checker=type(checker).__name__)
            self._read_stamps()

    def _read_stamps(self) -> None:
        for vendor, read in self._stamps.items():
            try:
                stamp = read()
            except Exception:  # a bug in a stamp must not end health checking: the probe finds the truth
                log.exception("hardware stamp failed", vendor=vendor)
                continue
            if vendor not in self._seen or self._seen[vendor] != stamp:
                # The first read too: the caller compares with what it read before it probed.
                if vendor in self._seen:
                    log.info("hardware changed; probing again", reason="hardware-changed", vendor=vendor)
                self._changed(f"{vendor}: hardware stamp changed")
            self._seen[vendor] = stamp

    def _event_loop(self, checker: Checker) -> None:
        try:
            watching = checker.watch()  # may wait for the replaced monitor's event wait to end
        except Exception:
            log.exception("registering for driver events failed", checker=type(checker).__name__)
            watching = False
        if not watching:  # polled from now on: stopped as a checker without events is
            with self._owners:
                self._waiting.remove(checker)
                stopped = self._stop.is_set()
            if stopped:
                if self._poller is not None:
                    self._poller.join()  # it may be polling this checker
                checker.stop()
            return
        self.nudge()  # the poll may stop polling it now
        try:
            while not self._stop.is_set():
                try:
                    checker.wait_for_event(self._event_wait_ms)
                except Exception:
                    log.exception("driver event handling failed", checker=type(checker).__name__)
                    self._stop.wait(1)
        finally:
            if self._poller is not None:
                self._poller.join()  # it may be polling this checker: only then is it done with it
            checker.stop()

    def stop(self) -> None:
        with self._owners:
            self._stop.set()
            unwatched = [checker for checker in self._checkers if checker not in self._waiting]
        self._nudged.set()
        if self._poller is not None:
            self._poller.join(timeout=2)
        for checker in unwatched:
            checker.stop()


class HealthChecks:
    """The vendors' health checkers of the physical devices a plugin serves, reporting to ``board``:
    started by ``follow``, and started again only when the devices or the host change. With
    ``stamps``, the hardware stamps of the vendors whose devices are served are polled too (health
    checks on or off), and one that moved is ``board.look_again``."""

    def __init__(self, board: HealthBoard, env: Mapping[str, str], poll_seconds: float = POLL_SECONDS,
                 stamps: bool = False) -> None:
        self.board, self.env, self.poll_seconds, self.stamps = board, env, poll_seconds, stamps
        self._monitor: HealthMonitor | None = None
        self._watched: tuple[frozenset[PhysicalDevice], Path, tuple[tuple[str, Any], ...]] | None = None
        self._seen: dict[str, object] = {}  # vendor -> its stamp as last polled, across monitors
        board.listeners.append(lambda key, healthy, reason: self._nudge())

    def _nudge(self) -> None:
        monitor = self._monitor
        if monitor is not None:
            monitor.nudge()

    def follow(self, physical: Iterable[PhysicalDevice], host_root: Path, handles: Mapping[str, Any],
               vendors: Sequence[Vendor]) -> None:
        watched = (frozenset(physical), host_root, tuple(sorted(handles.items())))
        if watched == self._watched:
            return
        self.stop()
        served = {p.vendor for p in watched[0]}
        stamps = {v.name: functools.partial(v.discovery.changes, host_root) for v in vendors
                  if self.stamps and v.name in served and v.discovery.changes is not None}
        self._monitor = HealthMonitor(self._checkers(list(watched[0]), host_root, handles, vendors),
                                      poll_seconds=self.poll_seconds, stamps=stamps, seen=self._seen,
                                      changed=self.board.look_again,
                                      recovering=lambda: not self.board.all_healthy())
        self._monitor.start()
        self._watched = watched

    @property
    def polls_stamps(self) -> bool:
        """The vendors' hardware stamps are polled here (a change wakes the plugin)."""
        return self.stamps and self._monitor is not None

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
