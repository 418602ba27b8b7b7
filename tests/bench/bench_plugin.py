"""Benchmark: the device plugin against the kubelet emulator. Prints figures; not a test.

Budgets (issue 4, issue 14):
  - Allocate p99 <= 5 ms over 1,000 calls through a real unix-socket gRPC channel; also for MPS
    replicas (pipe and shm mounts), under CDI strategies (spec files written), and for a shared subset;
  - health change -> ListAndWatch update <= 1 s; kubelet restart -> re-registered <= 2 s;
  - plugin steady-state RSS <= 80 MiB.

Allocate, kubelet restarts and RSS are measured on the real ``gpu-labeller device-plugin`` process;
health latency in-process (the simulated NVML that takes injected XIDs lives in the plugin).

    python tests/bench/bench_plugin.py [--calls 1000] [--restarts 10] [--health 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from labeller.apps.plugin.api import api_pb2 as pb  # noqa: E402
from labeller.apps.plugin.api import api_pb2_grpc as pb_grpc  # noqa: E402
from labeller.host.machine import NodeOptions, open_host  # noqa: E402
from labeller.apps.plugin.app import PluginSettings  # noqa: E402
from tests.fakes.kubelet import FakeKubelet  # noqa: E402
from tests.builders import amd_part, nvidia_part  # noqa: E402
from tests.plugin.conftest import running_plugin  # noqa: E402
from vendors.nvidia import mps  # noqa: E402
from vendors.nvidia.model import NvidiaInventory  # noqa: E402

GPU = "nvidia.com/gpu"
POLL = PluginSettings(Path()).health_poll_seconds  # the production health poll interval
CLK_TCK = os.sysconf("SC_CLK_TCK")
RSS_PROFILES = ("dgx-h100", "dgx-a100-mig-mixed", "mi300x-x8-cpx")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_plugin(profile: str, sock_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "labeller.cli", "--log-level", "warning", "device-plugin", "--simulate", profile,
         "--socket-dir", str(sock_dir), "--metrics-port", "0", "--metrics-bind", "127.0.0.1", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


def allocate_latencies(sock_dir: Path, kubelet: FakeKubelet, resource: str, calls: int) -> list[float]:
    """Allocate ``calls`` times, one device each, round robin, over the plugin's unix socket (ms)."""
    ids = list(kubelet.devices(resource))
    endpoint = kubelet.endpoint(resource)
    assert endpoint is not None
    channel = grpc.insecure_channel(f"unix://{sock_dir / endpoint.endpoint}")
    stub = pb_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
    latencies = []
    for i in range(calls):
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[ids[i % len(ids)]])])
        started = time.perf_counter()
        stub.Allocate(request, timeout=5)
        latencies.append((time.perf_counter() - started) * 1000)
    channel.close()
    return latencies


