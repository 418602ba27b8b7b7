"""structlog set-up: JSON lines in a cluster (or when asked), readable lines on a terminal."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

LEVELS = ("debug", "info", "warning", "error")


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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
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
