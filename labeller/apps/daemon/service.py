"""The labelling daemon: keep the owned labels of one Node equal to what the hardware says.

``Daemon`` is the ``run`` command's service on the process loop (``labeller.process.loop``), which
probes on an interval and on SIGHUP: it compares the probe's labels with the live labels that a
``Sink`` reports and writes through the sink only when they differ, and again whenever the sink
says the live labels changed (``kick``). It is a thin conductor over its parts:

- ``Desired`` (``labeller.apps.daemon.desired``): probes and keeps the labels to aim for;
- ``Applier`` (``labeller.apps.daemon.applier``): one pass over the output: plan, hold, write;
- ``Reports`` (``labeller.apps.daemon.reports``): what was already said, so each thing is said once;
- ``Schedule`` (here): when the next pass is due.

The decisions they take are pure functions in ``labeller.apps.daemon.reconcile``; the I/O is in
``labeller.apps.daemon.sinks``, whose errors are the only ones the daemon handles: it never sees the
Kubernetes client.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from labeller.cluster.permissions import PermissionLog
from labeller.apps.daemon.applier import Applier
from labeller.apps.daemon.desired import Desired
from labeller.apps.daemon.reconcile import FightGuard, ProbeResult
from labeller.apps.daemon.reports import Reports
from labeller.apps.daemon.sinks import NodeMissing, NotOurs, PermissionDenied, Sink, SinkError
from labeller.base.backoff import Backoff
from labeller.process.loop import LoopOptions
from labeller.base.log import get_logger

if TYPE_CHECKING:
    from labeller.apps.daemon.metrics import Metrics

log = get_logger("gpu_labeller.daemon")

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


class Schedule:
    """When the next pass is due: after a probe, after a kick (from any thread), and when a backoff
    or a hold ends (``not_before``, a monotonic time; 0: none)."""

    def __init__(self) -> None:
        self.wake: Callable[[], None] = lambda: None  # asks the loop for a turn
        self.kicks = self._kicks_seen = 0
        self.probed = False  # a probe since the last pass
        self.not_before = 0.0

    def kick(self) -> None:
        self.kicks += 1
        self.wake()

    def due(self, now: float) -> bool:
        """Whether a pass is due now; what asked for it is then taken."""
        kicks = self.kicks
        due = self.probed or kicks != self._kicks_seen or (self.not_before > 0 and now >= self.not_before)
        self._kicks_seen, self.probed = kicks, False
        return due

    def next(self, now: float) -> float:
        return self.not_before if self.not_before > now else math.inf


class Daemon:
    """One node's labels: a ``Service`` of the process loop; ``probe()`` and ``reconcile_once()`` for ``--once``."""

    def __init__(self, node: str, probe: Callable[[], ProbeResult], sink: Sink, metrics: Metrics,
                 options: Options | None = None, fights: FightGuard | None = None) -> None:
        self.node, self.metrics = node, metrics
        self.options = options or Options()
        self.log = log.bind(node=node)
        self.desired = Desired(probe, metrics, self.log)
        self.reports = Reports(self.log, sink.name)
        self.applier = Applier(sink, metrics, fights or FightGuard(), self.reports, self.log, self.options.dry_run)
        self.permissions = PermissionLog()
        # Failed API calls: retried at most 1 s apart for the first minute, then up to 30 s apart.
        self.backoff = Backoff(base_s=0.2, cap_s=30.0, quick_cap_s=1.0, quick_for_s=60.0)
        self.schedule = Schedule()
        self.ready = False

    @property
    def sink(self) -> Sink:
        return self.applier.sink

    @property
    def probe_ok(self) -> bool:
        """The last probe was complete."""
        return self.desired.ok

    # -- the service
    def begin(self, wake: Callable[[], None], stop: threading.Event) -> None:
        self.schedule.wake = wake
        # after the loop's start jitter: a restarting fleet must not list-and-watch at once
        self.sink.start(self.kick, stop, self.permissions)

    def kick(self) -> None:
        """The live labels changed (or the API answers again): reconcile now, whatever the backoff says.
        Safe from any thread."""
        self.schedule.kick()

    def work(self, now: float) -> float:
        """Reconcile when a probe, a kick or the end of a backoff asks for it; when to look again."""
        if self.schedule.due(now):
            self._after(self.reconcile_once(), now)
        return self.schedule.next(now)

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        return None  # Desired said it once; the retries are quiet

    def recovered(self, attempts: int, waited_s: float) -> None:
        return None  # Desired says "probe works again"

    def probe(self) -> str | None:
        """Probe and derive the desired labels; the error when the probe failed as a whole (a
        partial probe is not one: it keeps the last good labels). Not ready until a probe works."""
        self.schedule.probed = True
        error = self.desired.probe().error
        if error is not None:
            self.ready = False
        return error

    # -- reconciling
    def reconcile_once(self) -> str:
        """Compare live and desired labels and write when they differ. Returns the outcome."""
        outcome = "failed"
        try:
            outcome = self.applier.apply(self.desired.labels, self.desired.ok)
        except NodeMissing as exc:
            outcome = "node-missing"
            if self.options.once:
                self.log.error(str(exc), reason="node-not-found")
            else:
                self.log.warning("node not found, waiting for it", reason="node-not-found")
        except NotOurs as exc:
            outcome = "not-ours"
            self.reports.not_ours(str(exc))
        except PermissionDenied as exc:
            self.permissions.report(exc, node=self.node)
        except SinkError as exc:  # Unavailable, Stale: try again
            self.reports.api_error(exc)
        self.metrics.reconciles.labels(outcome=outcome).inc()
        if outcome in SUCCESS:
            self.reports.succeeded()
            self.permissions.granted("get", "patch", "create", "update")
            self.ready = self.desired.error is None
            self.backoff.reset()
            self.metrics.last_success.set(time.time())
        elif outcome == "not-ours":
            self.ready = False
        return outcome

    def _after(self, outcome: str, now: float) -> None:
        if outcome in ("failed", "node-missing"):
            self.schedule.not_before = now + self.backoff.next(now)
        elif outcome == "held":
            self.schedule.not_before = self.applier.held_until
        else:
            self.schedule.not_before = 0.0
