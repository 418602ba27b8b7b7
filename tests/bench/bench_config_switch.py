"""Benchmark: per-node named configs switched live (issue 12). Prints figures; not a test.

Budget (issue 12): a change of the node label nvidia.com/device-plugin.config reaches the labeller's
labels on the Node, and the device plugin's capacity as the kubelet sees it, within 5 s, without a
restart.

Measured on the real processes, together, as a node runs them: ``gpu-labeller run`` against the fake
API server (real HTTP, real watch) and ``gpu-labeller device-plugin`` against the same server and the
kubelet emulator (real gRPC). Each switch alternates between configs that keep the resource name
(8 GPUs <-> 32 time-sliced replicas: the open ListAndWatch stream is updated) and one that renames it
(nvidia.com/gpu.shared: a new registration). Then ConfigMap edits (the kubelet's ``..data`` swap,
seen by the 1 s poll), the cost of that poll, and the plugin's RSS with and without following the label.

    python tests/bench/bench_config_switch.py [--switches 20] [--edits 5]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # the kubelet emulator's gRPC: no INFO lines on stream ends

from labeller.process.follow import POLL_SECONDS  # noqa: E402
from labeller.model.namedconfigs import CONFIG_LABEL, ConfigDir  # noqa: E402
from tests.bench.bench_plugin import rss_mib  # noqa: E402
from tests.builders import config_map_volume  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402
from tests.fakes.kubelet import FakeKubelet  # noqa: E402
from tests.plugin.profile_files import time_slicing  # noqa: E402
from vendors import RESOURCE_NAMES  # noqa: E402

NODE = "gpu-node-1"
PROFILE = "dgx-h100"  # 8 GPUs
GPU, SHARED = "nvidia.com/gpu", "nvidia.com/gpu.shared"
WHOLE = {"version": "v1"}


CONFIGS = {"default": WHOLE, "ts4": time_slicing(4), "ts2-renamed": time_slicing(2, rename=True)}
# label value -> (nvidia.com/gpu.replicas on the Node, the resource and its capacity at the kubelet)
EXPECTED = {None: ("1", GPU, 8), "ts4": ("4", GPU, 32), "ts2-renamed": ("2", SHARED, 16)}


def wait(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.001) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def arrived(api: FakeApiServer, kubelet: FakeKubelet, since: float, replicas: str, resource: str,
            capacity: int, timeout: float = 10.0) -> tuple[float, float]:
    """When the write carrying ``replicas`` reached the API server, and when the kubelet saw ``capacity``
    of ``resource`` (time.monotonic()): read from the fakes' own records, so that waiting does not compete
    for the CPU with what is measured."""
    def write_at() -> float | None:
        for request in api.log.writes(since):
            labels = ((request.body or {}).get("metadata") or {}).get("labels") or {}
            if labels.get("nvidia.com/gpu.replicas") == replicas:
                return request.at
        return None

    def capacity_at() -> float | None:
        return next((o.at for o in kubelet.seen(resource, since) if o.event == "devices" and o.capacity == capacity
                     and o.allocatable == capacity), None)

    assert wait(lambda: write_at() is not None and capacity_at() is not None, timeout, step=0.02), \
        f"a switch to {replicas} replicas never arrived"
    labels, devices = write_at(), capacity_at()
    assert labels is not None and devices is not None
    return labels, devices


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "labeller.cli", "--log-level", "warning", *args]


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    return f"median {statistics.median(ms):.0f} ms, p95 {p95:.0f} ms, max {ms[-1]:.0f} ms"


def bench_switches(switches: int, edits: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="cfgb", dir="/tmp"))
    sock_dir = work / "dp"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with FakeApiServer() as api, FakeKubelet(sock_dir) as kubelet:
            api.create_node(NODE, {"kubernetes.io/hostname": NODE})
            kubeconfig = api.write_kubeconfig(work / "kubeconfig")
            configs = config_map_volume(work / "configs", CONFIGS)
            common = ("--simulate", PROFILE, "--config-dir", str(configs), "--kubeconfig", str(kubeconfig),
                      "--node-name", NODE, "--metrics-port", "0")
            processes.append(subprocess.Popen(cli("run", *common, "--interval", "3600", "--start-jitter", "0"),
                                              cwd=ROOT))
            processes.append(subprocess.Popen(cli("device-plugin", *common, "--socket-dir", str(sock_dir),
                                                  "--metrics-bind", "127.0.0.1"), cwd=ROOT,
                                              env={**os.environ, "GRPC_VERBOSITY": "ERROR"}))

            def settled(value: str | None) -> tuple[Callable[[], bool], Callable[[], bool]]:
                replicas, resource, capacity = EXPECTED[value]
                labels_done = lambda: (api.labels(NODE).get("nvidia.com/gpu.replicas") == replicas and  # noqa: E731
                                       api.labels(NODE).get("nvidia.com/device-plugin.config.applied") ==
                                       (value or "default"))
                capacity_done = lambda: kubelet.allocatable(resource) == capacity  # noqa: E731
                return labels_done, capacity_done

            labels_done, capacity_done = settled(None)
            assert wait(labels_done, 30) and kubelet.wait_for(capacity_done, 30), "never started"
            to_labels: dict[str, list[float]] = {"same name": [], "renamed": []}
            to_capacity: dict[str, list[float]] = {"same name": [], "renamed": []}
            # (label value, kind): back and forth under the same name, then to a new name and back
            sequence = [("ts4", "same name"), (None, "same name"), ("ts2-renamed", "renamed"), (None, "renamed")]
            for i in range(switches):
                value, kind = sequence[i % len(sequence)]
                replicas, resource, capacity = EXPECTED[value]
                started = time.monotonic()
                api.set_labels(NODE, {CONFIG_LABEL: value})
                labels_at, capacity_at = arrived(api, kubelet, started, replicas, resource, capacity)
                to_labels[kind].append(labels_at - started)
                to_capacity[kind].append(capacity_at - started)
                assert wait(settled(value)[0], step=0.02)  # the labels are all there before the next switch
                time.sleep(0.05)
            for kind in ("same name", "renamed"):
                print(f"label change -> new labels on the Node ({kind}, {len(to_labels[kind])} switches): "
                      f"{summary(to_labels[kind])}  (budget 5 s)")
                print(f"label change -> new capacity at the kubelet ({kind}, {len(to_capacity[kind])} switches): "
                      f"{summary(to_capacity[kind])}  (budget 5 s)")

            api.set_labels(NODE, {CONFIG_LABEL: "ts4"})
            assert wait(settled("ts4")[0]) and kubelet.wait_for(settled("ts4")[1])
            edit_labels, edit_capacity = [], []
            for i in range(edits):
                replicas = 3 if i % 2 == 0 else 4
                time.sleep(random.uniform(0, POLL_SECONDS))  # edits at any phase of the poll, as a user's come
                started = time.monotonic()
                config_map_volume(configs, {**CONFIGS, "ts4": time_slicing(replicas)})
                labels_at, capacity_at = arrived(api, kubelet, started, str(replicas), GPU, 8 * replicas)
                edit_labels.append(labels_at - started)
                edit_capacity.append(capacity_at - started)
            print(f"ConfigMap edit (..data swap) -> new labels ({edits} edits): {summary(edit_labels)}  "
                  f"(poll every {POLL_SECONDS:g} s)")
            print(f"ConfigMap edit (..data swap) -> new capacity ({edits} edits): {summary(edit_capacity)}")
            time.sleep(3)
            print(f"steady state, following the label: labeller RSS {rss_mib(processes[0].pid):.1f} MiB, "
                  f"plugin RSS {rss_mib(processes[1].pid):.1f} MiB")
            stop(processes)  # before the fake servers go
    finally:
        stop(processes)
        shutil.rmtree(work, ignore_errors=True)


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
            process.wait(10)


def bench_plugin_without_label() -> None:
    work = Path(tempfile.mkdtemp(prefix="cfgb", dir="/tmp"))
    try:
        configs = config_map_volume(work / "configs", CONFIGS)
        with FakeKubelet(work / "dp") as kubelet:
            process = subprocess.Popen(cli("device-plugin", "--simulate", PROFILE, "--config-dir", str(configs),
                                           "--config-label", "", "--socket-dir", str(work / "dp"), "--metrics-port",
                                           "0", "--metrics-bind", "127.0.0.1"), cwd=ROOT,
                                       env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
            try:
                assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8, 30)
                time.sleep(3)
                print(f"steady state, plugin following no label (no Kubernetes client): RSS "
                      f"{rss_mib(process.pid):.1f} MiB")
            finally:
                process.terminate()
                process.wait(10)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_poll(files: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="cfgb", dir="/tmp"))
    try:
        mounted = ConfigDir(config_map_volume(work / "mounted", {f"c{i}": WHOLE for i in range(files)}), RESOURCE_NAMES)
        plain = work / "plain"
        plain.mkdir()
        for i in range(files):
            (plain / f"c{i}").write_text("version: v1\n")
        for name, directory in (("ConfigMap volume (readlink ..data)", mounted), ("plain directory (stat each file)",
                                                                                  ConfigDir(plain, RESOURCE_NAMES))):
            runs = 20000
            seconds = timeit.timeit(directory.signature, number=runs) / runs
            print(f"poll of a {name}, {files} configs: {seconds * 1e6:.1f} us per check, "
                  f"{seconds / POLL_SECONDS * 100:.4f} % of one core at one check per {POLL_SECONDS:g} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--switches", type=int, default=20)
    parser.add_argument("--edits", type=int, default=5)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    bench_switches(args.switches, args.edits)
    bench_plugin_without_label()
    for files in (3, 20):
        bench_poll(files)


if __name__ == "__main__":
    main()
