"""The labels the daemon aims for: each probe's, or the last good ones while probes fail.

``Desired.probe()`` runs the probe, derives the labels to aim for (``reconcile.desired_after``: a
failed or partial probe keeps the last good labels) and says a failed probe once, and its end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from labeller.apps.daemon.reconcile import Owned, ProbeResult, desired_after
from labeller.model.inventory import ProbeError

if TYPE_CHECKING:
    from labeller.apps.daemon.metrics import Metrics


class Desired:
    """``labels``: what to aim for; ``ok``: the last probe was complete; ``error``: why the last probe
    failed as a whole (None when it did not)."""

    def __init__(self, probe: Callable[[], ProbeResult], metrics: Metrics, log: Any) -> None:
        self.probe_fn, self.metrics, self.log = probe, metrics, log
        self.labels = Owned({})
        self.ok = False
        self.error: str | None = None
        self.last_good: Owned | None = None

    def probe(self) -> ProbeResult:
        """Probe once (a probe that raises is a failed probe, never the daemon's end) and aim anew."""
        start = time.monotonic()
        try:
            result = self.probe_fn()
        except ProbeError as exc:  # the whole probe cannot be trusted; the message says why
            result = ProbeResult(Owned({}), error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a probe must never take the daemon down
            result = ProbeResult(Owned({}), error=f"{type(exc).__name__}: {exc}")
        result = ProbeResult(result.labels, result.partial, result.error, time.monotonic() - start)
        self.metrics.observe_probe(result)
        self.labels = desired_after(result, self.last_good)
        self.ok = result.ok
        if result.ok:
            self.last_good = Owned(dict(self.labels))
        self._report(result)
        return result

    def _report(self, result: ProbeResult) -> None:
        """A failed probe: one error line (again only if the error changes)."""
        if result.error is not None:
            if result.error != self.error:
                self.log.error("probe failed; every label stays as it is until a probe works again",
                               reason="probe-failed", error=result.error)
            self.error = result.error
            return
        if self.error is not None:
            self.log.info("probe works again", reason="probe-recovered")
            self.error = None
        if result.partial:
            self.log.warning("probe incomplete, keeping the last good labels", reason="partial-probe",
                             kept=len(self.labels))
