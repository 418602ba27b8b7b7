"""The discovery options every command shares (--host-root, --simulate, --config)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import click
import structlog

from labeller.config import Config, ConfigError, load_config, parse_document
from labeller.discovery import discover
from labeller.inventory import Inventory

if TYPE_CHECKING:
    from vendors.simulate import SimulatedNode, SimulatedProfile

F = TypeVar("F", bound=Callable[..., Any])
log = structlog.get_logger(__name__)


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
    """What to probe and with which config: this machine, a mounted host root, or a simulated node.

    A simulated node built from a profile file follows that file: every ``probe()`` reads it again
    and, when it changed, probes the node it describes now (and takes its ``config`` section when
    no ``--config`` was given)."""

    host_root: Path
    config: Config
    nvml: ModuleType | None = None
    simulation: SimulatedProfile | None = None
    config_from_profile: bool = False

    def probe(self) -> Inventory:
        if self.simulation is not None:
            self._follow_profile(self.simulation)
        return discover(self.host_root, self.nvml, firmware=self.config.labels.firmware)

    def _follow_profile(self, simulation: SimulatedProfile) -> None:
        from vendors.simulate import ProfileError

        where = str(simulation.path)

        def check(node: SimulatedNode) -> None:
            if self.config_from_profile:
                _profile_config(node, where)  # a bad config section rejects the whole change

        try:
            changed = simulation.refresh(check)
        except ProfileError as exc:
            log.error("profile changed but cannot be used; probing the previous simulated node", reason="bad-profile",
                      error=str(exc))
            return
        if changed:
            node = simulation.node
            self.host_root, self.nvml = node.host_root, node.nvml
            if self.config_from_profile:
                self.config = _profile_config(node, where)
            log.info("profile changed; simulated node rebuilt", reason="profile-changed", profile=where)


def _profile_config(node: SimulatedNode, where: str) -> Config:
    """The config a profile carries (the defaults when it has none); ProfileError naming ``where``."""
    from vendors.simulate import ProfileError

    if node.config is None:
        return Config()
    try:
        return parse_document(node.config)
    except ConfigError as exc:
        raise ProfileError(f"{where}: config: {exc}") from None


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
    from vendors.simulate import ProfileError, SimulatedProfile

    try:
        with SimulatedProfile(simulate) as simulation:
            node = simulation.node
            if config_path is None:
                config = _profile_config(node, simulate)
            yield Node(node.host_root, config, node.nvml, simulation if simulation.follows_file else None,
                       config_from_profile=config_path is None)
    except ProfileError as exc:
        raise BadInput(str(exc)) from None