def bench_sharing(calls: int) -> None:
    """Allocate under MPS (replicas served once the control daemon's readiness file says so), under
    CDI strategies (spec files written), and for a subset shared under its own name."""
    work = Path(tempfile.mkdtemp(prefix="dps", dir="/tmp"))
    try:
        mps_root, cdi_dir = work / "mps", work / "cdi"
        mps_root.mkdir()
        mps_config = work / "mps.yaml"
        mps_config.write_text(json.dumps({"version": "v1", "flags": {"mpsRoot": str(mps_root)}, "sharing": {
            "mps": {"resources": [{"name": GPU, "replicas": 4}]}}}))
        with open_host(NodeOptions(simulate="l40s-x4-mps", config_path=mps_config)) as node:
            offer = node.offer(node.probe())
        served = [mps.served(h.resource) for h in offer.held]
        mps.ready_file(str(mps_root)).write_text(mps.ready_document(served, time.time(), 3600))
        cdi_config = work / "cdi.yaml"
        cdi_config.write_text(json.dumps({"version": "v1", "flags": {"plugin": {
            "deviceListStrategy": ["cdi-cri", "cdi-annotations"]}}}))
        cases = [("l40s-x4-mps", GPU, "MPS", ["--config", str(mps_config)]),
                 ("dgx-h100", GPU, "CDI", ["--config", str(cdi_config), "--cdi-spec-dir", str(cdi_dir)]),
                 ("dgx-h100-4of8-shared", f"{GPU}.shared", "subset", [])]
        for profile, resource, kind, extra in cases:
            sock_dir = Path(tempfile.mkdtemp(prefix="dpb", dir="/tmp"))
            proc = start_plugin(profile, sock_dir, *extra)
            try:
                with FakeKubelet(sock_dir) as kubelet:
                    served = kubelet.wait_for(lambda: kubelet.allocatable(resource) > 0, 20)  # noqa: B023 - awaited here
                    assert served, f"{kind}: not served"
                    latencies = allocate_latencies(sock_dir, kubelet, resource, calls)
                    print(f"[{profile}] {kind}: Allocate, {calls} calls ({resource}, "
                          f"{kubelet.allocatable(resource)} devices): p50 {statistics.median(latencies):.2f} ms, "
                          f"p99 {pct(latencies, 0.99):.2f} ms, max {max(latencies):.2f} ms  (budget p99 <= 5 ms)")
            finally:
                proc.terminate()
                proc.wait(10)
                shutil.rmtree(sock_dir, ignore_errors=True)
        print(f"[dgx-h100] CDI spec files written: {sorted(p.name for p in cdi_dir.iterdir())}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_process(profile: str, calls: int, restarts: int, idle: float) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="dpb", dir="/tmp"))
    proc = start_plugin(profile, sock_dir)
    try:
        with FakeKubelet(sock_dir) as kubelet:
            resource = None
            deadline = time.monotonic() + 20
            while resource is None and time.monotonic() < deadline:
                resource = next((r.resource for r in kubelet.registrations), None)
                time.sleep(0.01)
            assert resource is not None, "the plugin never registered"
            assert kubelet.wait_for(lambda: kubelet.allocatable(resource) > 0, 10)
            latencies = allocate_latencies(sock_dir, kubelet, resource, calls)
            print(f"[{profile}] Allocate over a unix socket, {calls} calls ({resource}): "
                  f"p50 {statistics.median(latencies):.2f} ms, p99 {pct(latencies, 0.99):.2f} ms, "
                  f"max {max(latencies):.2f} ms  (budget p99 <= 5 ms)")
            times = []
            for _ in range(restarts):
                restarted = kubelet.restart()
                assert kubelet.wait_for(lambda: kubelet.allocatable(resource) > 0, 5), "not re-registered"
                times.append(time.monotonic() - restarted)
            if times:
                print(f"[{profile}] kubelet restart -> re-registered and listed, {restarts} restarts: "
                      f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms  (budget 2 s)")
            cpu_before = cpu_seconds(proc.pid)
            time.sleep(idle)
            cpu = (cpu_seconds(proc.pid) - cpu_before) / idle * 100
            print(f"[{profile}] steady state after {idle:g} s idle: RSS {rss_mib(proc.pid):.1f} MiB  (budget 80 MiB), "
                  f"CPU {cpu:.1f} % of one core")
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(sock_dir, ignore_errors=True)


def bench_health(trials: int) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="dpb", dir="/tmp"))
    try:
        with FakeKubelet(sock_dir) as kubelet, running_plugin(sock_dir, "dgx-h100", recovery_seconds=0.05,
                                                                    poll_seconds=POLL) as run:
            assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
            assert run.nvml is not None and run.inventory.part(NvidiaInventory) is not None
            down, up = [], []
            for i in range(trials):
                uuid = nvidia_part(run.inventory).gpus[i % 8].uuid
                started = time.monotonic()
                run.nvml.inject_xid(uuid, 79)
                assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 7, 5)
                down.append(time.monotonic() - started)
                started = time.monotonic()
                assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8, 5)
                up.append(time.monotonic() - started)
            print(f"[dgx-h100] XID -> Unhealthy seen by the kubelet, {trials} trials: median "
                  f"{statistics.median(down) * 1000:.1f} ms, max {max(down) * 1000:.1f} ms  (budget 1 s)")
            print(f"[dgx-h100] recovery (0.05 s quiet period) -> Healthy seen: median "
                  f"{statistics.median(up) * 1000:.1f} ms, max {max(up) * 1000:.1f} ms")
            uuid = nvidia_part(run.inventory).gpus[0].uuid
            started = time.monotonic()
            run.nvml.set_lost(uuid, True)
            assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 7, 5)
            print(f"[dgx-h100] GPU lost -> Unhealthy seen: {(time.monotonic() - started) * 1000:.1f} ms  (budget 1 s)")
            run.nvml.set_lost(uuid, False)
        with FakeKubelet(sock_dir) as kubelet, running_plugin(sock_dir, "mi210-x8", poll_seconds=POLL) as run:
            assert kubelet.wait_for(lambda: kubelet.allocatable("amd.com/gpu") == 8)
            kfd_node = amd_part(run.inventory).gpus[0].nodes[0].kfd_node
            node = run.host_root / "sys/class/kfd/kfd/topology/nodes" / str(kfd_node)
            started = time.monotonic()
            node.rename(node.with_name("gone"))
            assert kubelet.wait_for(lambda: kubelet.allocatable("amd.com/gpu") == 7, 5)
            print(f"[mi210-x8] KFD node removed -> Unhealthy seen: {(time.monotonic() - started) * 1000:.1f} ms  "
                  f"(budget 1 s)")
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--health", type=int, default=20)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds idle before reading RSS and CPU")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    for i, profile in enumerate(RSS_PROFILES):
        bench_process(profile, args.calls if i == 0 else 200, args.restarts if i == 0 else 3,
                      args.idle if i == 0 else 2.0)
    bench_sharing(args.calls)
    bench_health(args.health)


if __name__ == "__main__":
    main()
