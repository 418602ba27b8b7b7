"""Prometheus metrics of the scheduler extender, in their own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from labeller.apps.extender.cache import ShareCache

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
WAIT_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self, cache: ShareCache, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("gpu_labeller_extender_requests_total", "Extender calls by verb (filter, prioritize, "
                                "bind, inspect) and outcome (ok, passthrough, unschedulable, error).",
                                ["verb", "outcome"], registry=r)
        self.duration = Histogram("gpu_labeller_extender_request_duration_seconds", "Time to answer an extender call.",
                                  ["verb"], buckets=LATENCY_BUCKETS, registry=r)
        self.bind_wait = Histogram("gpu_labeller_extender_bind_wait_seconds", "Time a bind waited for the node's "
                                   "previous gpu-mem pod to be allocated by the device plugin.",
                                   buckets=WAIT_BUCKETS, registry=r)
        self.api_requests = Counter("gpu_labeller_api_requests_total", "Kubernetes API requests by verb and HTTP "
                                    "code (0: no answer).", ["verb", "code"], registry=r)
        nodes = Gauge("gpu_labeller_extender_nodes", "Nodes sharing GPU memory (aliyun.com/gpu-mem capacity).",
                      registry=r)
        pods = Gauge("gpu_labeller_extender_pods", "Pods holding GPU memory in the extender's cache.", registry=r)
        nodes.set_function(lambda: cache.counts[0])
        pods.set_function(lambda: cache.counts[1])

    def observe_request(self, verb: str, code: int) -> None:
        self.api_requests.labels(verb=verb, code=str(code)).inc()
