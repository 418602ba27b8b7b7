"""Plumbing the long-running commands share, below every layer that knows GPUs or clusters:
signals taken on the main thread while the work runs on another, and backoff with jitter. (Their
HTTP server is ``labeller.process.httpserver``.)"""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import structlog


log = structlog.get_logger(__name__)
T = TypeVar("T")


# --- signals -------------------------------------------------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNALS = (signal.SIGHUP,)


_deferred: list[int] = []  # SIGTERM and SIGHUP that came while a server was starting
_before_deferring: dict[int, Any] = {}  # their handlers before ``defer_signals``: put back when serving ends


def _defer(signum: int, frame: FrameType | None) -> None:
    _deferred.append(signum)  # list.append takes no lock a handler could wait on


def defer_signals() -> None:
    """For a server, from its command's start until ``run_until_signalled`` takes over: SIGTERM and
    SIGHUP are kept, not fatal, and acted on as soon as it serves (a stop during start-up is a clean
    stop, exit 0, not death by the signal)."""
    for signum in (signal.SIGTERM, *RELOAD_SIGNALS):
        _before_deferring.setdefault(signum, signal.signal(signum, _defer))


def _noted(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler does nothing: the signal's number reaches the wakeup pipe anyway."""


def run_until_signalled(body: Callable[[], T], stop: Callable[[], None], reload: Callable[[], None]) -> T:
    """``body()`` on a thread of its own, its result (or its exception) returned here; meanwhile the
    main thread takes the signals: SIGTERM and SIGINT call ``stop``, SIGHUP calls ``reload``.

    Python runs a signal handler on the main thread between two bytecodes, whatever that thread is
    doing, even inside ``Event.set`` or inside another handler: a handler that takes a lock (every
    ``Event`` has one) can wait forever for its own thread. So the handlers here do nothing; each
    signal's number reaches a pipe (``signal.set_wakeup_fd``) that the main thread waits on, and the
    main thread calls ``stop`` and ``reload`` as ordinary code, one signal after the other."""
    wakeup_r, wakeup_w = os.pipe()
    for fd in (wakeup_r, wakeup_w):
        os.set_blocking(fd, False)
    results: list[T] = []
    raised: list[BaseException] = []
    done = threading.Event()  # only read here, with is_set, which takes no lock

    def target() -> None:
        try:
            results.append(body())
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread as it is
            raised.append(exc)
        finally:
            done.set()
            os.write(wakeup_w, b"\0")  # not a signal number: wakes the main thread to see ``done``

    previous_fd = signal.set_wakeup_fd(wakeup_w, warn_on_full_buffer=False)
    previous = {signum: signal.signal(signum, _noted) for signum in (*STOP_SIGNALS, *RELOAD_SIGNALS)}
    deferred, _deferred[:] = bytes(_deferred), []
    if deferred:
        os.write(wakeup_w, deferred)  # as if they came now
    thread = threading.Thread(target=target, name="process-loop")
    try:
        thread.start()
        while not done.is_set():
            select.select([wakeup_r], [], [])
            with contextlib.suppress(BlockingIOError):
                for signum in os.read(wakeup_r, 512):
                    if signum:
                        (reload if signum in RELOAD_SIGNALS else stop)()  # before the log line, which may fail
                        log.info("signal received", reason="signal", signal=signal.Signals(signum).name)
        thread.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, _before_deferring.pop(signum, handler))
        signal.set_wakeup_fd(previous_fd)
        os.close(wakeup_r)
        os.close(wakeup_w)
    if raised:
        raise raised[0]
    return results[0]


# --- backoff -------------------------------------------------------------------------------------

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
