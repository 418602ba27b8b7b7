"""Fixtures for the daemon tests: a fake API server over real HTTP, and the real daemon against it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from labeller.apps.daemon.service import Daemon, Options
from labeller.process.loop import ProcessLoop
from labeller.apps.daemon.reconcile import owned, FightGuard, ProbeResult
from labeller.apps.daemon.sinks import EventSink, NodeSink, Sink
from labeller.cluster.kube import REQUEST_TIMEOUT, Kube
from labeller.apps.daemon.metrics import Metrics
from tests.builders import PATIENCE_S
from tests.fakes.apiserver import FakeApiServer

NODE = "gpu-node-1"
GPU_LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
              "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
OTHERS = {"team": "ml", "kubernetes.io/hostname": NODE, "nvidia.com/gpu.deploy.device-plugin": "true"}


@dataclass
class FakeProbe:
    """A probe whose answer the test sets: labels, partial, or an exception."""

    labels: dict[str, str] = field(default_factory=lambda: dict(GPU_LABELS))
    partial: bool = False
    error: Exception | None = None
    calls: int = 0

    def __call__(self) -> ProbeResult:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return ProbeResult(owned(self.labels), partial=self.partial)


class Running:
    """The real Daemon (and for Node output, its watcher) on a thread, talking HTTP to the fake."""

    def __init__(self, api: FakeApiServer, kubeconfig: Path, probe: Callable[[], ProbeResult], node: str = NODE,
                 sink: Callable[[Kube], Sink] | None = None, fights: FightGuard | None = None,
                 events: bool = False, inputs: Callable[[], object] | None = None,
                 request_timeout: tuple[float, float] = REQUEST_TIMEOUT, **options: Any) -> None:
        self.api, self.probe, self.node = api, probe, node
        self.metrics = Metrics()
        self.kube = Kube(str(kubeconfig), observer=self.metrics.observe_request, request_timeout=request_timeout)
        made = NodeSink(self.kube, node, watch=True, watch_timeout_s=30) if sink is None else sink(self.kube)
        if events:
            made = EventSink(made, self.kube, node, "default")
        options.setdefault("interval_s", 0.2)
        options.setdefault("start_jitter_s", 0.0)
        daemon_options = Options(**options)
        self.daemon = Daemon(node, probe, made, self.metrics, daemon_options, fights=fights)
        self.loop = ProcessLoop(self.daemon, daemon_options.loop(), inputs=inputs)
        self.thread = threading.Thread(target=self.loop.run, daemon=True)

    def start(self) -> Running:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.loop.stop()
        self.thread.join(timeout=PATIENCE_S)
        assert not self.thread.is_alive()

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value


@pytest.fixture
def start(api: FakeApiServer, kubeconfig: Path) -> Iterator[Callable[..., Running]]:
    running: list[Running] = []

    def starter(probe: Callable[[], ProbeResult] | None = None, **kwargs: Any) -> Running:
        daemon = Running(api, kubeconfig, probe or FakeProbe(), **kwargs).start()
        running.append(daemon)
        return daemon

    yield starter
    for daemon in running:
        daemon.stop()
