"""structlog set-up: JSON lines in a cluster (or when asked), readable lines on a terminal.

structlog is imported when the first line is logged, not before (``get_logger`` hands out a proxy):
importing it costs about 35 ms, a tenth of a cold dry run, which logs nothing when all goes well.
``configure`` before then is remembered and applied at that moment.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")
_pending: tuple[str, bool] | None = None  # what configure asked before structlog was imported
_applying = threading.Lock()  # threads logging their first lines at once: one applies, the others wait for it


class BestEffort:
    """The log's stream, where a line that cannot be written (the reader of a ``2>&1 | head`` pipe is
    gone, a full disk) is dropped: a process must go on, and stop when told, without its log."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        try:
            self.stream.write(text)
        except (OSError, ValueError):  # ValueError: the stream was closed
            pass

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass


def configure(level: str = "info", json_output: bool | None = None) -> None:
    """Log to stderr. ``json_output=None`` picks JSON inside Kubernetes or when stderr is not a TTY."""
    global _pending
    if json_output is None:
        json_output = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) or not sys.stderr.isatty()
    with _applying:
        if "structlog" in sys.modules:
            _pending = None
            _apply(level, json_output)
        else:
            _pending = (level, json_output)


def _apply(level: str, json_output: bool) -> None:
    import logging

    import structlog

    renderer: Any = structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=BestEffort(sys.stderr)),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


def loaded() -> ModuleType:
    """structlog, imported and configured as ``configure`` last asked."""
    global _pending
    import structlog

    if _pending is not None:
        with _applying:
            if _pending is not None:
                _apply(*_pending)
                _pending = None  # only once applied: a thread that finds None logs as configured
    return structlog


class _Logger:
    """A logger whose structlog logger is made on its first use (see the module's docstring)."""

    __slots__ = ("_name", "_logger")

    def __init__(self, name: str) -> None:
        self._name, self._logger = name, None

    def __getattr__(self, attr: str) -> Any:
        if self._logger is None:
            structlog = loaded()
            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, attr)


def get_logger(name: str) -> Any:
    """``structlog.get_logger(name)``, without importing structlog until a line is logged."""
    return _Logger(name)


def silence() -> None:
    """No log line from now on (shell completion: the shell reads stdout, the user sees stderr)."""
    import logging

    structlog = loaded()
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory(),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


@contextmanager
def at_least(level: str) -> Iterator[None]:
    """Drop records below ``level`` for a while (e.g. the per-profile info lines while many profiles
    are labelled for one answer), then log as configured again."""
    import logging

    structlog = loaded()
    before = structlog.get_config()["wrapper_class"]
    threshold = getattr(logging, level.upper())
    if before.get_effective_level(None) < threshold:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(threshold))
    try:
        yield
    finally:
        structlog.configure(wrapper_class=before)
