"""structlog set-up: JSON lines in a cluster (or when asked), readable lines on a terminal."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import structlog

LEVELS = ("debug", "info", "warning", "error")


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
    if json_output is None:
        json_output = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) or not sys.stderr.isatty()
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


@contextmanager
def at_least(level: str) -> Iterator[None]:
    """Drop records below ``level`` for a while (e.g. the per-profile info lines while many profiles
    are labelled for one answer), then log as configured again."""
    before = structlog.get_config()["wrapper_class"]
    threshold = getattr(logging, level.upper())
    if before.get_effective_level(None) < threshold:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(threshold))
    try:
        yield
    finally:
        structlog.configure(wrapper_class=before)
