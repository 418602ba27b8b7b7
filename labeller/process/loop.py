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
  and every ``inputs_poll_s`` while ``inputs_polled()`` says some cannot be watched (``InputsWatch``);
- ``interval_s`` after a probe that worked (infinite: only when asked);
- sooner after one that did not: jittered backoff, at most ``interval_s`` (``ProbeRetry``).

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

from labeller.process.configsource import ConfigSource
from labeller.process.memory import release_free_memory
from labeller.base.backoff import Backoff
from labeller.base.log import get_logger

log = get_logger(__name__)

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


class InputsWatch:
    """What the offer reads besides the hardware (``read``: a cheap stamp of it), as the last probe
    saw it: a change is a probe now. Looked at when the loop is woken, and every ``poll_s`` while
    ``polled()`` says some of it cannot be watched. The loop's thread only."""

    def __init__(self, read: Callable[[], object] | None, polled: Callable[[], bool], poll_s: float) -> None:
        self.read, self.polled, self.poll_s = read, polled, poll_s
        self._probed: object = None  # what the last probe read; None: nothing to look at
        self._checked = -math.inf  # when it was last read

    def probing(self, now: float) -> None:
        """Before a probe: what it reads (a change during the probe is seen at the next look)."""
        if self.read is None:
            return
        self._checked = now
        try:
            self._probed = self.read()
        except Exception:  # noqa: BLE001 - a failing look is no change; the probe reports the real problem
            self._probed = None

    def changed(self, now: float, look: bool) -> bool:
        """Whether the inputs changed since the last probe, looked at when due, or now with ``look``."""
        due = now - self._checked >= self.poll_s
        if self.read is None or not (look or (due and self.polled())):
            return False
        self._checked = now
        try:
            return self.read() != self._probed
        except Exception:  # noqa: BLE001 - as above
            return False

    def next_look(self) -> float:
        """When the inputs are due to be looked at (``math.inf``: only when the loop is woken)."""
        if self._probed is not None and self.polled():
            return self._checked + self.poll_s
        return math.inf


class ProbeRetry:
    """After a probe that failed, when to probe again (jittered backoff, at most ``interval_s``), and
    the service told of each failure and of the recovery. The loop's thread only."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self._failing_since: float | None = None  # the first failure of the current run of them

    def worked(self, service: Service) -> None:
        if self._failing_since is not None:
            service.recovered(self.backoff.attempts + 1, time.monotonic() - self._failing_since)
        self._failing_since = None
        self.backoff.reset()

    def failed(self, service: Service, reason: str, now: float, interval_s: float) -> float:
        """How long until the next probe."""
        if self._failing_since is None:
            self._failing_since = now
        delay = min(interval_s, self.backoff.next())
        service.retrying(reason, self.backoff.attempts, delay)
        return delay


class ProcessLoop:
    """See the module docstring. ``run()`` until ``stop()``; returns the process's exit code."""

    def __init__(self, service: Service, options: LoopOptions | None = None, *, retry: Backoff | None = None,
                 config: ConfigSource | None = None, inputs: Callable[[], object] | None = None,
                 inputs_polled: Callable[[], bool] = lambda: True) -> None:
        self.service, self.config = service, config
        self.options = options or LoopOptions()
        self.inputs = InputsWatch(inputs, inputs_polled, self.options.inputs_poll_s)
        self.retry = ProbeRetry(retry or Backoff(base_s=1.0, cap_s=30.0))
        self.stopped = threading.Event()
        self.heartbeat = time.monotonic()
        self._turn_started: float | None = None  # while a turn runs: when it began
        self._wake = threading.Event()
        self._reload: str | None = None  # why: "sighup"
        self._config_changed = False
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
                wake_at = min(next_probe, self.service.work(now), now + self.options.heartbeat_s,
                              self.inputs.next_look())
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
        return self.inputs.changed(now, look) or probe

    def _probe(self, now: float) -> float:
        """Probe once; how long until the next probe."""
        self.inputs.probing(now)
        reason = self.service.probe()
        if reason is None:
            self.retry.worked(self.service)
            return self.options.interval_s
        return self.retry.failed(self.service, reason, now, self.options.interval_s)
