"""The node a command works on: this machine, a mounted host root, or a simulated node; with its
config. ``Node`` probes it and derives its offer and labels, through the registered vendors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from labeller import sharing
from labeller.config import Config, ConfigError, load_config, parse_document
from labeller.discovery import discover
from labeller.inventory import Inventory
from labeller.labels import LabelSet
from labeller.namedconfigs import Chooser, ConfigDir, Selection
from labeller.offer import Offer
from labeller.options import BadInput
from labeller.rules import node_labels
from labeller.vendor import Vendor
from vendors import RESOURCE_NAMES, VENDORS

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
    selection: Selection | None = None  # the named config in force, when configs come from a directory

    def probe(self) -> Inventory:
        if self.simulation is not None:
            self._follow_profile(self.simulation)
        return discover(self.host_root, self.config, self.vendors, self.handles)

    def offer(self, inventory: Inventory) -> Offer:
        """What the node offers (labeller.offer): what the plugin serves and the labels count."""
        return sharing.derive(inventory, self.config, self.vendors)

    def labels(self, inventory: Inventory, offer: Offer) -> LabelSet:
        """The node's labels; with a named config, also its state labels (on a node that has others)."""
        label_set = node_labels(inventory, self.config, offer, self.vendors)
        if self.selection is not None and label_set.labels:
            state = self.selection.labels()
            label_set.labels.update(state.labels)
            label_set.dropped.update(state.dropped)
            label_set.sources.update(state.sources)
        return label_set

    def read_config(self, path: Path) -> Config:
        """The config file at ``path`` (ConfigError naming it when it does not load)."""
        return load_config(path, RESOURCE_NAMES)

    def offer_inputs(self) -> object | None:
        """What the offer reads besides the hardware under this config (NVIDIA's MPS readiness file),
        as a cheap fingerprint; None when it reads nothing else (then no one needs to look)."""
        inputs = tuple(vendor.offer_inputs(self.config) for vendor in self.vendors)
        return inputs if any(i is not None for i in inputs) else None

    def select(self, selection: Selection) -> bool:
        """Put a named config in force; True when the config changed."""
        changed = selection.config != self.config
        self.config, self.selection = selection.config, selection
        return changed

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
        return parse_document(node.config, RESOURCE_NAMES)
    except ConfigError as exc:
        raise ProfileError(f"{where}: config: {exc}") from None


@contextmanager
def open_node(host_root: Path, simulate: str | None, config_path: Path | None,
              selection: Selection | None = None) -> Iterator[Node]:
    """Resolve the discovery options into a Node; bad input becomes a BadInput (exit code 2).
    ``selection``: a named config from a config directory, instead of ``config_path``."""
    try:
        config = selection.config if selection is not None else load_config(config_path, RESOURCE_NAMES)
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    if simulate is None:
        yield Node(host_root, config, selection=selection)
        return
    from vendors.simulate import ProfileError, SimulatedProfile

    try:
        with SimulatedProfile(simulate) as simulation:
            node = simulation.node
            from_profile = config_path is None and selection is None
            if from_profile:
                config = _profile_config(node, simulate)
            yield Node(node.host_root, config, node.handles, simulation if simulation.follows_file else None,
                       config_from_profile=from_profile, selection=selection)
    except ProfileError as exc:
        raise BadInput(str(exc)) from None


def named_configs(config_path: Path | None, config_dir: Path | None, config_name: str | None) -> Chooser | None:
    """The named configs ``--config-dir`` gives (None without it); BadInput for a combination that
    makes no sense."""
    if config_dir is None:
        if config_name:
            raise BadInput("--config-name needs --config-dir (the directory of named configs)")
        return None
    if config_path is not None:
        raise BadInput(f"give --config FILE or --config-dir DIR, not both (got {config_path} and {config_dir})")
    if not config_dir.is_dir():
        raise BadInput(f"{config_dir}: --config-dir: not a directory")
    return Chooser(ConfigDir(config_dir, RESOURCE_NAMES), config_name)


def chosen(config_path: Path | None, config_dir: Path | None, config_name: str | None) -> Selection | None:
    """A dry run's named config: the one ``--config-name`` names (else the default), which must load."""
    chooser = named_configs(config_path, config_dir, config_name)
    if chooser is None:
        return None
    try:
        return chooser.choose(None)
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
