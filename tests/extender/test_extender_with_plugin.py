"""Memory sharing end to end, in process: the real extender and the real device plugin share the fake
API server; a stand-in scheduler calls filter then bind over HTTP for pods created at once, and the
kubelet emulator admits each pod bound to the node as a kubelet does (one Allocate per container).
Every container must get the GPU its pod was bound to, and no GPU may hold more than it has."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from labeller.model import gpushare
from labeller.apps.extender.binder import BindOptions
from labeller.apps.extender.app import Running, start
from labeller.cluster.kube import Kube
from tests.builders import PATIENCE_S, wait_for
from tests.extender.conftest import Client
from tests.plugin.test_plugin_memory import COUNT, MEM, NODE, UNITS_PER_GPU, Node, cuda, memory_node


Obj = dict[str, Any]


@pytest.fixture
def node(sock_dir: Path, tmp_path: Path) -> Iterator[Node]:
    with memory_node(sock_dir, tmp_path) as served:
        # The kubelet's node status: what the plugin advertised.
        served.api.set_node_status(NODE, capacity={MEM: str(served.kubelet.allocatable(MEM)),
                                                   COUNT: str(served.kubelet.allocatable(COUNT)), "cpu": "16"})
        yield served


@pytest.fixture
def extender(node: Node, tmp_path: Path) -> Iterator[Running]:
    kubeconfig = str(node.api.write_kubeconfig(tmp_path / "extender-kubeconfig"))
    running = start(lambda metrics: Kube(kubeconfig, observer=metrics.observe_request, pool_size=8),
                    0, "127.0.0.1", BindOptions(policy="binpack", wait_s=2.0, stale_s=60.0), watch_timeout_s=5)
    wait_for(lambda: len(running.cache.synced) == 3)
    yield running
    running.close()


class Kubelet:
    """Admits every pod bound to the node, one at a time and in bind order, as a kubelet's pod workers do."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.envs: dict[str, list[dict[str, str]]] = {}  # pod -> one env per gpu-mem container
        self.failures: dict[str, str] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.01):
            for pod in self.node.api.pods.list(None)[0]:
                name = pod["metadata"]["name"]
                if pod["spec"].get("nodeName") != NODE or name in self.envs or name in self.failures:
                    continue
                units = [int(c["resources"]["limits"][MEM]) for c in pod["spec"]["containers"]
                         if MEM in c["resources"]["limits"]]
                try:
                    self.envs[name] = self.node.admit(*units)
                    self.node.api.set_pod_phase(name, "Running")
                except Exception as exc:  # noqa: BLE001 - whatever it is, the pod fails with it
                    self.failures[name] = str(exc)

    def __enter__(self) -> Kubelet:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=PATIENCE_S)


def schedule(client: Client, pod: Obj, deadline_s: float = PATIENCE_S) -> str:
    """What kube-scheduler does with the extender: filter, then bind; a held node is retried.
    Returns "" when bound, else the reason the node was filtered out."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        answer = client.filter(pod, [NODE])
        if NODE not in (answer["NodeNames"] or []):
            reasons = {**(answer["FailedNodes"] or {}), **(answer["FailedAndUnresolvableNodes"] or {})}
            return str(reasons[NODE])
        if client.bind(pod, NODE) == "":
            return ""
        time.sleep(0.02)  # the scheduler tries the pod again later: a held node is released by Allocate
    raise AssertionError(f"{pod['metadata']['name']} was not scheduled in {deadline_s} s")


def test_pods_created_at_once_each_get_the_gpu_they_were_bound_to(node: Node, extender: Running) -> None:
    client = Client(extender.http.port)
    equal = [node.api.create_pod(f"equal-{i}", containers={"main": cuda(7)}) for i in range(6)]
    mixed = node.api.create_pod("mixed",
                                containers={"a": cuda(3), "b": cuda(2), "sidecar": {"cpu": "1", "memory": "1Gi"}})
    pods = [*equal, mixed]
    wait_for(lambda: extender.cache.counts[0] == 1)

    with Kubelet(node) as kubelet, ThreadPoolExecutor(max_workers=len(pods)) as scheduler:
        errors = list(scheduler.map(lambda pod: schedule(client, pod), pods))
        assert errors == [""] * len(pods)
        assert wait_for(lambda: len(kubelet.envs) + len(kubelet.failures) == len(pods))
    assert kubelet.failures == {}

    on_gpu: collections.Counter[int] = collections.Counter()
    for pod in pods:
        name = pod["metadata"]["name"]
        annotations = node.annotations(name)
        index = int(annotations[gpushare.ANN_IDX])
        assert annotations[gpushare.ANN_ASSIGNED] == "true"
        for env in kubelet.envs[name]:
            assert env["NVIDIA_VISIBLE_DEVICES"] == node.uuids[index], name
            assert env["ALIYUN_COM_GPU_MEM_IDX"] == str(index)
        on_gpu[index] += int(annotations[gpushare.ANN_POD])
    assert max(on_gpu.values()) <= UNITS_PER_GPU
    assert sum(on_gpu.values()) == 6 * 7 + 5
    assert [(e["ALIYUN_COM_GPU_MEM_CONTAINER"], e["ALIYUN_COM_GPU_MEM_POD"]) for e in kubelet.envs["mixed"]] == \
        [("3", "5"), ("2", "5")]

    # 9 GiB left in all (where depends on the order of the binds): a 10 GiB pod fits nowhere.
    free = [UNITS_PER_GPU - on_gpu[index] for index in range(len(node.uuids))]
    assert extender.cache.free(NODE) == free
    too_big = node.api.create_pod("too-big", containers={"main": cuda(10)})
    assert schedule(client, too_big) == f"no GPU has 10 {MEM} free (most free on one GPU: {max(free)} of 14)"
    assert "nodeName" not in node.api.pod("too-big")["spec"]
