"""What the device plugin serves, and how a new offer is applied: resource name by resource name.

- a name already served keeps its socket and its registration: its devices are replaced and every
  open ListAndWatch stream sends the new list, so the Node never shows allocatable 0 in between;
- a new name gets its own socket server and is registered;
- a name no longer in the set is stopped: its stream ends and its socket is removed.

CDI specs are written before any of it, so that a kubelet never allocates a name Allocate gives
before its spec exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labeller.model.config import Config
from labeller.model.offer import Resource
from labeller.apps.plugin.allocators import Allocators
from labeller.apps.plugin.cdi import CdiSpecs
from labeller.apps.plugin.gauges import HealthGauges
from labeller.apps.plugin.manager import PluginManager
from labeller.apps.plugin.metrics import PluginMetrics
from labeller.apps.plugin.server import DevicePluginService, ResourceSocket
from labeller.model.vendor import Vendor
from labeller.base.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Batch:
    """A set of resources to serve, with what their allocators and health checks need."""

    resources: tuple[Resource, ...]
    config: Config
    host_root: Path
    handles: tuple[tuple[str, Any], ...]  # a simulated node's stand-ins, by vendor name


class Serving:
    """The resources served now (``resources``), one socket service each; ``apply`` swaps them."""

    def __init__(self, socket_dir: Path, manager: PluginManager, metrics: PluginMetrics, health: HealthGauges,
                 allocators: Allocators, cdi: CdiSpecs | None) -> None:
        self.socket_dir, self.manager, self.metrics, self.health = socket_dir, manager, metrics, health
        self.allocators, self.cdi = allocators, cdi
        self.services: dict[str, DevicePluginService] = {}
        self.resources: tuple[Resource, ...] = ()
        self.dra_serves = False  # the config serves GPUs through DRA: serving nothing is then ready
        self.applied = 0  # how many offers have taken effect

    def apply(self, offer: Batch, vendors: Sequence[Vendor]) -> None:
        self.socket_dir.mkdir(exist_ok=True)  # its parent exists: the command line checked
        if self.cdi is not None:  # before a kubelet can allocate the names Allocate gives
            self.cdi.update(offer.resources, offer.config, offer.host_root)
        policy = offer.config.plugin.shared_devices_allocation_policy
        before = {r.name: r for r in self.resources}
        for resource in offer.resources:
            allocator = self.allocators.of(resource, offer.config, offer.host_root)
            service = self.services.get(resource.name)
            if service is None:
                service = DevicePluginService(allocator, self.health.board, self.metrics, policy)
                self.manager.add(ResourceSocket(service, self.socket_dir))
                self.services[resource.name] = service
            else:
                service.update(allocator, policy)
            if before.get(resource.name) != resource:
                log.info("resource", resource=resource.name, vendor=resource.vendor, devices=len(resource.devices),
                         replicas=resource.replicas, change="updated" if resource.name in before else "added")
        for name in set(self.services) - {r.name for r in offer.resources}:
            del self.services[name]
            self.manager.remove(name)
            self.health.forget(name)
            log.info("resource", resource=name, vendor=before[name].vendor, change="removed")
        self.resources = offer.resources
        self.dra_serves = bool(offer.config.dra_vendors)
        self.health.follow(offer.resources, offer.host_root, dict(offer.handles), vendors)
        self.applied += 1
