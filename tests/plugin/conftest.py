"""Fixtures for the device plugin tests: a short socket directory, the kubelet emulator, the plugin."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from labeller.config import Config, parse_config
from labeller.discovery_options import open_node
from labeller.inventory import Inventory
from labeller.plugin.app import DevicePlugin, PluginSettings
from labeller.plugin.health import HealthPolicy
from tests.fakes.kubelet import FakeKubelet


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # unix socket paths are limited to 108 bytes: keep the directory short, not pytest's tmp_path
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
    nvml: ModuleType | None


@contextmanager
def simulated(profile: str, config: dict[str, Any] | None = None) -> Iterator[tuple[Inventory, Config, Path, ModuleType | None]]:
    with open_node(Path("/"), profile, None) as node:
        yield node.probe(), parse_config(config) if config is not None else node.config, node.host_root, node.nvml


@contextmanager
def running_plugin(sock_dir: Path, profile: str, config: dict[str, Any] | None = None, *,
                   recovery_seconds: float = 0.3, policy: HealthPolicy | None = None,
                   poll_seconds: float = 0.05) -> Iterator[Running]:
    with simulated(profile, config) as (inventory, cfg, host_root, nvml):
        settings = PluginSettings(sock_dir, recovery_seconds=recovery_seconds, health_poll_seconds=poll_seconds,
                                  tick_seconds=0.05, policy=policy or HealthPolicy())
        plugin = DevicePlugin(inventory, cfg, host_root, nvml, settings)
        with plugin:
            yield Running(plugin, inventory, cfg, host_root, nvml)
