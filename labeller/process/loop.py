"""The one loop of every long-running process: when to probe the node, and what wakes it.

A ``Service`` (the labelling daemon, the device plugin, the MPS supervisor) says what a probe does
with the node and what else is due between probes; ``ProcessLoop`` decides when:

- at start (after a random start jitter, so a restarting fleet does not stampede the API);
- on SIGHUP (``request_reload``): the config is read again, validate-then-swap; a config that does
  not load changes nothing, not even a probe;
- when the config follower saw the node's named config change (``config_changed``);
- when what the offer reads besides the hardware changed (``inputs``: NVIDIA's MPS readiness
  file, a simulated profile, a cheap stamp of the hardware), looked at whenever the loop is woken
  (a service whose inputs can be watched, by inotify or driver events, wakes it when they change)
  and every ``inputs_poll_s`` while ``inputs_polled()`` says some cannot be watched;
- ``interval_s`` after a probe that worked (infinite: only when asked);
- sooner after one that did not: jittered backoff, at most ``interval_s``.

A heartbeat turn (``heartbeat_s``) after a probe, once things have settled, the memory the probe
freed is given back to the system (``memory.release_free_memory``).

Every request (``stop``, ``request_reload``, ``config_changed``, ``wake``) sets a flag and then
the one wake event, and the loop clears the event before it reads the flags: a request that arrives
at any moment is seen at the next turn, never slept through.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from labeller.process.configsource import ConfigSource
from labeller.process.memory import release_free_memory
from labeller.backoff import Backoff

log = structlog.get_logger(__name__)

INPUTS_POLL_S = 1.0


class Exit(Exception):
    """Raised by a service to end the process with ``code`` (``flags.failOnInitError``)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Service(Protocol):
    """What one process does on the loop."""

    @property
    def ready(self) -> bool: ...

    def begin(self, wake: Callable[[], None], stop: threading.Event) -> None:
        """After the start jitter: start following what can change under the service; ``wake`` asks
        the loop for a turn (then ``work`` runs)."""

    def probe(self) -> str | None:
        """Probe the node and act on it: None when that worked, else why not (probed again soon)."""

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        """Probe ``attempt`` failed for ``reason``; the next comes in ``delay_s`` (log it as users expect)."""

    def recovered(self, attempts: int, waited_s: float) -> None:
        """A probe worked after ``attempts`` that did not, the first ``waited_s`` ago."""

    def work(self, now: float) -> float:
        """What is due between probes (reconcile, a supervision round); when it is due next
        (``math.inf``: only when woken)."""


@dataclass
class LoopOptions:
    interval_s: float = math.inf  # between probes that work
    start_jitter_s: float = 0.0
    inputs_poll_s: float = INPUTS_POLL_S
    stall_s: float = 300.0  # a loop that has not turned for this long is not healthy
    # A turn (a probe, a reload, a reconcile) running longer than this makes the process not ready
    # until it ends: every step is bounded (requests time out, inputs have size limits), so one
    # this slow is stuck, and the node should not count on what the process last said.
    busy_s: float = 30.0
    heartbeat_s: float = 5.0  # the loop turns at least this often, so its heartbeat tells a stall


