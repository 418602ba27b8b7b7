"""The flags and env vars of GFD, NVIDIA's device plugin and AMD's labeller on gpu-labeller's commands
(the table: labeller.upstream). They are hidden from --help (one line at its end points to
docs/migrating.md); a given one sets its config key over the config file, or is a warning naming it."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click
import structlog

from labeller.config import MIN_SLEEP_INTERVAL_S
from labeller.host import NodeOptions
from labeller.upstream import UpstreamFlag, flags_for, go_duration, overrides_and_warnings

F = TypeVar("F", bound=Callable[..., Any])
log = structlog.get_logger("gpu_labeller.upstream")

EPILOG = ("Also takes the flags and env vars of NVIDIA's GPU Feature Discovery, NVIDIA's device plugin and "
          "AMD's k8s-node-labeller that mean something here: see docs/migrating.md.")


class GoDuration(click.ParamType[str]):
    """A Go duration (GFD's --sleep-interval: 10s, 1m30s, 500ms), kept as written for the config key."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            seconds = go_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if seconds < MIN_SLEEP_INTERVAL_S:
            self.fail(f"{value!r} is shorter than 10ms", param, ctx)
        return str(value)


def _option(flag: UpstreamFlag) -> Callable[[F], F]:
    kind = flag.kind
    extra: dict[str, Any]
    if kind == "bool":  # as Go's and urfave's: --flag alone, or --flag=false
        extra = {"type": click.BOOL, "is_flag": False, "flag_value": "true"}
    elif kind == "list":  # repeated, or comma-separated (as upstream's env vars)
        extra = {"multiple": True}
    elif kind == "duration":
        extra = {"type": GoDuration()}
    elif isinstance(kind, tuple):
        extra = {"type": click.Choice(kind)}
    else:
        extra = {}
    return click.option(*flag.names, flag.dest, envvar=list(flag.env), default=None, hidden=True, **extra)


def _value(flag: UpstreamFlag, value: Any) -> Any:
    """None when not given; a list kind's values split at commas."""
    if flag.kind == "list":
        items = [item.strip() for text in value or () for item in text.split(",") if item.strip()]
        return tuple(items) if value else None
    return value


def upstream_options(command: str) -> Callable[[F], F]:
    """The upstream flags ``command`` takes; place it below the node options (the command gets their
    config keys in ``node_options.overrides``; each one not honoured is logged once as a warning)."""
    flags = flags_for(command)

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def with_overrides(*args: Any, node_options: NodeOptions, **kwargs: Any) -> Any:
            given = {flag: _value(flag, kwargs.pop(flag.dest)) for flag in flags}
            overrides, warnings = overrides_and_warnings(given)
            for line in warnings:
                log.warning(line, reason="not-honoured")
            node_options = dataclasses.replace(node_options, overrides=node_options.overrides + overrides)
            return func(*args, node_options=node_options, **kwargs)

        command_func: Any = with_overrides
        for flag in reversed(flags):
            command_func = _option(flag)(command_func)
        return command_func  # type: ignore[no-any-return]

    return decorate
