"""The device plugin: one long-lived supervisor that serves a set of resources and swaps it live.

``serve(resources, ...)`` hands the plugin the set to serve from now on (after the first probe, a
SIGHUP, or a driver that came up late); the supervisor thread applies the latest one between two
registration ticks. ``DevicePlugin`` only wires its parts, one concern each:

- ``Supervisor`` (``labeller.apps.plugin.supervisor``): the thread that ticks;
- ``Serving`` (``labeller.apps.plugin.serving``): applying an offer, resource name by resource name:
  sockets, registrations, allocators (``labeller.apps.plugin.allocators``), CDI specs;
- ``HealthGauges`` (``labeller.apps.plugin.gauges``): the devices' health, its checks and its gauges;
- ``PluginManager`` (``labeller.apps.plugin.manager``): registration with the kubelet, and its restarts.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from labeller.model.config import Config
from labeller.model.offer import Resource
from labeller.apps.plugin.allocators import Allocators
from labeller.apps.plugin.cdi import CdiSpecs
from labeller.apps.plugin.gauges import HealthGauges
from labeller.process.health import POLL_SECONDS
from labeller.apps.plugin.manager import PluginManager
from labeller.apps.plugin.metrics import PluginMetrics
from labeller.apps.plugin.serving import Batch, Serving
from labeller.apps.plugin.supervisor import Supervisor
from labeller.model.vendor import Vendor
from vendors import VENDORS

if TYPE_CHECKING:
    from labeller.apps.plugin.gpushare_allocate import PodApi


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


class DevicePlugin:
    """Everything one ``gpu-labeller device-plugin`` process runs: ``start``, ``serve`` (any number
    of times), ``stop``."""

    def __init__(self, settings: PluginSettings, metrics: PluginMetrics | None = None,
                 vendors: Sequence[Vendor] = VENDORS):
        self.settings = settings
        self.vendors = tuple(vendors)
        self.metrics = metrics or PluginMetrics()
        self.health = HealthGauges(self.metrics, settings.health_env, settings.recovery_seconds,
                                   settings.health_poll_seconds)
        self.manager = PluginManager(settings.socket_dir / settings.kubelet_socket, self.metrics,
                                     settings.kubelet_missing_log_seconds)
        allocators = Allocators({vendor.name: vendor for vendor in vendors}, settings.node_name, settings.pod_api)
        cdi = CdiSpecs(settings.cdi_spec_dir, vendors) if settings.cdi_spec_dir is not None else None
        self.serving = Serving(settings.socket_dir, self.manager, self.metrics, self.health, allocators, cdi)
        self.supervisor = Supervisor(self._tick, settings.tick_seconds)
        self._pending: Batch | None = None  # what ``serve`` was given last, until the supervisor takes it
        self._pending_lock = threading.Lock()

    @property
    def resources(self) -> tuple[Resource, ...]:
        """What is served now."""
        return self.serving.resources

    @property
    def applied(self) -> int:
        """How many ``serve`` calls have taken effect (several pending ones count once)."""
        return self.serving.applied

    def serve(self, resources: Sequence[Resource], config: Config, host_root: Path,
              handles: Mapping[str, Any] | None = None) -> None:
        """Serve exactly ``resources`` from now on; the supervisor applies it at its next tick."""
        with self._pending_lock:
            self._pending = Batch(tuple(resources), config, host_root, tuple(sorted((handles or {}).items())))
        self.supervisor.wake()

    def _apply_pending(self) -> None:
        with self._pending_lock:
            offer, self._pending = self._pending, None
        if offer is not None:
            self.serving.apply(offer, self.vendors)

    def _tick(self) -> None:
        self._apply_pending()
        self.manager.tick()

    @property
    def ready(self) -> bool:
        """Something is served and every served resource is registered with the kubelet; or nothing is,
        because the config serves the GPUs through DRA."""
        return (bool(self.serving.resources) or self.serving.dra_serves) and self.manager.all_registered

    def healthy(self, stall_seconds: float) -> bool:
        """The supervisor ticked within ``stall_seconds``."""
        return self.supervisor.healthy(stall_seconds)

    def start(self) -> None:
        """Apply what ``serve`` was given so far, then supervise in a background thread."""
        self._apply_pending()
        self.supervisor.start()

    def stop(self) -> None:
        """Stop serving, remove our sockets, stop health checks."""
        self.supervisor.stop()
        self.manager.stop()
        self.health.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
