"""The device plugin's health: the board its streams read, the vendors' checks that mark it, and
the gauges and counters that show it.

One ``HealthBoard`` holds every served device's health; the vendors' checkers (``HealthChecks``)
mark it, and every open ListAndWatch stream sends the new list when it changes. Health survives a
swap of the offer: a device still served keeps its health, and the checkers are restarted only when
the physical devices (or the simulated host) change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labeller.model.offer import Resource
from labeller.apps.plugin.metrics import PluginMetrics
from labeller.process.health import HEALTHY, UNHEALTHY, HealthBoard, HealthChecks
from labeller.model.vendor import Vendor
from labeller.base.log import get_logger

log = get_logger(__name__)


class HealthGauges:
    """The health of the served devices, by resource: ``follow`` a new offer, ``forget`` a resource no
    longer served, ``stop``."""

    def __init__(self, metrics: PluginMetrics, env: Mapping[str, str], recovery_seconds: float,
                 poll_seconds: float) -> None:
        self.metrics = metrics
        self.board = HealthBoard((), recovery_seconds)
        self.board.listeners.append(self._changed)
        self.checks = HealthChecks(self.board, env, poll_seconds)
        self.resources: tuple[Resource, ...] = ()

    def follow(self, resources: tuple[Resource, ...], host_root: Path, handles: Mapping[str, Any],
               vendors: Sequence[Vendor]) -> None:
        """Watch the devices of ``resources`` from now on."""
        self.resources = resources
        physical = {d.physical for r in resources for d in r.devices}
        self.board.track(p.health_key for p in physical)  # open streams send the new lists now
        self.checks.follow(physical, host_root, handles, vendors)
        self.update()

    def _changed(self, key: str, healthy: bool, reason: str) -> None:
        for resource in self.resources:
            ids = [d.id for d in resource.devices if d.physical.health_key == key]
            if not ids:
                continue
            health = HEALTHY if healthy else UNHEALTHY
            self.metrics.health_changes.labels(resource=resource.name, health=health).inc(len(ids))
            (log.info if healthy else log.warning)("device health changed", resource=resource.name,
                                                   vendor=resource.vendor, device=ids[0].split("::")[0],
                                                   health=health, reason=reason)
        self.update()

    def update(self) -> None:
        """Each served resource's devices by health."""
        for resource in self.resources:
            healthy = sum(1 for d in resource.devices if self.board.healthy(d.physical.health_key))
            self.metrics.devices.labels(resource=resource.name, health=HEALTHY).set(healthy)
            self.metrics.devices.labels(resource=resource.name, health=UNHEALTHY).set(len(resource.devices) - healthy)

    def forget(self, name: str) -> None:
        """The resource ``name`` is no longer served: its gauges go."""
        for health in (HEALTHY, UNHEALTHY):
            try:
                self.metrics.devices.remove(name, health)
            except KeyError:
                pass

    def stop(self) -> None:
        self.checks.stop()
        self.board.close()
