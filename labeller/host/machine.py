"""The host a command works on: this machine, a mounted host root, or a simulated node; with its
config. ``Host`` probes it and derives its offer, labels and DRA devices, through the registered vendors.
``NodeOptions`` is what the command line says of it (and, for the processes that follow their
Node, where to read that Node); ``open_host`` resolves them into a ``Host``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labeller.model import sharing
from labeller.model.config import Config, ConfigError, load_config, parse_config, parse_document
from labeller.host.discovery import discover
from labeller.model.inventory import Inventory
from labeller.model.labels import LabelSet
from labeller.base.errors import InputError
from labeller.model.namedconfigs import CONFIG_LABEL, Chooser, ConfigDir, Selection
from labeller.model.offer import Offer
from labeller.model.nodelabels import node_labels
from labeller.model.resourceslices import DraDevice
from labeller.model.upstream import Overrides, overlay
from labeller.model.vendor import Vendor
from labeller.model.vendor.dra import DraState
from vendors import RESOURCE_NAMES, VENDORS
from labeller.base.log import get_logger

if TYPE_CHECKING:
    from vendors.simulate import SimulatedNode, SimulatedProfile

log = get_logger(__name__)


@dataclass
class Host:
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
    overrides: Overrides = ()  # config keys the command line sets over every config read (labeller.model.upstream)

    def probe(self) -> Inventory:
        if self.simulation is not None:
            self._follow_profile(self.simulation)
        return discover(self.host_root, self.config, self.vendors, self.handles)

    def offer(self, inventory: Inventory) -> Offer:
        """What the node offers (labeller.model.offer): what the plugin serves and the labels count."""
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

    def dra_devices(self, inventory: Inventory, offer: Offer, every_vendor: bool = False,
                    states: Mapping[str, DraState] | None = None) -> dict[str, list[DraDevice]]:
        """What the node publishes through DRA, by driver ("gpu.nvidia.com"): the devices of each
        vendor the config serves through DRA (``labeller.dra.vendors``) that has any here, its GPUs
        shared by memory under ``sharing.memory`` (``sharing.memory_shared_devices``); with
        ``every_vendor``, of every vendor with a DRA driver, served or not (what ``explain`` shows).
        ``states``: what the DRA plugin knows of each driver (what it made, whether the API server
        keeps counters); none: nothing made, counters kept."""
        found = {}
        for vendor in self.vendors:
            if vendor.dra is not None and (every_vendor or self.config.served_by_dra(vendor.name)):
                state = (states or {}).get(vendor.dra.driver, DraState())
                devices = vendor.dra.devices(inventory, offer, self.config, state)
                if self.config.sharing.memory is not None and vendor.devices.memory_shared is not None:
                    devices = sharing.memory_shared_devices(devices, self.config.sharing.memory)
                if devices:
                    found[vendor.dra.driver] = devices
        return found

    def read_config(self, path: Path) -> Config:
        """The config file at ``path`` (ConfigError naming it when it does not load)."""
        return load_config(path, RESOURCE_NAMES, self.overrides)

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
                _profile_config(node, where, self.overrides)  # a bad config section rejects the whole change

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
                self.config = _profile_config(node, where, self.overrides)
            log.info("profile changed; simulated node rebuilt", reason="profile-changed", profile=where)


def _profile_config(node: SimulatedNode, where: str, overrides: Overrides = ()) -> Config:
    """The config a profile carries (the defaults when it has none), with ``overrides`` set over it;
    ProfileError naming ``where``."""
    from vendors.simulate import ProfileError

    try:
        if node.config is None:
            return parse_config(overlay(None, overrides), RESOURCE_NAMES)
        return parse_document(node.config, RESOURCE_NAMES, overrides)
    except ConfigError as exc:
        raise ProfileError(f"{where}: config: {exc}") from None


class OptionsError(InputError):
    """Options that do not go together, or a directory that is not one."""


@dataclass(frozen=True)
class NodeOptions:
    """The host and config options every command on a node shares (``--host-root``, ``--simulate``,
    ``--config``, ``--config-dir``, ``--config-name``) and, for the processes that follow their Node's
    config label, that label and how to read the Node (``--config-label``, ``--node-name``,
    ``--kubeconfig``)."""

    host_root: Path = Path("/")
    simulate: str | None = None
    config_path: Path | None = None
    config_dir: Path | None = None
    config_name: str | None = None
    config_label: str = CONFIG_LABEL
    node_name: str | None = None
    kubeconfig: str | None = None
    overrides: Overrides = ()  # config keys set by upstream tools' flags (labeller.model.upstream), over every config

    def named_configs(self) -> Chooser | None:
        """The named configs ``--config-dir`` gives (None without it); OptionsError for a combination
        that makes no sense."""
        if self.config_dir is None:
            if self.config_name:
                raise OptionsError("--config-name needs --config-dir (the directory of named configs)")
            return None
        if self.config_path is not None:
            raise OptionsError(f"give --config FILE or --config-dir DIR, not both "
                               f"(got {self.config_path} and {self.config_dir})")
        if not self.config_dir.is_dir():
            raise OptionsError(f"{self.config_dir}: --config-dir: not a directory")
        return Chooser(ConfigDir(self.config_dir, RESOURCE_NAMES, self.overrides), self.config_name)

    def chosen(self) -> Selection | None:
        """A dry run's named config: the one ``--config-name`` names (else the default), which must
        load (ConfigError)."""
        chooser = self.named_configs()
        return chooser.choose(None) if chooser is not None else None


@contextmanager
def open_host(options: NodeOptions, selection: Selection | None = None) -> Iterator[Host]:
    """The host ``options`` name, with its config: ``selection`` (a named config), else ``--config``,
    else a simulated profile's own config, else the defaults. ConfigError or ProfileError (both
    InputError) when one does not load."""
    config = (selection.config if selection is not None
              else load_config(options.config_path, RESOURCE_NAMES, options.overrides))
    if options.simulate is None:
        yield Host(options.host_root, config, selection=selection, overrides=options.overrides)
        return
    from vendors.simulate import SimulatedProfile

    with SimulatedProfile(options.simulate) as simulation:
        node = simulation.node
        from_profile = options.config_path is None and selection is None
        if from_profile:
            config = _profile_config(node, options.simulate, options.overrides)
        yield Host(node.host_root, config, node.handles, simulation if simulation.follows_file else None,
                   config_from_profile=from_profile, selection=selection, overrides=options.overrides)
