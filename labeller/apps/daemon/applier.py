"""One pass of the daemon over its output: read the live labels, plan, and write when they differ.

``Applier.apply`` takes the live labels (``Sink.live``) to the desired ones with the pure plan of
``labeller.apps.daemon.reconcile``. It writes only when something differs; under ``--dry-run`` it says
what it would write; and a change that only repairs labels another writer keeps undoing is held
back at a slowing pace (``FightGuard``), so two controllers never fight at full speed. The sink's
errors go up to the daemon, which decides what they mean.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from labeller.apps.daemon.reconcile import Change, FightGuard, Labels, Live, Owned, managers_text, plan
from labeller.apps.daemon.reports import Reports
from labeller.apps.daemon.sinks import Sink

if TYPE_CHECKING:
    from labeller.apps.daemon.metrics import Metrics


class Applier:
    """``apply`` returns the outcome: "unchanged", "dry-run", "applied" or "held" (then ``held_until``,
    a monotonic time, says when the repair may be written)."""

    def __init__(self, sink: Sink, metrics: Metrics, fights: FightGuard, reports: Reports, log: Any,
                 dry_run: bool) -> None:
        self.sink, self.metrics, self.fights, self.reports, self.log = sink, metrics, fights, reports, log
        self.dry_run = dry_run
        self.last_applied: Labels | None = None
        self.held_until = 0.0

    def apply(self, desired: Owned, probe_ok: bool) -> str:
        live = self.sink.live()
        change = plan(live, desired, probe_ok)
        self.metrics.foreign_labels.set(len(change.foreign))
        self.reports.foreign(change.foreign)
        self.metrics.labels_owned.set(sum(1 for key in live.labels if live.ours(key)))
        if not change.needed:
            self.last_applied = dict(change.labels)
            return "unchanged"
        if self.dry_run:
            self.reports.dry_run(change)
            return "dry-run"
        now = time.monotonic()
        hold_s = self._hold_s(change, live, now)
        if hold_s > 0:
            self.held_until = now + hold_s
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
        self.reports.written(change)
