"""Named configs: a directory of whole config files (a mounted ConfigMap, one key per config) and
the choice of one of them for a node, as NVIDIA's config-manager makes it.

A node asks for a config by name with a node label (``nvidia.com/device-plugin.config=<name>``);
a node without the label gets the default: the name given (``--config-name``, the chart's
``config.default``), else the config called ``default``, else the only one (NVIDIA's fallback
strategies ``named`` and ``single``). ``Chooser.choose`` turns that into the ``Selection`` in force.

When the name asked for is unknown, or its file does not load, the selection keeps what was in
force and says why (``problem``), so a mistake never changes what a node serves. A process that
starts while its node asks for a broken config has nothing in force yet: it takes the config the
node's ``config.applied`` label names (what the labeller put in force before), else the default, so
the labeller and the device plugin agree after a restart too.

Only reading files: no Kubernetes, no threads (``labeller.process.follow`` follows the label and the
directory).
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

from labeller.model.config import Config, ConfigError, ResourceNames, load_config
from labeller.model.upstream import Overrides
from labeller.model.labels import Labels, LabelSet, derived, validated

CONFIG_LABEL = "nvidia.com/device-plugin.config"  # set by people or the GPU Operator, read only
STATE_LABEL = "nvidia.com/device-plugin.config.state"  # success | failed: written by gpu-labeller
APPLIED_LABEL = "nvidia.com/device-plugin.config.applied"  # the name in force: written by gpu-labeller
DEFAULT_NAME = "default"
KUBELET_DATA_LINK = "..data"  # a ConfigMap volume's files point through it; the kubelet swaps it on update


class NoConfig(ConfigError):
    """No config can be put in force: the one asked for fails and nothing good came before it."""


class ConfigDir:
    """A directory with one config file per name: every regular file whose name does not start with a
    dot (a ConfigMap volume's ``..data`` and timestamped directories are hidden). ``resource_names``:
    the registered vendors' (``vendors.RESOURCE_NAMES``), for parsing the files."""

    def __init__(self, path: Path, resource_names: ResourceNames, overrides: Overrides = ()) -> None:
        self.path = path
        self.resource_names = resource_names
        self.overrides = overrides  # config keys the command line sets over each file (labeller.model.upstream)

    def names(self) -> list[str]:
        try:
            entries = list(os.scandir(self.path))
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read the config directory: {exc.strerror or exc}") from None
        return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_file())

    def load(self, name: str) -> Config:
        """The config called ``name``; ConfigError naming the file, or the names there are."""
        names = self.names()
        if name not in names:
            there = ", ".join(names) if names else "none"
            raise ConfigError(f"no config named {name!r} in {self.path} (there: {there})")
        return load_config(self.path / name, self.resource_names, self.overrides)

    def signature(self) -> Hashable:
        """Changes whenever a config file may have: the target of a ConfigMap volume's ``..data`` link
        (one ``readlink``), else each file's identity, size and modification time."""
        try:
            return os.readlink(self.path / KUBELET_DATA_LINK)
        except OSError:
            pass
        try:
            entries = list(os.scandir(self.path))
        except OSError as exc:
            return ("unreadable", exc.errno)
        found = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            found.append((entry.name, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(sorted(found))


@dataclass(frozen=True)
class Selection:
    """The config in force on a node: ``name`` and its ``config``. ``wanted`` is the name the node asked
    for (None: it asked for none, so the default); ``problem`` says why that is not what is in force."""

    name: str
    config: Config
    wanted: str | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def labels(self) -> LabelSet:
        """The state labels gpu-labeller writes: ``config.state`` and ``config.applied`` (a name that
        is not a valid label value is dropped from the set, and reported there)."""
        state = LabelSet()
        state.add(self.state_labels(), Selection.labels)
        return validated(state)

    def state_labels(self) -> Labels:
        asked = "the default (no config label)" if self.wanted is None else repr(self.wanted)
        source = f"--config-dir: the node asked for {asked}; {self.name!r} is in force"
        why = f": {self.problem}" if self.problem else ""
        return {
            STATE_LABEL: derived("success" if self.ok else "failed", "config", source + why,
                                 "success when the config asked for is the one in force, else failed"),
            APPLIED_LABEL: derived(self.name, "config", source, "the name of the config in force"),
        }


class Chooser:
    """Chooses a node's config from a ConfigDir: see the module docstring."""

    def __init__(self, directory: ConfigDir, default: str | None = None) -> None:
        self.directory, self.default = directory, default or None

    def default_name(self) -> str:
        """The name a node without the label gets; ConfigError when there is no telling."""
        if self.default is not None:
            return self.default
        names = self.directory.names()
        if DEFAULT_NAME in names:
            return DEFAULT_NAME
        if len(names) == 1:
            return names[0]
        there = ", ".join(names) if names else "none"
        raise ConfigError(f"{self.directory.path}: no default config among {len(names)} ({there}): give "
                          f"--config-name (chart: config.default), or call one {DEFAULT_NAME!r}")

    def choose(self, wanted: str | None, hint: str | None = None, previous: Selection | None = None) -> Selection:
        """The selection for a node that asks for ``wanted`` (None or empty: the default).

        When that fails, what stays in force is, in order: the config ``hint`` names (the node's
        ``config.applied`` label), ``previous``, the default. NoConfig when none of them loads."""
        wanted = wanted or None
        try:
            name = wanted or self.default_name()
            return Selection(name, self.directory.load(name), wanted)
        except ConfigError as exc:
            problem = str(exc)
        if hint and hint != wanted:
            try:
                return Selection(hint, self.directory.load(hint), wanted, problem)
            except ConfigError:
                pass
        if previous is not None:
            return Selection(previous.name, previous.config, wanted, problem)
        if wanted is not None:
            try:
                name = self.default_name()
                return Selection(name, self.directory.load(name), wanted, problem)
            except ConfigError:
                pass
        raise NoConfig(problem)
