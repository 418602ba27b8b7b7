"""What the daemon has already said, so that each thing is said once.

A reconcile runs every interval and on every change of the live labels; without this memory the
same foreign label, adoption, dry-run plan or API outage would be logged on every pass. Each
method logs only when what it is told differs from what it said last.
"""

from __future__ import annotations

from typing import Any

from labeller.apps.daemon.reconcile import Change, managers_text
from labeller.apps.daemon.sinks import SinkError, Unavailable


class Reports:
    """One daemon's log lines about the labels it writes to ``output`` (the sink's name)."""

    def __init__(self, log: Any, output: str) -> None:
        self.log, self.output = log, output
        self.api_failing = False
        self._foreign: set[tuple[str, tuple[str, ...]]] = set()
        self._adopted: set[str] = set()
        self._not_ours: str | None = None
        self._dry_run: Change | None = None

    def foreign(self, foreign: dict[str, tuple[str, ...]]) -> None:
        """The keys under our prefixes that other managers set: each once, with its managers."""
        new = {key: managers_text(names) for key, names in foreign.items() if (key, names) not in self._foreign}
        if new:
            self._foreign.update(foreign.items())
            self.log.info("labels under gpu-labeller's prefixes that other managers set are left alone",
                          reason="foreign-labels", labels=new)

    def dry_run(self, change: Change) -> None:
        """What a write would change, once per plan."""
        if change != self._dry_run and change.keys:
            self.log.info("dry run: would apply", reason="dry-run", **change.summary())
            self._dry_run = change

    def written(self, change: Change) -> None:
        """A write went through: each label taken over (once), and what changed."""
        for key, names in sorted(change.adopted.items()):
            if key not in self._adopted:
                self._adopted.add(key)
                self.log.info("label taken over: gpu-labeller applies it from now on", reason="adopted", label=key,
                              previous_managers=managers_text(names))
        if change.keys:
            self.log.info("labels updated", reason="labels-changed", output=self.output, **change.summary())
        else:
            self.log.debug("output refreshed, labels unchanged", reason="refreshed", output=self.output)

    def api_error(self, exc: SinkError) -> None:
        """A warning when failures begin; quiet (debug) while they last: retries come every second."""
        level = self.log.debug if self.api_failing else self.log.warning
        self.api_failing = True
        level("output failed", reason="api-error", output=self.output, error=str(exc),
              status=exc.status if isinstance(exc, Unavailable) else None)

    def not_ours(self, message: str) -> None:
        """The target is someone else's (a features file we did not write): once per message."""
        if message != self._not_ours:
            self._not_ours = message
            self.log.error(message, reason="not-ours", output=self.output)

    def succeeded(self) -> None:
        """A reconcile worked: an outage is over, and a target that was not ours is again news."""
        if self.api_failing:
            self.api_failing = False
            self.log.info("API requests work again", reason="api-recovered")
        self._not_ours = None
