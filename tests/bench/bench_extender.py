"""Benchmark: the gpushare-compatible scheduler extender (issue 11). Prints figures; not a test.

Budgets (issue 11), with 1,000 nodes x 8 GPUs and 10,000 placed pods:
  - filter p99 <= 10 ms for a pod against the 1,000 nodes (nodeCacheCapable: names in, names out);
  - bind p99 <= 20 ms against the fake API server (read the pod, patch the annotations, create the Binding);
  - cache build from a list of 10,000 pods <= 2 s;
  - extender RSS <= 150 MiB at that size.

The extender is the real ``gpu-labeller scheduler-extender`` process, against the fake API server
(real HTTP, real list and watch) in this process; calls go over one keep-alive HTTP connection, as
the kube-scheduler's do. Latencies are measured at the client, so they include HTTP and JSON.
Also measured: the allocation lock's cost, i.e. back-to-back binds to one node, each waiting for a
device-plugin stand-in (a pod watch in this process) to mark the previous pod allocated.

With ``--before DIR`` a second extender, run from another checkout (``PYTHONPATH=DIR``, same
interpreter), serves the same cluster; filter and prioritize calls alternate between the two (the
order swapped at each call), so both see the same machine and client, and each line is printed for
both with their ratio.

    python tests/bench/bench_extender.py [--nodes 1000] [--pods 10000] [--calls 500] [--before DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.model import gpushare  # noqa: E402
from labeller.apps.extender.cache import ShareCache  # noqa: E402
from labeller.cluster.kube import Kube  # noqa: E402
from tests.bench.bench_plugin import pct, rss_mib  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402

GPUS, UNITS = 8, 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_cluster(api: FakeApiServer, nodes: int, pods: int) -> list[dict[str, object]]:
    for n in range(nodes):
        name = f"node-{n:04}"
        api.create_node(name, labels={"gpushare": "true"})
        api.set_node_status(name,
                            capacity={gpushare.RESOURCE_MEM: str(GPUS * UNITS), gpushare.RESOURCE_COUNT: str(GPUS)})
    created = []
    for p in range(pods):
        node, gpu = f"node-{p % nodes:04}", (p // nodes) % GPUS
        created.append(api.create_pod(f"placed-{p:05}", f"team-{p % 20}", node=node, phase="Running",
                                      containers={"main": {gpushare.RESOURCE_MEM: str(1 + p % 3), "cpu": "1"}},
                                      annotations={gpushare.ANN_IDX: str(gpu), gpushare.ANN_ASSIGNED: "true"}))
    return created


class Client:
    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, path: str, body: object) -> tuple[float, object]:
        data = json.dumps(body).encode()
        started = time.perf_counter()
        self.connection.request("POST", path, data, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        answer = json.loads(response.read())
        return (time.perf_counter() - started) * 1000, answer


def plugin_stand_in(kube: Kube, stop: threading.Event) -> None:
    """Marks bound, assumed pods allocated as soon as the watch shows them (what Allocate does)."""
    _, rv = kube.list_pods(field_selector="spec.nodeName=node-0000")
    while not stop.is_set():
        for kind, pod in kube.watch_pods(rv, field_selector="spec.nodeName=node-0000", timeout_s=5):
            rv = pod["metadata"].get("resourceVersion", rv)
            if kind in ("ADDED", "MODIFIED") and gpushare.is_assumed(pod):
                kube.patch_pod_annotations(pod["metadata"]["namespace"], pod["metadata"]["name"],
                                           {gpushare.ANN_ASSIGNED: "true"})
            if stop.is_set():
                return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--before", type=Path, help="another checkout whose extender serves beside this one")
    args = parser.parse_args()
    with FakeApiServer() as api, tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        placed = build_cluster(api, args.nodes, args.pods)
        print(f"cluster: {args.nodes} nodes x {GPUS} GPUs x {UNITS} units, {args.pods} placed pods "
              f"(made in {time.perf_counter() - started:.1f} s)")

        cache = ShareCache()
        started = time.perf_counter()
        cache.replace_pods(placed, "0")
        built_ms = (time.perf_counter() - started) * 1000
        print(f"cache build from {len(placed)} listed pods (in memory): {built_ms:.0f} ms")

        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        kube, cache = Kube(str(kubeconfig)), ShareCache()
        started = time.perf_counter()
        cache.replace_pods(*kube.list_pods(field_selector="status.phase!=Succeeded,status.phase!=Failed"))
        print(f"cache build from a list of {args.pods} pods over HTTP (paginated, JSON decode included): "
              f"{(time.perf_counter() - started) * 1000:.0f} ms  (budget 2 s)")
        kube.close()
        started = time.perf_counter()
        process, port = start_extender(ROOT, kubeconfig)
        processes = [process]
        try:
            client = wait_ready(port)
            ready_s = time.perf_counter() - started
            print(f"extender start to ready (process start, imports, list of {args.nodes} nodes and {args.pods} pods "
                  f"over HTTP, cache build): {ready_s:.2f} s")
            clients = {"": client}
            if args.before:
                before, before_port = start_extender(args.before.resolve(), kubeconfig)
                processes.append(before)
                clients = {" (this)": client, " (before)": wait_ready(before_port)}
                print(f"before: {args.before.resolve()}")
            bench_filter(clients, args.nodes, args.calls)
            bench_bind(api, client, args.calls)
            bench_lock(api, client, kubeconfig)
            time.sleep(1.0)
            print(f"extender RSS with {args.nodes} nodes and {args.pods + args.calls + 50} pods cached: "
                  f"{rss_mib(process.pid):.1f} MiB  (budget 150 MiB)")
            if args.before:
                print("extender RSS of the other checkout (its cache without the binds above): "
                      f"{rss_mib(processes[1].pid):.1f} MiB")
        finally:
            for each in processes:
                each.terminate()
                each.wait(timeout=10)


def start_extender(checkout: Path, kubeconfig: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The extender of ``checkout`` (its own code first on sys.path), on a free port."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "labeller.cli", "--log-level", "warning",
                                "scheduler-extender", "--port", str(port), "--bind", "127.0.0.1",
                                "--kubeconfig", str(kubeconfig)],
                               cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process, port


def wait_ready(port: int) -> Client:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200:
                connection.close()
                return Client(port)
        except OSError:
            pass
        time.sleep(0.005)
    raise SystemExit("the extender did not become ready in 60 s")


def bench_filter(clients: dict[str, Client], nodes: int, calls: int) -> None:
    """Filter (three kinds of pod) and prioritize, each call made to every client in turn."""
    names = [f"node-{n:04}" for n in range(nodes)]
    pod = {"metadata": {"name": "probe", "namespace": "default", "uid": "u"},
           "spec": {"containers": [{"name": "main", "resources": {"limits": {gpushare.RESOURCE_MEM: "8"}}}]}}
    plain = {"metadata": {"name": "web", "namespace": "default"}, "spec": {"containers": [{"name": "main"}]}}
    nowhere = {**pod,
               "spec": {"containers": [{"name": "main", "resources": {"limits": {gpushare.RESOURCE_MEM: "16"}}}]}}
    for verb, label, body in (("filter", "gpu-mem pod", pod),
                              ("filter", "gpu-mem pod that fits nowhere (a reason per node)", nowhere),
                              ("filter", "pod without gpu-mem (passthrough)", plain),
                              ("prioritize", "", pod)):
        latencies: dict[str, list[float]] = {side: [] for side in clients}
        answers: dict[str, object] = {}
        order = list(clients)
        for number in range(calls):
            for side in order if number % 2 == 0 else order[::-1]:
                ms, answers[side] = clients[side].post(f"/gpushare-scheduler/{verb}", {"Pod": body, "NodeNames": names})
                latencies[side].append(ms)
        for side, answer in answers.items():
            figures = f"p50 {pct(latencies[side], 0.5):.2f} ms, p99 {pct(latencies[side], 0.99):.2f} ms"
            if verb == "prioritize":
                print(f"prioritize, {nodes} nodes{side}: {figures}")
            else:
                kept = len(answer["NodeNames"])  # type: ignore[index]
                print(f"filter, {label}, {nodes} nodes ({kept} kept){side}: {figures}  (budget p99 10 ms)")
        if len(clients) == 2:
            this, before = (latencies[side] for side in clients)
            print(f"  this/before: p50 {pct(this, 0.5) / pct(before, 0.5):.3f}, "
                  f"p99 {pct(this, 0.99) / pct(before, 0.99):.3f}")


def bench_bind(api: FakeApiServer, client: Client, calls: int) -> None:
    """Each bind to another node: no allocation-lock wait, the API round trips only."""
    pods = [api.create_pod(f"bench-{i:04}", containers={"main": {gpushare.RESOURCE_MEM: "4"}}) for i in range(calls)]
    time.sleep(0.5)  # let the watch catch up (binds read the pod from the API anyway)
    latencies, errors = [], 0
    for i, pod in enumerate(pods):
        ms, answer = client.post("/gpushare-scheduler/bind", {
            "PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
            "Node": f"node-{i % 1000:04}"})
        latencies.append(ms)
        errors += bool(answer["Error"])  # type: ignore[index]
    print(f"bind (get pod, patch annotations, create Binding) against the fake API server, {calls} binds, "
          f"{errors} errors: p50 {pct(latencies, 0.5):.2f} ms, p99 {pct(latencies, 0.99):.2f} ms  (budget p99 20 ms)")


def bench_lock(api: FakeApiServer, client: Client, kubeconfig: Path, binds: int = 50) -> None:
    """Back-to-back binds to one node: each waits for the stand-in plugin to allocate the previous pod."""
    kube = Kube(str(kubeconfig))
    stop = threading.Event()
    pods = [api.create_pod(f"same-node-{i:03}", containers={"main": {gpushare.RESOURCE_MEM: "1"}})
            for i in range(binds)]
    for pod in api.pods.list(None, lambda p: p["spec"].get("nodeName") == "node-0000")[0]:
        api.delete_pod(pod["metadata"]["name"], pod["metadata"]["namespace"])  # room for all of them
    thread = threading.Thread(target=plugin_stand_in, args=(kube, stop), daemon=True)
    thread.start()
    time.sleep(0.5)
    started = time.perf_counter()
    errors = 0
    for pod in pods:
        _, answer = client.post("/gpushare-scheduler/bind", {
            "PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
            "Node": "node-0000"})
        errors += bool(answer["Error"])  # type: ignore[index]
    elapsed = time.perf_counter() - started
    stop.set()
    print(f"allocation lock: {binds} binds to one node, each after the previous pod's Allocate (stand-in plugin "
          f"on a watch): {binds / elapsed:.0f} binds/s per node, {elapsed / binds * 1000:.1f} ms each, {errors} errors")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
