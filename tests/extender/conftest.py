"""Fixtures for the extender tests: the fake API server, the real extender on a free port against it,
a client speaking the kube-scheduler extender protocol, and a device-plugin stand-in."""

from __future__ import annotations

import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from labeller.model import gpushare
from labeller.apps.extender.binder import BindOptions
from labeller.apps.extender.app import Running, start
from labeller.cluster.kube import Kube
from labeller.process.httpserver import HttpLimits
from tests.builders import PATIENCE_S, wait_for
from tests.fakes.apiserver import FakeApiServer

Obj = dict[str, Any]


def share_node(api: FakeApiServer, name: str, gpus: int = 2, units: int = 16) -> None:
    """A node whose device plugin advertises ``gpus`` GPUs of ``units`` gpu-mem each."""
    api.create_node(name, labels={"gpushare": "true"})
    api.set_node_status(name, capacity={gpushare.RESOURCE_MEM: str(gpus * units), gpushare.RESOURCE_COUNT: str(gpus),
                                        "cpu": "8"})


def mem_pod(api: FakeApiServer, name: str, *units: int, namespace: str = "default", **fields: Any) -> Obj:
    """A pending pod with one container per entry of ``units`` asking that much gpu-mem."""
    containers = {f"c{i}": {gpushare.RESOURCE_MEM: str(u), "cpu": "1"} for i, u in enumerate(units)}
    return api.create_pod(name, namespace, containers=containers, **fields)


class Client:
    """The kube-scheduler's side of the extender protocol, over real HTTP."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=PATIENCE_S) as answer:
                raw = answer.read()
                status = answer.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()

    def filter(self, pod: Obj, nodes: list[str]) -> Obj:
        status, answer = self.call("POST", "/gpushare-scheduler/filter", {"Pod": pod, "NodeNames": nodes})
        assert status == 200, answer
        return answer  # type: ignore[no-any-return]

    def prioritize(self, pod: Obj, nodes: list[str]) -> dict[str, int]:
        status, answer = self.call("POST", "/gpushare-scheduler/prioritize", {"Pod": pod, "NodeNames": nodes})
        assert status == 200, answer
        return {entry["Host"]: entry["Score"] for entry in answer}

    def bind(self, pod: Obj, node: str) -> str:
        """The ExtenderBindingResult's Error ("" when bound)."""
        metadata = pod["metadata"]
        status, answer = self.call("POST", "/gpushare-scheduler/bind", {
            "PodName": metadata["name"], "PodNamespace": metadata["namespace"], "PodUID": metadata["uid"],
            "Node": node})
        assert status == 200, answer
        return str(answer["Error"])

    def inspect(self, node: str = "") -> list[Obj]:
        status, answer = self.call("GET", "/gpushare-scheduler/inspect" + (f"/{node}" if node else ""))
        assert status == 200, answer
        return answer["nodes"]  # type: ignore[no-any-return]


class PluginStandIn:
    """What the device plugin does at Allocate, for the extender's sake: marks each pod bound to a
    node and still assumed as assigned (ASSIGNED=true, ASSIGN_TIME)."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.stop = threading.Event()
        self.allocated: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.005):
            for pod in self.api.pods.list(None)[0]:
                if pod["spec"].get("nodeName") and gpushare.is_assumed(pod):
                    self.api.set_pod_annotations(pod["metadata"]["name"], {gpushare.ANN_ASSIGNED: "true",
                                                 gpushare.ANN_ASSIGN_TIME: "1"}, pod["metadata"]["namespace"])
                    self.allocated.append(gpushare.pod_key(pod))

    def __enter__(self) -> PluginStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=PATIENCE_S)


Start = Callable[..., Running]


@pytest.fixture
def start_extender(kubeconfig: Path) -> Iterator[Start]:
    """Start the real extender (port 0) against the fake; waits until its first lists are in."""
    started: list[Running] = []

    def launch(policy: str = "binpack", wait_s: float = 2.0, stale_s: float = 60.0, *,
               limits: HttpLimits = HttpLimits(), tls: ssl.SSLContext | None = None, **options: Any) -> Running:
        running = start(lambda metrics: Kube(str(kubeconfig), observer=metrics.observe_request, pool_size=16),
                        0, "127.0.0.1", BindOptions(policy=policy, wait_s=wait_s, stale_s=stale_s, **options),
                        watch_timeout_s=5, limits=limits, tls=tls)
        started.append(running)
        wait_for(lambda: len(running.cache.synced) == 3)
        return running

    yield launch
    for running in started:
        running.close()


@pytest.fixture
def extender(start_extender: Start) -> Running:
    return start_extender()


@pytest.fixture
def client(extender: Running) -> Client:
    return Client(extender.http.port)
