"""Prometheus metrics of the labelling daemon, in their own registry (served by labeller.process.httpserver)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from labeller.apps.daemon.reconcile import ProbeResult

PROBE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The daemon's metrics, in their own registry (several daemons can live in one process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.probe_duration = Histogram("gpu_labeller_probe_duration_seconds", "Time to probe the hardware.",
                                        buckets=PROBE_BUCKETS, registry=r)
        self.probes = Counter("gpu_labeller_probes_total", "Hardware probes by outcome (ok, partial, failed).",
                              ["outcome"], registry=r)
        self.reconciles = Counter("gpu_labeller_reconciles_total", "Reconciles by outcome (unchanged, applied, "
                                  "dry-run, held, node-missing, not-ours, failed).", ["outcome"], registry=r)
        self.api_requests = Counter("gpu_labeller_api_requests_total", "Kubernetes API requests by verb and HTTP "
                                    "code (0: no answer).", ["verb", "code"], registry=r)
        self.writes = Counter("gpu_labeller_writes_total", "Label writes by outcome (success, error).",
                              ["outcome"], registry=r)
        self.labels_owned = Gauge("gpu_labeller_labels_owned", "Labels gpu-labeller manages on its node (it set them).",
                                  registry=r)
        self.foreign_labels = Gauge("gpu_labeller_foreign_labels", "Labels under gpu-labeller's prefixes that other "
                                    "managers set and gpu-labeller leaves alone.", registry=r)
        self.last_success = Gauge("gpu_labeller_last_success_timestamp_seconds",
                                  "Unix time of the last successful reconcile.", registry=r)
        self.fights = Counter("gpu_labeller_label_fights_total", "Times another writer was caught undoing an "
                              "owned label again and again (gpu-labeller then repairs it at a slowing pace).",
                              registry=r)

    def observe_probe(self, result: ProbeResult) -> None:
        self.probe_duration.observe(result.duration_s)
        outcome = "failed" if result.error else "partial" if result.partial else "ok"
        self.probes.labels(outcome=outcome).inc()

    def observe_request(self, verb: str, code: int) -> None:
        self.api_requests.labels(verb=verb, code=str(code)).inc()
