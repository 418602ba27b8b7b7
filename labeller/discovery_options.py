"""The discovery options every command shares (--host-root, --simulate, --config)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import click

from labeller.config import Config, ConfigError, load_config, parse_document
from labeller.discovery import discover
from labeller.inventory import Inventory

F = TypeVar("F", bound=Callable[..., Any])


class BadInput(click.ClickException):
    """Bad user input (config, profile, flag value): one line on stderr, exit code 2."""

    exit_code = 2


def discovery_options(func: F) -> F:
    func = click.option(
        "--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), envvar="CONFIG_FILE",
        help="Config file (NVIDIA device-plugin config v1 format plus a 'labeller' section). [env: CONFIG_FILE]",
    )(func)
    func = click.option(
        "--simulate", metavar="PROFILE|FILE", envvar="GPU_LABELLER_SIMULATE",
        help="Replay a built-in profile (see 'gpu-labeller profiles') or a profile file instead of this machine. [env: GPU_LABELLER_SIMULATE]",
    )(func)
    func = click.option(
        "--host-root", type=click.Path(path_type=Path, file_okay=False), default=Path("/"), show_default=True,
        envvar="HOST_ROOT", help="Where the host's filesystem is mounted (a DaemonSet mounts it at e.g. /host). [env: HOST_ROOT]",
    )(func)
    return func


@dataclass
class Node:
    """What to probe and with which config: this machine, a mounted host root, or a simulated node."""

    host_root: Path
    config: Config
    nvml: ModuleType | None = None

    def probe(self) -> Inventory:
        return discover(self.host_root, self.nvml)


@contextmanager
def open_node(host_root: Path, simulate: str | None, config_path: Path | None) -> Iterator[Node]:
    """Resolve the discovery options into a Node; bad input becomes a BadInput (exit code 2)."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    if simulate is None:
        yield Node(host_root, config)
        return
    from vendors.simulate import ProfileError, simulated_node

    try:
        with simulated_node(simulate) as node:
            if config_path is None and node.config is not None:
                try:
                    config = parse_document(node.config)
                except ConfigError as exc:
                    raise BadInput(f"{simulate}: config: {exc}") from None
            yield Node(node.host_root, config, node.nvml)
    except ProfileError as exc:
        raise BadInput(str(exc)) from None
