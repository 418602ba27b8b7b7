"""The threads that serve requests: ``connections.ConnectionServer`` submits a job for each connection
once it has sent its first bytes, so threads are bounded by the requests in flight, not by the
connections open."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class Workers:
    """Threads for the connections that have a request in flight: started as they are needed, at most
    ``most``; a thread idle for ``IDLE_S`` ends, so a burst's threads do not stay."""

    IDLE_S = 30.0
    _RETIRE = object()  # what an idle thread "gets" when its wait runs out

    def __init__(self, most: int, name: str) -> None:
        self._most, self._name = most, name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._alive = self._idle = self._queued = 0

    @property
    def alive(self) -> int:
        return self._alive

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._queued += 1
            if self._queued > self._idle and self._alive < self._most:
                self._alive += 1
                threading.Thread(target=self._run, name=f"{self._name}-worker", daemon=True).start()
        self._jobs.put(job)

    def close(self) -> None:
        with self._lock:
            for _ in range(self._alive):
                self._jobs.put(None)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                job = self._RETIRE
            with self._lock:
                self._idle -= 1
                if job is None or (job is self._RETIRE and self._queued <= self._idle):
                    self._alive -= 1
                    return
                if job is self._RETIRE:
                    continue  # a job came as the wait ran out, counting on this thread
                self._queued -= 1
            job()
