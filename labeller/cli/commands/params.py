"""Click parameter types shared by every command."""

from __future__ import annotations

import re
from typing import Any

import click

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_SECONDS_PER_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from ``60``, ``60s``, ``500ms``, ``2m`` or ``1h`` (a bare number is seconds)."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 60, 60s, 500ms or 2m")
    return float(match.group(1)) * _SECONDS_PER_UNIT[match.group(2) or "s"]


def format_duration(seconds: float) -> str:
    """How help and errors show a duration, as the time options take it: ``500ms``, ``10s``, ``1.5s``."""
    if 0 < seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


class Duration(click.ParamType[float]):
    """A time option: ``60``, ``60s``, ``500ms``, ``2m``; the value is in seconds, at least ``minimum``.
    Give its default as a duration (``default="60s"``), so that --help shows one."""

    name = "duration"

    def __init__(self, minimum: float = 0.0) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if seconds < self.minimum:
            self.fail(f"{value!r} is shorter than the minimum of {format_duration(self.minimum)}", param, ctx)
        return seconds
