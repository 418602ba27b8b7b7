"""Fixtures for the device plugin tests: the kubelet emulator, the plugin."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from labeller.model.config import Config, parse_config
from labeller.host.machine import Host, NodeOptions, open_host
from labeller.model.inventory import Inventory
from labeller.apps.plugin.app import DevicePlugin, PluginSettings
from labeller.apps.plugin.prober import Prober
from labeller.process.configsource import ConfigSource
from labeller.process.loop import LoopOptions, ProcessLoop
from labeller.base.backoff import Backoff
from tests.builders import PATIENCE_S, offer_of
from tests.fakes.kubelet import FakeKubelet
from vendors import RESOURCE_NAMES


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(sock_dir) as fake:
        yield fake


@dataclass
class Running:
    plugin: DevicePlugin
    inventory: Inventory
    config: Config
    host_root: Path
    handles: dict[str, Any]  # the simulated node's stand-ins

    @property
    def nvml(self) -> ModuleType:
        """The simulated pynvml, with its test hooks (inject_xid, set_lost)."""
        module = self.handles["nvidia"]
        assert isinstance(module, ModuleType)
        return module


@contextmanager
def simulated(profile: str,
              config: dict[str, Any] | None = None) -> Iterator[tuple[Inventory, Config, Path, dict[str, Any]]]:
    with open_host(NodeOptions(simulate=profile)) as node:
        parsed = parse_config(config, RESOURCE_NAMES) if config is not None else node.config
        yield node.probe(), parsed, node.host_root, node.handles


@contextmanager
def running_plugin(sock_dir: Path, profile: str, config: dict[str, Any] | None = None, *,
                   recovery_seconds: float = 0.3, health_env: dict[str, str] | None = None,
                   poll_seconds: float = 0.05, cdi_spec_dir: Path | None = None) -> Iterator[Running]:
    with simulated(profile, config) as (inventory, cfg, host_root, handles):
        settings = PluginSettings(sock_dir, recovery_seconds=recovery_seconds, health_poll_seconds=poll_seconds,
                                  tick_seconds=0.05, health_env=health_env or {}, cdi_spec_dir=cdi_spec_dir)
        plugin = DevicePlugin(settings)
        plugin.serve(offer_of(inventory, cfg).resources, cfg, host_root, handles)
        with plugin:
            yield Running(plugin, inventory, cfg, host_root, handles)


@dataclass
class Probing:
    plugin: DevicePlugin
    node: Host
    loop: ProcessLoop
    exit_code: list[int]

    def sighup(self) -> None:
        """What SIGHUP does."""
        self.loop.request_reload()

    @property
    def sighup_pending(self) -> bool:
        """The loop has not taken the last SIGHUP yet."""
        return self.loop.reload_pending


@contextmanager
def probing_plugin(sock_dir: Path, node: Host, config_path: Path | None = None, *,
                   backoff: Backoff | None = None, recovery_seconds: float = 0.3,
                   cdi_spec_dir: Path | None = None) -> Iterator[Probing]:
    """The plugin as ``gpu-labeller device-plugin`` runs it: the prober loop on a thread, feeding the supervisor."""
    settings = PluginSettings(sock_dir, recovery_seconds=recovery_seconds, health_poll_seconds=0.05, tick_seconds=0.05,
                              health_env={}, cdi_spec_dir=cdi_spec_dir)
    exit_code: list[int] = []
    with DevicePlugin(settings) as plugin:
        loop = ProcessLoop(Prober(node, plugin), LoopOptions(), retry=backoff or Backoff(0.05, 0.2),
                           config=ConfigSource(node, config_path), inputs=node.offer_inputs)
        thread = threading.Thread(target=lambda: exit_code.append(loop.run()), daemon=True)
        thread.start()
        try:
            yield Probing(plugin, node, loop, exit_code)
        finally:
            loop.stop()
            thread.join(PATIENCE_S)
