"""The labelling daemon: keep the owned labels of one Node equal to what the hardware says.

``Daemon`` runs the loop: probe on an interval (and on SIGHUP), compare with the live labels that a
``Sink`` reports, write through the sink only when they differ. The decisions it takes are pure
functions in ``labeller.reconcile``; the I/O is in ``labeller.sinks``. The Kubernetes client is
reached only through ``labeller.kube``, imported by the caller.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import structlog

from labeller.reconcile import Backoff, Change, FightDetector, Labels, ProbeResult, desired_after, plan
from labeller.sinks import NodeMissing, NodeWatcher, Sink

if TYPE_CHECKING:
    from labeller.kube import Kube
    from labeller.metrics import Metrics

log = structlog.get_logger("gpu_labeller.daemon")


@dataclass
class Options:
    interval_s: float = 60.0
    start_jitter_s: float = 2.0
    dry_run: bool = False
    events: bool = False
    event_namespace: str = "default"


class Daemon:
    """One node's reconcile loop. ``run()`` until ``stop()``; ``reconcile_once()`` for ``--once``."""

    def __init__(self, node: str, probe: Callable[[], ProbeResult], sink: Sink, metrics: Metrics,
                 options: Options | None = None, reload: Callable[[], None] | None = None,
                 kube: Kube | None = None, watcher: NodeWatcher | None = None) -> None:
        self.node, self.probe_fn, self.sink, self.metrics = node, probe, sink, metrics
        self.options = options or Options()
        self.reload_fn, self.kube, self.watcher = reload, kube, watcher
        self.log = log.bind(node=node)
        self.wake, self.stopped = threading.Event(), threading.Event()
        self.desired: Labels = {}
        self.probe_ok = False
        self.last_good: Labels | None = None
        self.last_applied: Labels | None = None
        self.ready = False
        self.heartbeat = time.monotonic()
        self.backoff = Backoff(0.2, 30.0)
        self.fights = FightDetector()
        self._reload_requested = False
        self._not_before = 0.0
        self._reported_forbidden: set[tuple[str, str]] = set()
        self._last_dry_run: Change | None = None
        if watcher is not None:
            watcher.attach(self.wake.set, self.stopped)

    # -- control, safe from signal handlers and other threads
    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()

    def request_reload(self) -> None:
        self._reload_requested = True
        self.wake.set()

    def healthy(self) -> bool:
        return time.monotonic() - self.heartbeat < max(3 * self.options.interval_s, 300.0)

    # -- probing
    def probe(self) -> None:
        start = time.monotonic()
        try:
            result = self.probe_fn()
        except Exception as exc:  # noqa: BLE001 - a probe must never take the daemon down
            result = ProbeResult({}, error=f"{type(exc).__name__}: {exc}")
        result = ProbeResult(result.labels, result.partial, result.error, time.monotonic() - start)
        self.metrics.observe_probe(result)
        self.desired = desired_after(result, self.last_good)
        self.probe_ok = result.ok
        if result.ok:
            self.last_good = dict(self.desired)
        else:
            self.log.warning("probe incomplete, keeping the last good labels", reason="partial-probe" if result.error is None
                             else "probe-failed", error=result.error, kept=len(self.desired))

    # -- reconciling
    def reconcile_once(self) -> str:
        """Compare live and desired owned labels and write when they differ. Returns the outcome."""
        from labeller.kube import Forbidden, KubeError

        outcome = "failed"
        try:
            outcome = self._reconcile()
        except NodeMissing:
            outcome = "node-missing"
            self.log.warning("node not found, waiting for it", reason="node-not-found")
        except Forbidden as exc:
            self._report_forbidden(exc.verb, exc.resource, exc.message)
        except KubeError as exc:
            self.log.warning("API request failed", reason="api-error", status=exc.status, error=exc.message)
        except OSError as exc:
            self.log.error("cannot write output", reason="io-error", error=str(exc))
        self.metrics.reconciles.labels(outcome=outcome).inc()
        if outcome in ("unchanged", "applied", "dry-run"):
            self.ready = True
            self.backoff.reset()
            self.metrics.last_success.set(time.time())
        return outcome

    def _reconcile(self) -> str:
        live = self.sink.live()
        change = plan(live, self.desired, self.probe_ok)
        self.metrics.labels_owned.set(len(live))
        if not change.needed:
            self.last_applied = dict(change.labels)
            return "unchanged"
        if self.options.dry_run:
            if change != self._last_dry_run:
                self.log.info("dry run: would apply", reason="dry-run", **change.summary())
                self._last_dry_run = change
            return "dry-run"
        if self.last_applied == change.labels and self._fighting(change):
            return "held"
        self._write(change)
        return "applied"

    def _fighting(self, change: Change) -> bool:
        """Record a drift repair; True when a fight was just detected (the write is held off)."""
        now = time.monotonic()
        fought = self.fights.record(change.keys, now)
        if not fought:
            return False
        self.metrics.fights.inc()
        hold = self.fights.hold_until - now
        self._not_before = max(self._not_before, self.fights.hold_until)
        self.log.warning("another writer keeps changing owned labels; backing off", reason="label-fight",
                         labels=fought, hold_s=round(hold, 1))
        return True

    def _write(self, change: Change) -> None:
        try:
            self.sink.write(change)
        except Exception:
            self.metrics.writes.labels(outcome="error").inc()
            raise
        self.metrics.writes.labels(outcome="success").inc()
        self.metrics.labels_owned.set(len(change.labels))
        self.last_applied = dict(change.labels)
        self.log.info("labels updated", reason="labels-changed", output=self.sink.name, **change.summary())
        if self.options.events:
            self._emit_event(change)

    def _emit_event(self, change: Change) -> None:
        from labeller.kube import KubeError

        if self.kube is None:
            return
        counts = f"{len(change.added)} added, {len(change.changed)} changed, {len(change.removed)} removed"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{self.node}.{time.time_ns():x}", "namespace": self.options.event_namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node},
                "reason": "GPULabelsChanged", "message": f"gpu-labeller: {counts}", "type": "Normal",
                "source": {"component": "gpu-labeller", "host": self.node},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self.kube.create_event(self.options.event_namespace, body)
        except KubeError as exc:
            self.log.warning("could not record an event", reason="event-failed", error=exc.message)

    def _report_forbidden(self, verb: str, resource: str, message: str) -> None:
        if (verb, resource) in self._reported_forbidden:
            return
        self._reported_forbidden.add((verb, resource))
        self.log.error(f"permission missing: grant verb '{verb}' on resource '{resource}' to gpu-labeller's "
                       "ServiceAccount", reason="forbidden", verb=verb, resource=resource, detail=message)

    # -- the loop
    def run(self) -> None:
        if self.options.start_jitter_s > 0 and self.stopped.wait(random.uniform(0, self.options.start_jitter_s)):
            return
        if self.watcher is not None:  # after the jitter: a restarting fleet must not list-and-watch at once
            self.watcher.start()
        next_probe = time.monotonic()
        while not self.stopped.is_set():
            self.wake.clear()
            now = self.heartbeat = time.monotonic()
            if self._reload_requested:
                self._reload()
                next_probe = now
            if now >= next_probe:
                self.probe()
                next_probe = now + self.options.interval_s
            if now >= self._not_before:
                self._after(self.reconcile_once(), now)
            wake_at = min(next_probe, self._not_before) if self._not_before > now else next_probe
            self.wake.wait(max(0.0, wake_at - time.monotonic()))

    def _after(self, outcome: str, now: float) -> None:
        if outcome in ("failed", "node-missing"):
            self._not_before = now + self.backoff.next()

    def _reload(self) -> None:
        self._reload_requested = False
        self.log.info("reloading config and re-probing", reason="sighup")
        if self.reload_fn is not None:
            try:
                self.reload_fn()
            except Exception as exc:  # noqa: BLE001 - a bad config file keeps the old config
                self.log.error("config reload failed, keeping the old config", reason="bad-config", error=str(exc))
