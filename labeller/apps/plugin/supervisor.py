"""The device plugin's supervisor: one thread that runs a tick (apply the latest offer, follow the
kubelet) every ``tick_seconds``, or at once when woken, until stopped. A tick that fails is logged
and the next one retries: supervision never ends on one bad tick. ``healthy`` says it still ticks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from labeller.base.log import get_logger

log = get_logger(__name__)


class Supervisor:
    def __init__(self, tick: Callable[[], None], tick_seconds: float) -> None:
        self.tick, self.tick_seconds = tick, tick_seconds
        self.last_tick = time.monotonic()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._supervise, name="plugin-supervisor", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Tick now rather than at the next interval. Safe from any thread."""
        self._wake.set()

    def healthy(self, stall_seconds: float) -> bool:
        """It ticked within ``stall_seconds``."""
        return time.monotonic() - self.last_tick < stall_seconds

    def _supervise(self) -> None:
        while not self._stop.is_set():
            self.last_tick = time.monotonic()
            try:
                self.tick()
            except Exception:  # one bad tick must not end supervision: the next tick retries
                log.exception("supervisor tick failed; retrying")
            self._wake.wait(self.tick_seconds)
            self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
