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


class Duration(click.ParamType[float]):
    """A time option: ``60``, ``60s``, ``500ms``, ``2m``; the value is in seconds, at least ``minimum``."""

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
            self.fail(f"{value!r} is shorter than the minimum of {self.minimum:g}s", param, ctx)
        return seconds
