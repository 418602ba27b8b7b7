"""The labelling daemon's pure decisions: which labels to aim for, what to write, when to back off.

Rules kept here:
- only keys with ``labels.owns(key)`` are ever written or removed;
- a write happens only when the live owned labels differ from the desired ones (no idle writes);
- a failed or partial probe never removes a label: it may add or repair, never take away.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from labeller.labels import owns

Labels = dict[str, str]


def owned(labels: Mapping[str, str]) -> Labels:
    """The labels among ``labels`` that gpu-labeller owns (by key prefix)."""
    return {key: value for key, value in labels.items() if owns(key)}


@dataclass(frozen=True)
class ProbeResult:
    """What one probe produced: the owned labels, and whether they are the whole truth."""

    labels: Labels
    partial: bool = False
    error: str | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.partial


def desired_after(result: ProbeResult, last_good: Labels | None) -> Labels:
    """The labels to aim for after a probe.

    Complete probe: its labels. Partial probe: the last good set, plus keys only this probe found
    (values already known are kept). Failed probe: the last good set (empty if there is none; the
    plan then keeps whatever is live, because a failed probe never removes).
    """
    if result.ok:
        return owned(result.labels)
    base = dict(last_good or {})
    if result.error is None:
        return {**owned(result.labels), **base}
    return base


@dataclass(frozen=True)
class Change:
    """The difference between live and desired owned labels; ``labels`` is the full set to apply."""

    labels: Labels
    added: Labels = field(default_factory=dict)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    removed: tuple[str, ...] = ()

    @property
    def needed(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    @property
    def keys(self) -> set[str]:
        return set(self.added) | set(self.changed) | set(self.removed)

    def summary(self) -> dict[str, Any]:
        return {"added": sorted(self.added), "changed": sorted(self.changed), "removed": list(self.removed)}


def plan(live: Mapping[str, str], desired: Mapping[str, str], probe_ok: bool) -> Change:
    """What to apply so the live owned labels become ``desired``.

    After a failed or partial probe (``probe_ok`` False) nothing is removed: live owned labels
    that the desired set lacks are kept in the applied set.
    """
    live_owned, want = owned(live), owned(desired)
    if not probe_ok:
        want = {**live_owned, **want}
    added = {k: v for k, v in want.items() if k not in live_owned}
    changed = {k: (live_owned[k], v) for k, v in want.items() if k in live_owned and live_owned[k] != v}
    removed = tuple(sorted(set(live_owned) - set(want)))
    return Change(want, added, changed, removed)


class Backoff:
    """Capped exponential backoff with full jitter: ``next()`` in [base/2, min(cap, base*2^n)]."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 30.0, rng: random.Random | None = None) -> None:
        self.base_s, self.cap_s, self.attempts = base_s, cap_s, 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        ceiling = min(self.cap_s, self.base_s * 2.0 ** self.attempts)
        self.attempts += 1
        return float(self._rng.uniform(min(self.base_s / 2, ceiling), ceiling))

    def reset(self) -> None:
        self.attempts = 0


class FightDetector:
    """Notices another writer fighting over an owned label and says how long to hold off.

    Each repair of drift is recorded per key. More than ``threshold`` repairs of one key within
    ``window_s`` is a fight: hold off ``base_hold_s``, doubling per consecutive fight up to
    ``max_hold_s`` (while the key stays hot, every further repair is a fight). A quiet window
    resets the doubling.
    """

    def __init__(self, threshold: int = 3, window_s: float = 60.0, base_hold_s: float = 2.0,
                 max_hold_s: float = 300.0) -> None:
        self.threshold, self.window_s = threshold, window_s
        self.base_hold_s, self.max_hold_s = base_hold_s, max_hold_s
        self.repairs: dict[str, list[float]] = {}
        self.level = 0
        self.hold_until = 0.0
        self._last_fight = float("-inf")

    def record(self, keys: set[str], now: float) -> list[str]:
        """Record a repair of ``keys``; return the keys being fought over (empty: no fight)."""
        if now - self._last_fight > self.window_s + self.hold_s():
            self.level = 0
        fought = []
        memory_s = self.window_s + (self.hold_s() if self.level else 0.0)  # a hold must not erase the history
        for key in keys:
            times = [t for t in self.repairs.get(key, []) if now - t <= memory_s] + [now]
            self.repairs[key] = times
            if len(times) > self.threshold:
                fought.append(key)
        if fought:
            self.hold_until = now + self.hold_s()
            self.level += 1
            self._last_fight = now
        return sorted(fought)

    def hold_s(self) -> float:
        return min(self.max_hold_s, self.base_hold_s * 2.0 ** self.level)
