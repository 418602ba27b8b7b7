"""The device plugin assembled: resources, health, one socket server per resource, the supervisor."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Self

import structlog

from labeller.config import Config
from labeller.inventory import Inventory
from labeller.plugin.allocate import Allocator
from labeller.plugin.health import (
    HEALTHY,
    UNHEALTHY,
    HealthBoard,
    HealthMonitor,
    HealthPolicy,
    KfdChecker,
    NvmlChecker,
)
from labeller.plugin.manager import PluginManager
from labeller.plugin.metrics import PluginMetrics
from labeller.plugin.resources import PhysicalDevice, Resource, advertised_resources
from labeller.plugin.server import DevicePluginService, SocketServer

log = structlog.get_logger(__name__)


@dataclass
class PluginSettings:
    socket_dir: Path
    kubelet_socket: str = "kubelet.sock"
    recovery_seconds: float = 60.0
    health_poll_seconds: float = 0.25
    tick_seconds: float = 0.1
    policy: HealthPolicy = field(default_factory=HealthPolicy.from_env)


class DevicePlugin:
    """Everything one ``gpu-labeller device-plugin`` process runs; ``start`` / ``stop`` / ``run``."""

    def __init__(self, inventory: Inventory, config: Config, host_root: Path, nvml: ModuleType | None,
                 settings: PluginSettings, metrics: PluginMetrics | None = None):
        self.settings = settings
        self.metrics = metrics or PluginMetrics()
        self.resources: list[Resource] = advertised_resources(inventory, config)
        physical = {d.physical.health_key: d.physical for r in self.resources for d in r.devices}
        self.board = HealthBoard(physical, settings.recovery_seconds)
        self.monitor = HealthMonitor(self.board, *self._checkers(list(physical.values()), host_root, nvml),
                                     poll_seconds=settings.health_poll_seconds)
        policy = config.plugin.shared_devices_allocation_policy
        self.services = [DevicePluginService(Allocator(r, config.plugin, config.sharing, host_root), self.board,
                                             self.metrics, policy) for r in self.resources]
        self.manager = PluginManager([SocketServer(s, settings.socket_dir) for s in self.services],
                                     settings.socket_dir / settings.kubelet_socket, self.metrics, settings.tick_seconds)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.board.listeners.append(self._on_health_change)
        self._update_device_gauges()

    def _checkers(self, physical: list[PhysicalDevice], host_root: Path,
                  nvml: ModuleType | None) -> tuple[NvmlChecker | None, KfdChecker | None]:
        policy = self.settings.policy
        if not policy.checks:
            log.warning("health checks disabled (DP_DISABLE_HEALTHCHECKS=all)")
            return None, None
        nvidia = [p for p in physical if p.vendor == "nvidia"]
        amd = [p for p in physical if p.vendor == "amd"]
        if nvidia and nvml is None:
            import pynvml

            nvml = pynvml
        nvml_checker = NvmlChecker(nvml, nvidia, self.board, policy) if nvidia and nvml is not None else None
        kfd_checker = KfdChecker(host_root, amd, self.board) if amd else None
        return nvml_checker, kfd_checker

    def _on_health_change(self, key: str, healthy: bool, reason: str) -> None:
        for resource in self.resources:
            ids = [d.id for d in resource.devices if d.physical.health_key == key]
            if not ids:
                continue
            health = HEALTHY if healthy else UNHEALTHY
            self.metrics.health_changes.labels(resource=resource.name, health=health).inc(len(ids))
            (log.info if healthy else log.warning)("device health changed", resource=resource.name,
                                                   device=ids[0].split("::")[0], health=health, reason=reason)
        self._update_device_gauges()

    def _update_device_gauges(self) -> None:
        for resource in self.resources:
            healthy = sum(1 for d in resource.devices if self.board.healthy(d.physical.health_key))
            self.metrics.devices.labels(resource=resource.name, health=HEALTHY).set(healthy)
            self.metrics.devices.labels(resource=resource.name, health=UNHEALTHY).set(len(resource.devices) - healthy)

    @property
    def ready(self) -> bool:
        return self.manager.all_registered

    def start(self) -> None:
        """Serve every resource and supervise registration in a background thread."""
        if not self.resources:
            log.warning("no devices found; nothing to serve")
        self.settings.socket_dir.mkdir(parents=True, exist_ok=True)
        self.monitor.start()
        self.manager.start()
        self._thread = threading.Thread(target=self.manager.run, args=(self._stop,), name="plugin-supervisor",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, remove our sockets, stop health checks."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.manager.stop()
        self.monitor.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
