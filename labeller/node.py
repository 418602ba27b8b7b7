"""The node a command works on: this machine, a mounted host root, or a simulated node; with its
config. ``Node`` probes it and derives its offer and labels, through the registered vendors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from labeller import offer as offers
from labeller.config import Config, ConfigError, load_config, parse_document
from labeller.discovery import discover
from labeller.inventory import Inventory
from labeller.labels import LabelSet
from labeller.offer import Offer
from labeller.options import BadInput
from labeller.rules import node_labels
from labeller.vendor import Vendor
from vendors import VENDORS

if TYPE_CHECKING:
    from vendors.simulate import SimulatedNode, SimulatedProfile

log = structlog.get_logger(__name__)


@dataclass
class Node:
    """What to probe and with which config: this machine, a mounted host root, or a simulated node.

    A simulated node built from a profile file follows that file: every ``probe()`` reads it again
    and, when it changed, probes the node it describes now (and takes its ``config`` section when
    no ``--config`` was given)."""

    host_root: Path
    config: Config
    handles: dict[str, Any] = field(default_factory=dict)  # a simulated node's stand-ins, by vendor
    simulation: SimulatedProfile | None = None
    config_from_profile: bool = False
    vendors: Sequence[Vendor] = VENDORS

    def probe(self) -> Inventory:
        if self.simulation is not None:
            self._follow_profile(self.simulation)
        return discover(self.host_root, self.config, self.vendors, self.handles)

    def offer(self, inventory: Inventory) -> Offer:
        """What the node offers (labeller.offer): what the plugin serves and the labels count."""
        return offers.derive(inventory, self.config, self.vendors)

    def labels(self, inventory: Inventory, offer: Offer) -> LabelSet:
        return node_labels(inventory, self.config, offer, self.vendors)

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
            self.host_root, self.handles = node.host_root, node.handles
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
            yield Node(node.host_root, config, node.handles, simulation if simulation.follows_file else None,
                       config_from_profile=config_path is None)
    except ProfileError as exc:
        raise BadInput(str(exc)) from None
