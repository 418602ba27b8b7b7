"""Prometheus metrics of the DRA plugin, in their own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREPARE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class DraMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.prepares = Counter("gpu_labeller_dra_prepares_total",
                                "Claims prepared, by driver and outcome (ok, failed).", ["driver", "outcome"],
                                registry=r)
        self.unprepares = Counter("gpu_labeller_dra_unprepares_total",
                                  "Claims unprepared, by driver and outcome (ok, failed).", ["driver", "outcome"],
                                  registry=r)
        self.prepare_duration = Histogram("gpu_labeller_dra_prepare_duration_seconds",
                                          "Time to prepare one claim (checkpoint and CDI spec written).", ["driver"],
                                          buckets=PREPARE_BUCKETS, registry=r)
        self.registrations = Counter("gpu_labeller_dra_registrations_total",
                                     "Registration outcomes the kubelet reported, by driver (ok, rejected).",
                                     ["driver", "outcome"], registry=r)
        self.registered = Gauge("gpu_labeller_dra_registered", "1 while the driver is registered with the kubelet.",
                                ["driver"], registry=r)
        self.devices = Gauge("gpu_labeller_dra_devices", "Devices by driver and health (published: the healthy ones).",
                             ["driver", "health"], registry=r)
        self.probes = Counter("gpu_labeller_dra_probes_total", "Probes of the node (each compares the devices found "
                              "with what is published).", registry=r)
        self.gates_off = Gauge("gpu_labeller_dra_feature_gate_off", "1 for a feature gate the API server has off, "
                               "found from the fields it dropped (published without that feature).", ["gate"],
                               registry=r)
        self.slice_writes = Counter("gpu_labeller_dra_slice_writes_total",
                                    "ResourceSlice writes by verb (create, update, delete) and outcome (ok, failed).",
                                    ["verb", "outcome"], registry=r)
