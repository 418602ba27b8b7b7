"""Signals of a long-running process: SIGTERM and SIGINT stop it, SIGHUP reloads it, taken on the
main thread while the work runs on another; a signal that comes while the process starts is kept
until it serves. What needs a file descriptor later is taken when a server starts, before it opens a
port: the pipe that carries signals to the main thread, and structlog (imported with the first line
logged otherwise): connections that flood a server as it comes up can leave it none."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

from labeller.base.log import get_logger, loaded

log = get_logger(__name__)
T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNALS = (signal.SIGHUP,)
DEFERRED = (signal.SIGTERM, *RELOAD_SIGNALS)  # SIGINT is not: Ctrl-C during start-up ends it at once (exit 130)

_deferred: list[int] = []  # SIGTERM and SIGHUP that came while a server was starting
_before_deferring: dict[int, Any] = {}  # their handlers before ``defer_signals``: put back when serving ends
_reserved: list[tuple[int, int]] = []  # the wakeup pipe made by ``defer_signals`` for ``run_until_signalled``


def _wakeup_pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
    return read_fd, write_fd


def _defer(signum: int, frame: FrameType | None) -> None:
    _deferred.append(signum)  # list.append takes no lock a handler could wait on


def defer_signals() -> None:
    """For a server, from its command's start until ``run_until_signalled`` takes over: SIGTERM and
    SIGHUP are kept, not fatal, and acted on as soon as it serves (a stop during start-up is a clean
    stop, exit 0, not death by the signal). It also makes the pipe ``run_until_signalled`` will wait on,
    and loads structlog (see the module's docstring)."""
    if not _reserved:
        _reserved.append(_wakeup_pipe())
    loaded()
    for signum in DEFERRED:
        _before_deferring.setdefault(signum, signal.signal(signum, _defer))


def restore_signals(deliver_kept: bool = False) -> None:
    """The handlers ``defer_signals`` replaced are put back (``run_until_signalled`` put them back
    already if it ran). ``deliver_kept``: a signal kept meanwhile is delivered now, as it would have
    been without ``defer_signals`` (a command that turns out not to serve: ``run --once``); else it is
    dropped (the command failed before it served, and ends anyway)."""
    for signum, handler in list(_before_deferring.items()):
        signal.signal(signum, handler)
        del _before_deferring[signum]
    for fd in (fd for pipe in _reserved for fd in pipe):
        os.close(fd)
    _reserved.clear()
    kept, _deferred[:] = list(_deferred), []
    for signum in kept if deliver_kept else ():
        signal.raise_signal(signum)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """``defer_signals`` for the time of the block, the handlers put back at its end: a server's
    whole life, from its command's start."""
    defer_signals()
    try:
        yield
    finally:
        restore_signals()


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
    wakeup_r, wakeup_w = _reserved.pop() if _reserved else _wakeup_pipe()
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
