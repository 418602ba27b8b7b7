"""Prometheus metrics of the device plugin, in their own registry (served by labeller.metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ALLOCATE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.allocations = Counter("gpu_labeller_plugin_allocations_total",
                                   "Allocate container requests by resource and outcome (ok, rejected).",
                                   ["resource", "outcome"], registry=r)
        self.allocate_duration = Histogram("gpu_labeller_plugin_allocate_duration_seconds",
                                           "Time to answer an Allocate call.", ["resource"],
                                           buckets=ALLOCATE_BUCKETS, registry=r)
        self.registrations = Counter("gpu_labeller_plugin_registrations_total",
                                     "Registrations with the kubelet by resource and outcome (ok, failed).",
                                     ["resource", "outcome"], registry=r)
        self.health_changes = Counter("gpu_labeller_plugin_health_changes_total",
                                      "Device health transitions by resource and new health.",
                                      ["resource", "health"], registry=r)
        self.devices = Gauge("gpu_labeller_plugin_devices", "Advertised devices by resource and health.",
                             ["resource", "health"], registry=r)
        self.registered = Gauge("gpu_labeller_plugin_registered",
                                "1 while the resource is registered with the current kubelet.", ["resource"],
                                registry=r)
