"""The device plugin: one long-lived supervisor that serves a set of resources and swaps it live.

``serve(resources, ...)`` hands the supervisor the set to serve from now on (after the first probe,
a SIGHUP, or a driver that came up late). The supervisor thread applies it between two registration
ticks, resource name by resource name:

- a name already served keeps its socket and its registration: its devices are replaced and every
  open ListAndWatch stream sends the new list, so the Node never shows allocatable 0 in between;
- a new name gets its own socket server and is registered;
- a name no longer in the set is stopped: its stream ends and its socket is removed.

Health keeps running across swaps: a device still served keeps its health, and the checkers are
restarted only when the physical devices (or the simulated host) change.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import structlog

from labeller.config import Config
from labeller.gpushare import RESOURCE_COUNT
from labeller.offer import Resource
from labeller.plugin.allocate import Allocator, ResourceAllocator
from labeller.plugin.cdi import CdiSpecs
from labeller.process.health import HEALTHY, POLL_SECONDS, UNHEALTHY, HealthBoard, HealthChecks
from labeller.plugin.manager import PluginManager
from labeller.plugin.metrics import PluginMetrics
from labeller.plugin.server import DevicePluginService, ResourceSocket
from labeller.vendor import Vendor
from labeller.vendor.plugin import Allocate
from vendors import VENDORS

if TYPE_CHECKING:
    from labeller.plugin.gpushare_allocate import PodApi, PodMatcher

log = structlog.get_logger(__name__)


@dataclass
class PluginSettings:
    socket_dir: Path
    kubelet_socket: str = "kubelet.sock"
    recovery_seconds: float = 60.0
    health_poll_seconds: float = POLL_SECONDS / 2  # a KFD node that goes is seen by the kubelet well within 1 s
    tick_seconds: float = 0.1
    kubelet_missing_log_seconds: float = 60.0
    # the health switches NVIDIA's plugin reads (DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS)
    health_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    cdi_spec_dir: Path | None = None  # where CDI spec files go under a CDI deviceListStrategy; None: nowhere
    # Memory sharing (aliyun.com/gpu-mem) reads this node's pods: its name, and the API client, made
    # the first time such a resource is served (the only time the plugin loads the Kubernetes client).
    node_name: str = ""
    pod_api: Callable[[], PodApi] | None = None


@dataclass(frozen=True)
class _Batch:
    """A set of resources to serve, with what their allocators and health checks need."""

    resources: tuple[Resource, ...]
    config: Config
    host_root: Path
    handles: tuple[tuple[str, Any], ...]  # a simulated node's stand-ins, by vendor name


class DevicePlugin:
    """Everything one ``gpu-labeller device-plugin`` process runs: ``start``, ``serve`` (any number
    of times), ``stop``."""

    def __init__(self, settings: PluginSettings, metrics: PluginMetrics | None = None,
                 vendors: Sequence[Vendor] = VENDORS):
        self.settings = settings
        self._vendors = {vendor.name: vendor for vendor in vendors}
        self.metrics = metrics or PluginMetrics()
        self.resources: tuple[Resource, ...] = ()
        self.dra_serves = False  # the config serves GPUs through DRA: serving nothing is then ready
        self.applied = 0  # how many ``serve`` calls have taken effect (several pending ones count once)
        self.board = HealthBoard((), settings.recovery_seconds)
        self.board.listeners.append(self._on_health_change)
        self.manager = PluginManager(settings.socket_dir / settings.kubelet_socket, self.metrics,
                                     settings.kubelet_missing_log_seconds)
        self.last_tick = time.monotonic()
        self._services: dict[str, DevicePluginService] = {}
        self._health = HealthChecks(self.board, settings.health_env, settings.health_poll_seconds)
        self._batch: _Batch | None = None
        self._cdi = CdiSpecs(settings.cdi_spec_dir, vendors) if settings.cdi_spec_dir is not None else None
        self._offer_lock = threading.Lock()
        self._pods: PodMatcher | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what to serve ----------------------------------------------------------------------

    def serve(self, resources: Sequence[Resource], config: Config, host_root: Path,
              handles: Mapping[str, Any] | None = None) -> None:
        """Serve exactly ``resources`` from now on; the supervisor applies it at its next tick."""
        with self._offer_lock:
            self._batch = _Batch(tuple(resources), config, host_root, tuple(sorted((handles or {}).items())))
        self._wake.set()

    def _apply_offer(self) -> None:
        with self._offer_lock:
            offer, self._batch = self._batch, None
        if offer is None:
            return
        self.settings.socket_dir.mkdir(exist_ok=True)  # its parent exists: the command line checked
        if self._cdi is not None:  # before a kubelet can allocate the names Allocate gives
            self._cdi.update(offer.resources, offer.config, offer.host_root)
        policy = offer.config.plugin.shared_devices_allocation_policy
        before = {r.name: r for r in self.resources}
        for resource in offer.resources:
            allocator = self._allocator(resource, offer)
            service = self._services.get(resource.name)
            if service is None:
                service = DevicePluginService(allocator, self.board, self.metrics, policy)
                self.manager.add(ResourceSocket(service, self.settings.socket_dir))
                self._services[resource.name] = service
            else:
                service.update(allocator, policy)
            if before.get(resource.name) != resource:
                log.info("resource", resource=resource.name, vendor=resource.vendor, devices=len(resource.devices),
                         replicas=resource.replicas, change="updated" if resource.name in before else "added")
        for name in set(self._services) - {r.name for r in offer.resources}:
            del self._services[name]
            self.manager.remove(name)
            self._forget_device_gauges(name)
            log.info("resource", resource=name, vendor=before[name].vendor, change="removed")
        self.resources = offer.resources
        self.dra_serves = bool(offer.config.dra_vendors)
        physical = {d.physical for r in offer.resources for d in r.devices}
        self.board.track(p.health_key for p in physical)  # open streams send the new lists now
        self._health.follow(physical, offer.host_root, dict(offer.handles), tuple(self._vendors.values()))
        self._update_device_gauges()
        self.applied += 1

    def _allocator(self, resource: Resource, batch: _Batch) -> ResourceAllocator:
        memory = batch.config.sharing.memory
        if resource.strategy != "memory" or memory is None:
            return Allocator(resource, batch.config.sharing, self._vendor_allocate(resource, batch))
        from labeller.plugin import gpushare_allocate as by_memory  # loaded only where GPUs are shared by memory

        if resource.name == RESOURCE_COUNT:
            return by_memory.CountAllocator(resource)
        return by_memory.MemoryAllocator(resource, self._vendor_allocate(resource, batch), self._pod_matcher(),
                                         memory.unit)

    def _vendor_allocate(self, resource: Resource, batch: _Batch) -> Allocate:
        parts = self._vendors[resource.vendor].devices.plugin_parts()  # its first call imports the allocation module
        return parts.allocator(batch.config, batch.host_root, resource)

    def _pod_matcher(self) -> PodMatcher:
        """The one matcher of pods to Allocate calls, made when memory sharing is first served."""
        if self._pods is None:
            from labeller.plugin.gpushare_allocate import PodMatcher

            node, factory, problem, api = self.settings.node_name, self.settings.pod_api, None, None
            if not node:
                problem = "this node's name is unknown: give --node-name NAME or set NODE_NAME"
            elif factory is None:
                problem = "no Kubernetes API access configured"
            else:
                try:
                    api = factory()
                except Exception as exc:  # noqa: BLE001 - every Allocate then says why
                    problem = str(exc)
            if problem is not None:
                log.error("GPUs are shared by memory but this node's pods cannot be read; every gpu-mem "
                          "allocation will fail", reason="no-pod-access", node=node, error=problem)
            self._pods = PodMatcher(api, node, problem=problem)
        return self._pods

    # --- health -----------------------------------------------------------------------------

    def _on_health_change(self, key: str, healthy: bool, reason: str) -> None:
        for resource in self.resources:
            ids = [d.id for d in resource.devices if d.physical.health_key == key]
            if not ids:
                continue
            health = HEALTHY if healthy else UNHEALTHY
            self.metrics.health_changes.labels(resource=resource.name, health=health).inc(len(ids))
            (log.info if healthy else log.warning)("device health changed", resource=resource.name,
                                                   vendor=resource.vendor, device=ids[0].split("::")[0],
                                                   health=health, reason=reason)
        self._update_device_gauges()

    def _update_device_gauges(self) -> None:
        for resource in self.resources:
            healthy = sum(1 for d in resource.devices if self.board.healthy(d.physical.health_key))
            self.metrics.devices.labels(resource=resource.name, health=HEALTHY).set(healthy)
            self.metrics.devices.labels(resource=resource.name, health=UNHEALTHY).set(len(resource.devices) - healthy)

    def _forget_device_gauges(self, name: str) -> None:
        for health in (HEALTHY, UNHEALTHY):
            try:
                self.metrics.devices.remove(name, health)
            except KeyError:
                pass

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Something is served and every served resource is registered with the kubelet; or nothing is,
        because the config serves the GPUs through DRA."""
        return (bool(self.resources) or self.dra_serves) and self.manager.all_registered

    def healthy(self, stall_seconds: float) -> bool:
        """The supervisor ticked within ``stall_seconds``."""
        return time.monotonic() - self.last_tick < stall_seconds

    def start(self) -> None:
        """Apply what ``serve`` was given so far, then supervise in a background thread."""
        self._apply_offer()
        self._thread = threading.Thread(target=self._supervise, name="plugin-supervisor", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.is_set():
            self.last_tick = time.monotonic()
            try:
                self._apply_offer()
                self.manager.tick()
            except Exception:  # one bad tick must not end supervision: the next tick retries
                log.exception("supervisor tick failed; retrying")
            self._wake.wait(self.settings.tick_seconds)
            self._wake.clear()

    def stop(self) -> None:
        """Stop serving, remove our sockets, stop health checks."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.manager.stop()
        self._health.stop()
        self.board.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
