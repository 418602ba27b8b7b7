"""Retry delays with full jitter, for every loop that retries: the process loop, the reflectors, the
named-config follower, the DRA publisher."""

from __future__ import annotations

import random
import time


class Backoff:
    """Retry delays with full jitter: ``next()`` in [base/2, ceiling], the ceiling doubling from
    ``base_s``. While failures have lasted less than ``quick_for_s`` the ceiling stops at
    ``quick_cap_s`` (retry fast through a short outage), then it doubles on up to ``cap_s``.
    ``attempts`` counts the failures since the last ``reset()``."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 30.0, rng: random.Random | None = None, *,
                 quick_cap_s: float = 1.0, quick_for_s: float = 0.0) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self.quick_cap_s, self.quick_for_s = quick_cap_s, quick_for_s
        self.attempts = 0
        self.failing_since: float | None = None
        self._doublings = 0  # stops growing at the ceiling, so leaving the quick phase doubles from there
        self._rng = rng or random.Random()

    def next(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        if self.failing_since is None:
            self.failing_since = now
        self.attempts += 1
        limit = self.quick_cap_s if now - self.failing_since < self.quick_for_s else self.cap_s
        ceiling = min(limit, self.base_s * 2.0 ** self._doublings)
        if ceiling < limit:
            self._doublings += 1
        return float(self._rng.uniform(min(self.base_s / 2, ceiling), ceiling))

    def reset(self) -> None:
        self.attempts = self._doublings = 0
        self.failing_since = None
