"""A real ``gpu-labeller`` process whose JSON log lines are read as they come, so that a test awaits
what the process says it did (``config reloaded``, ``signal received``) instead of sleeping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, Self

from tests.builders import PATIENCE_S

Event = dict[str, Any]

EXIT_S = 20.0
"""Kubernetes sends SIGKILL 30 s (terminationGracePeriodSeconds) after SIGTERM: a process must be gone long
before. It takes well under a second on a quiet machine; the bound leaves room for a loaded one and still
tells a prompt exit from one that waits out a probe interval, a check interval or a watch (minutes)."""


class LoggedProcess:
    """``python -m labeller.cli --log-format json ARGS``; its stderr is collected on a thread:
    ``events`` holds each JSON line (with ``seen``, the monotonic time it was read), ``stderr`` every line."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, stdout: int | IO[Any] | None = subprocess.DEVNULL
                 ) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "labeller.cli", "--log-format", "json", *args],
                                     stderr=subprocess.PIPE, stdout=stdout, text=True,
                                     env={**os.environ, "GRPC_VERBOSITY": "ERROR", **(env or {})})
        self.events: list[Event] = []
        self.stderr: list[str] = []
        self._changed = threading.Condition()
        self._ended = False  # its stderr closed: the process exited, every line is read
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.stderr.append(line)
                try:
                    self.events.append({**json.loads(line), "seen": time.monotonic()})
                except ValueError:
                    pass
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    @property
    def log(self) -> str:
        with self._changed:
            return "".join(self.stderr)

    def matching(self, name: str | None = None, **fields: Any) -> list[Event]:
        """The events so far whose ``event`` is ``name`` (any, for None) and that have these fields."""
        with self._changed:
            return [e for e in self.events
                    if (name is None or e.get("event") == name) and all(e.get(k) == v for k, v in fields.items())]

    def event(self, name: str | None = None, timeout: float = PATIENCE_S, **fields: Any) -> Event:
        """The first event called ``name`` with these fields, waiting for it if needed."""
        return self.await_events(lambda found: len(found) >= 1, name, timeout, **fields)[0]

    def await_events(self, enough: Callable[[list[Event]], bool], name: str | None = None,
                     timeout: float = PATIENCE_S, **fields: Any) -> list[Event]:
        """The matching events, once ``enough(matching)`` holds; fails the test (with the log) after ``timeout``."""
        with self._changed:
            self._changed.wait_for(lambda: enough(self.matching(name, **fields)) or self._ended, timeout)
            found, ended = self.matching(name, **fields), self._ended
        if not enough(found):
            wanted = f"{name!r} {fields}" if fields else repr(name)
            why = f"before the process exited with {self.proc.wait(PATIENCE_S)}" if ended else f"within {timeout} s"
            raise AssertionError(f"no {wanted} in the log {why}:\n{self.log}")
        return found

    def count(self, name: str | None, **fields: Any) -> int:
        return len(self.matching(name, **fields))

    def stop(self, signum: signal.Signals = signal.SIGTERM) -> int:
        """Send ``signum`` (SIGTERM: as a kubelet stops a pod); the exit code of a process that exited within
        EXIT_S of logging the signal. The whole log is read by then."""
        self.proc.send_signal(signum)
        signalled = self.event("signal received", signal=signum.name)
        try:
            code = self.proc.wait(max(0.0, signalled["seen"] + EXIT_S - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {EXIT_S} s after {signum.name}:\n{self.log}") from None
        self._reader.join(PATIENCE_S)
        return code

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
