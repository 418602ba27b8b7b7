"""The flags and env vars of the tools gpu-labeller replaces on gpu-labeller's commands (the table:
labeller.model.config.upstream_flags, those of labeller.model.upstream and those declared with a config key).
They are hidden from --help (one line at its end points to docs/migrating.md) and never offered by
"did you mean"; a given one sets its config key over the config file, or is one warning naming it."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from labeller.cli.commands.params import format_duration
from labeller.model.config import MIN_SLEEP_INTERVAL_S, upstream_flags
from labeller.host.machine import NodeOptions
from labeller.model.upstream import UpstreamFlag, flags_for, go_duration, overrides_and_warnings
from vendors import RESOURCE_NAMES
from labeller.base.log import get_logger

F = TypeVar("F", bound=Callable[..., Any])
log = get_logger("gpu_labeller.upstream")

EPILOG = ("Also takes the flags and env vars of the tools it replaces (NVIDIA's GPU Feature Discovery and device "
          "plugin, AMD's k8s-node-labeller and device plugin, gpushare, NVIDIA's and AMD's DRA drivers): see "
          "docs/migrating.md.")


class GoDuration(click.ParamType[str]):
    """A Go duration (GFD's --sleep-interval: 10s, 1m30s, 500ms), kept as written for the config key."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            seconds = go_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if seconds < MIN_SLEEP_INTERVAL_S:
            self.fail(f"{value!r} is shorter than {format_duration(MIN_SLEEP_INTERVAL_S)}", param, ctx)
        return str(value)


class GoInt(click.ParamType[int]):
    """An integer of Go's flag package. A one-letter Go flag with its value attached (``-v=5``) reaches
    click as ``-v`` and ``=5`` (click's short options take the rest of the word): the ``=`` is dropped."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip().removeprefix("=")
        try:
            return int(text, 0)
        except ValueError:
            self.fail(f"{value!r} is not an integer", param, ctx)


def _option(flag: UpstreamFlag) -> Callable[[F], F]:
    kind = flag.kind
    extra: dict[str, Any]
    if kind == "bool":  # as Go's and urfave's: --flag alone, or --flag=false
        extra = {"type": click.BOOL, "is_flag": False, "flag_value": "true"}
    elif kind == "switch":  # a Go bool before positional arguments (-d NODE): alone only
        extra = {"is_flag": True, "flag_value": True, "default": None}
    elif kind == "int":
        extra = {"type": GoInt()}
    elif kind == "list":  # repeated, or comma-separated (as upstream's env vars)
        extra = {"multiple": True}
    elif kind == "duration":
        extra = {"type": GoDuration()}
    elif isinstance(kind, tuple):
        extra = {"type": click.Choice(kind)}
    else:
        extra = {}
    extra.setdefault("default", None)
    return click.option(*flag.names, flag.dest, envvar=list(flag.env), hidden=True, **extra)


def _value(flag: UpstreamFlag, value: Any) -> Any:
    """None when not given; a list kind's values split at commas."""
    if flag.kind == "list":
        items = [item.strip() for text in value or () for item in text.split(",") if item.strip()]
        return tuple(items) if value else None
    return value


def _from_environment(flag: UpstreamFlag) -> str | None:
    """An upstream env var with no flag (gpushare's LOG_LEVEL): its first non-empty value, as click reads one."""
    return next((value for name in flag.env if (value := os.environ.get(name))), None)


def upstream_options(command: str) -> Callable[[F], F]:
    """The upstream flags ``command`` takes; place it below the node options (the command gets their
    config keys in ``node_options.overrides``; each one not honoured is logged once as a warning). A
    command without node options takes only flags that set no config key."""
    flags = flags_for(command, upstream_flags(RESOURCE_NAMES))
    declared = [flag for flag in flags if flag.names]

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def with_overrides(*args: Any, **kwargs: Any) -> Any:
            given = {flag: _value(flag, kwargs.pop(flag.dest) if flag.names else _from_environment(flag))
                     for flag in flags}
            overrides, warnings = overrides_and_warnings(given)
            for line in warnings:
                log.warning(line, reason="not-honoured")
            if overrides:
                node_options: NodeOptions = kwargs["node_options"]
                kwargs["node_options"] = dataclasses.replace(node_options,
                                                             overrides=node_options.overrides + overrides)
            return func(*args, **kwargs)

        command_func: Any = with_overrides
        for flag in reversed(declared):
            command_func = _option(flag)(command_func)
        return command_func  # type: ignore[no-any-return]

    return decorate
