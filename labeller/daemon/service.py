"""The labelling daemon: keep the owned labels of one Node equal to what the hardware says.

``Daemon`` is the ``run`` command's service on the process loop (``labeller.process.loop``), which
probes on an interval and on SIGHUP: it compares the probe's labels with the live labels that a
``Sink`` reports and writes through the sink only when they differ, and again whenever the sink
says the live labels changed (``kick``). The decisions it takes are pure functions in
``labeller.daemon.reconcile``; the I/O is in ``labeller.daemon.sinks``, whose errors are the only
ones it handles: the daemon never sees the Kubernetes client.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from labeller.daemon.reconcile import (
    Change,
    FightGuard,
    Labels,
    Live,
    Owned,
    ProbeResult,
    desired_after,
    managers_text,
    plan,
)
from labeller.cluster.permissions import PermissionLog
from labeller.daemon.sinks import NodeMissing, NotOurs, PermissionDenied, Sink, SinkError, Unavailable
from labeller.inventory import ProbeError
from labeller.backoff import Backoff
from labeller.process.loop import LoopOptions

if TYPE_CHECKING:
    from labeller.daemon.metrics import Metrics

log = structlog.get_logger("gpu_labeller.daemon")

SUCCESS = ("unchanged", "applied", "dry-run")


@dataclass
class Options:
    interval_s: float = 60.0
    start_jitter_s: float = 2.0
    dry_run: bool = False
    once: bool = False  # one reconcile (``run --once``): nothing is waited for

    def loop(self) -> LoopOptions:
        """The process loop's options: probe every interval; a loop stalled for three intervals (at
        least five minutes: a probe may be slow) is not healthy."""
        return LoopOptions(interval_s=self.interval_s, start_jitter_s=self.start_jitter_s,
                           stall_s=max(3 * self.interval_s, 300.0))


class Daemon:
    """One node's labels: a ``Service`` of the process loop; ``probe()`` and ``reconcile_once()`` for ``--once``."""

    def __init__(self, node: str, probe: Callable[[], ProbeResult], sink: Sink, metrics: Metrics,
                 options: Options | None = None, fights: FightGuard | None = None) -> None:
        self.node, self.probe_fn, self.sink, self.metrics = node, probe, sink, metrics
        self.options = options or Options()
        self.log = log.bind(node=node)
        self._wake: Callable[[], None] = lambda: None
        self.desired = Owned({})
        self.probe_ok = False
        self.probe_error: str | None = None
        self.last_good: Owned | None = None
        self.last_applied: Labels | None = None
        self.ready = False
        # Failed API calls: retried at most 1 s apart for the first minute, then up to 30 s apart.
        self.backoff = Backoff(base_s=0.2, cap_s=30.0, quick_cap_s=1.0, quick_for_s=60.0)
        self.fights = fights or FightGuard()
        self.permissions = PermissionLog()
        self._probed = False  # a probe since the last reconcile
        self._not_before = 0.0
        self._api_failing = False
        self._kicks = self._kicks_seen = 0
        self._reported_foreign: set[tuple[str, tuple[str, ...]]] = set()
        self._reported_adopted: set[str] = set()
        self._reported_not_ours: str | None = None
        self._last_dry_run: Change | None = None

    # -- the service
    def begin(self, wake: Callable[[], None], stop: threading.Event) -> None:
        self._wake = wake
        # after the loop's start jitter: a restarting fleet must not list-and-watch at once
        self.sink.start(self.kick, stop, self.permissions)

    def kick(self) -> None:
        """The live labels changed (or the API answers again): reconcile now, whatever the backoff says.
        Safe from any thread."""
        self._kicks += 1
        self._wake()

    def work(self, now: float) -> float:
        """Reconcile when a probe, a kick or the end of a backoff asks for it; when to look again."""
        kicks = self._kicks
        due = self._probed or kicks != self._kicks_seen or (self._not_before > 0 and now >= self._not_before)
        self._kicks_seen, self._probed = kicks, False
        if due:
            self._after(self.reconcile_once(), now)
        return self._not_before if self._not_before > now else math.inf

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        return None  # _report_probe said it once; the retries are quiet

    def recovered(self, attempts: int, waited_s: float) -> None:
        return None  # _report_probe says "probe works again"

    # -- probing
    def probe(self) -> str | None:
        """Probe and derive the desired labels; the error when the probe failed as a whole (a
        partial probe is not one: it keeps the last good labels)."""
        self._probed = True
        start = time.monotonic()
        try:
            result = self.probe_fn()
        except ProbeError as exc:  # the whole probe cannot be trusted; the message says why
            result = ProbeResult(Owned({}), error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a probe must never take the daemon down
            result = ProbeResult(Owned({}), error=f"{type(exc).__name__}: {exc}")
        result = ProbeResult(result.labels, result.partial, result.error, time.monotonic() - start)
        self.metrics.observe_probe(result)
        self.desired = desired_after(result, self.last_good)
        self.probe_ok = result.ok
        if result.ok:
            self.last_good = Owned(dict(self.desired))
        self._report_probe(result)
        return result.error

    def _report_probe(self, result: ProbeResult) -> None:
        """A failed probe: one error line (again only if the error changes), not ready until one works."""
        if result.error is not None:
            if result.error != self.probe_error:
                self.log.error("probe failed; every label stays as it is until a probe works again",
                               reason="probe-failed", error=result.error)
            self.probe_error = result.error
            self.ready = False
            return
        if self.probe_error is not None:
            self.log.info("probe works again", reason="probe-recovered")
            self.probe_error = None
        if result.partial:
            self.log.warning("probe incomplete, keeping the last good labels", reason="partial-probe",
                             kept=len(self.desired))

    # -- reconciling
    def reconcile_once(self) -> str:
        """Compare live and desired labels and write when they differ. Returns the outcome."""
        outcome = "failed"
        try:
            outcome = self._reconcile()
        except NodeMissing as exc:
            outcome = "node-missing"
            if self.options.once:
                self.log.error(str(exc), reason="node-not-found")
            else:
                self.log.warning("node not found, waiting for it", reason="node-not-found")
        except NotOurs as exc:
            outcome = "not-ours"
            self._report_not_ours(str(exc))
        except PermissionDenied as exc:
            self.permissions.report(exc, node=self.node)
        except SinkError as exc:  # Unavailable, Stale: try again
            self._report_api_error(exc)
        self.metrics.reconciles.labels(outcome=outcome).inc()
        if outcome in SUCCESS:
            if self._api_failing:
                self._api_failing = False
                self.log.info("API requests work again", reason="api-recovered")
            self.permissions.granted("get", "patch", "create", "update")
            self.ready = self.probe_error is None
            self._reported_not_ours = None
            self.backoff.reset()
            self.metrics.last_success.set(time.time())
        elif outcome == "not-ours":
            self.ready = False
        return outcome

    def _reconcile(self) -> str:
        live = self.sink.live()
        change = plan(live, self.desired, self.probe_ok)
        self._report_foreign(change.foreign)
        self.metrics.labels_owned.set(sum(1 for key in live.labels if live.ours(key)))
        if not change.needed:
            self.last_applied = dict(change.labels)
            return "unchanged"
        if self.options.dry_run:
            if change != self._last_dry_run and change.keys:
                self.log.info("dry run: would apply", reason="dry-run", **change.summary())
                self._last_dry_run = change
            return "dry-run"
        now = time.monotonic()
        hold_s = self._hold_s(change, live, now)
        if hold_s > 0:
            self._not_before = now + hold_s
            return "held"
        self._write(change, now)
        return "applied"

    def _hold_s(self, change: Change, live: Live, now: float) -> float:
        """How long to hold off a change that only repairs labels another writer keeps undoing (0: write now).

        A repair is a key we set to this very value before; changes of our own (first apply, new
        hardware) are never held."""
        applied = self.last_applied or {}
        repairs = {key for key in change.keys if key in change.labels and applied.get(key) == change.labels[key]}
        for key in sorted(repairs):
            if self.fights.lost(key, now):
                self.metrics.fights.inc()
                self.log.warning("another writer keeps undoing an owned label; repairing it at a slowing pace",
                                 reason="label-fight", label=key, other_managers=managers_text(live.names(key)),
                                 pace_s=round(self.fights.interval_s(key), 2))
        if not repairs or repairs != change.keys:
            return 0.0
        return max(self.fights.wait_s(key, now) for key in repairs)

    def _write(self, change: Change, now: float) -> None:
        try:
            self.sink.write(change)
        except Exception:
            self.metrics.writes.labels(outcome="error").inc()
            raise
        self.metrics.writes.labels(outcome="success").inc()
        self.fights.wrote(set(change.added) | set(change.changed) | set(change.adopted), now)
        self.metrics.labels_owned.set(len(change.labels))
        self.last_applied = dict(change.labels)
        for key, names in sorted(change.adopted.items()):
            if key not in self._reported_adopted:
                self._reported_adopted.add(key)
                self.log.info("label taken over: gpu-labeller applies it from now on", reason="adopted", label=key,
                              previous_managers=managers_text(names))
        if change.keys:
            self.log.info("labels updated", reason="labels-changed", output=self.sink.name, **change.summary())
        else:
            self.log.debug("output refreshed, labels unchanged", reason="refreshed", output=self.sink.name)

    def _report_foreign(self, foreign: dict[str, tuple[str, ...]]) -> None:
        """Count the keys under our prefixes that other managers set; log each once, with its managers."""
        self.metrics.foreign_labels.set(len(foreign))
        new = {key: managers_text(names) for key, names in foreign.items()
               if (key, names) not in self._reported_foreign}
        if new:
            self._reported_foreign.update(foreign.items())
            self.log.info("labels under gpu-labeller's prefixes that other managers set are left alone",
                          reason="foreign-labels", labels=new)

    def _report_api_error(self, exc: SinkError) -> None:
        """A warning when failures begin; quiet (debug) while they last: retries come every second."""
        level = self.log.debug if self._api_failing else self.log.warning
        self._api_failing = True
        level("output failed", reason="api-error", output=self.sink.name, error=str(exc),
              status=exc.status if isinstance(exc, Unavailable) else None)

    def _report_not_ours(self, message: str) -> None:
        if message != self._reported_not_ours:
            self._reported_not_ours = message
            self.log.error(message, reason="not-ours", output=self.sink.name)

    def _after(self, outcome: str, now: float) -> None:
        if outcome in ("failed", "node-missing"):
            self._not_before = now + self.backoff.next(now)
        elif outcome != "held":  # a hold set its own time
            self._not_before = 0.0