class ProcessLoop:
    """See the module docstring. ``run()`` until ``stop()``; returns the process's exit code."""

    def __init__(self, service: Service, options: LoopOptions | None = None, *, retry: Backoff | None = None,
                 config: ConfigSource | None = None, inputs: Callable[[], object] | None = None,
                 inputs_polled: Callable[[], bool] = lambda: True) -> None:
        self.service, self.config, self.inputs, self.inputs_polled = service, config, inputs, inputs_polled
        self.options = options or LoopOptions()
        self.retry = retry or Backoff(base_s=1.0, cap_s=30.0)
        self.stopped = threading.Event()
        self.heartbeat = time.monotonic()
        self._turn_started: float | None = None  # while a turn runs: when it began
        self._wake = threading.Event()
        self._reload: str | None = None  # why: "sighup"
        self._config_changed = False
        self._inputs: object = None
        self._inputs_checked = -math.inf
        self._failing_since: float | None = None
        self._settled_at: float | None = None  # after a probe: when to give back the memory it freed
        if config is not None and config.follower is not None:
            config.follower.on_change = self.config_changed

    # -- requests: safe from signal handlers and other threads
    def stop(self) -> None:
        self.stopped.set()
        self._wake.set()

    def request_reload(self, reason: str = "sighup") -> None:
        self._reload = reason
        self._wake.set()

    def config_changed(self) -> None:
        self._config_changed = True
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    @property
    def reload_pending(self) -> bool:
        """A SIGHUP the loop has not taken yet."""
        return self._reload is not None

    def healthy(self) -> bool:
        return time.monotonic() - self.heartbeat < self.options.stall_s

    def responsive(self) -> bool:
        """False while the current turn has run longer than ``busy_s`` (see LoopOptions)."""
        started = self._turn_started
        return started is None or time.monotonic() - started < self.options.busy_s

    # -- the loop
    def run(self) -> int:
        jitter = self.options.start_jitter_s
        if jitter > 0 and self.stopped.wait(random.uniform(0, jitter)):
            return 0
        if self.config is not None and self.config.follower is not None:
            self.config.follower.poll(self.stopped)
        self.service.begin(self.wake, self.stopped)
        next_probe = time.monotonic()
        woken = False
        try:
            while True:
                self._wake.clear()  # before reading the requests: one that comes later wakes the next wait
                if self.stopped.is_set():
                    return 0
                now = self.heartbeat = self._turn_started = time.monotonic()
                if self._requests_probe(now, look=woken):
                    next_probe = now
                if now >= next_probe:
                    next_probe = now + self._probe(now)
                    self._settled_at = now + self.options.heartbeat_s
                elif self._settled_at is not None and now >= self._settled_at:
                    self._settled_at = None
                    release_free_memory()
                wake_at = min(next_probe, self.service.work(now), now + self.options.heartbeat_s)
                if self._inputs is not None and self.inputs_polled():  # None: nothing to look at
                    wake_at = min(wake_at, self._inputs_checked + self.options.inputs_poll_s)
                self._turn_ended(now)
                woken = self._wake.wait(max(0.0, wake_at - time.monotonic()))
        except Exit as exc:
            return exc.code

    def _turn_ended(self, started: float) -> None:
        self._turn_started = None
        took = time.monotonic() - started
        if took >= self.options.busy_s:
            log.warning("a turn of the loop ran long; not ready while it ran", reason="slow-turn",
                        seconds=round(took, 1), limit_s=self.options.busy_s)

    def _requests_probe(self, now: float, look: bool = False) -> bool:
        """Handle SIGHUP, a config change and changed inputs (looked at when due, or now with ``look``);
        True when the node must be probed now."""
        probe = False
        if self._reload is not None:
            reason, self._reload = self._reload, None
            log.info("reloading config and probing again", reason=reason)
            self._config_changed = False  # the reload looks at the follower's files and selection too
            probe = self.config.reload() if self.config is not None else True
        if self._config_changed:
            self._config_changed = False
            probe = self.config.apply() if self.config is not None else False
        due = now - self._inputs_checked >= self.options.inputs_poll_s
        if self.inputs is not None and (look or (due and self.inputs_polled())):
            self._inputs_checked = now
            try:
                probe = self.inputs() != self._inputs or probe
            except Exception:  # noqa: BLE001 - a failing look is no change; the probe reports the real problem
                pass
        return probe

    def _probe(self, now: float) -> float:
        """Probe once; how long until the next probe."""
        if self.inputs is not None:  # before the probe: a change during it is seen next time
            self._inputs_checked = now
            try:
                self._inputs = self.inputs()
            except Exception:  # noqa: BLE001 - as above
                self._inputs = None
        reason = self.service.probe()
        if reason is None:
            if self._failing_since is not None:
                self.service.recovered(self.retry.attempts + 1, time.monotonic() - self._failing_since)
            self._failing_since = None
            self.retry.reset()
            return self.options.interval_s
        if self._failing_since is None:
            self._failing_since = now
        delay = min(self.options.interval_s, self.retry.next())
        self.service.retrying(reason, self.retry.attempts, delay)
        return delay
