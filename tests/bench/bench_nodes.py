"""Benchmark: ``gpu-labeller nodes`` on a large fleet against the fake API server. Prints figures; not a test.

Fills one ``FakeApiServer`` with N GPU nodes (labels of built-in profiles, capacity and allocatable
of their GPU resources), M CPU nodes and P pods per GPU node (a mix of running, pending and
finished), then runs the real command as a process (cold start, as a user runs it) and reports
its wall time, peak RSS, and the API requests it made: one list of Nodes and one of Pods, each
fetched in pages of 500 (limit/continue), as kubectl does.

    python tests/bench/bench_nodes.py [--nodes 1000] [--cpu-nodes 200] [--pods-per-node 4] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fakes.apiserver import FakeApiServer  # noqa: E402

WALL_BUDGET_S = 2.0  # a cold process on the 2-core machine, 1,000 GPU nodes
PROFILES = {"dgx-h100": {"nvidia.com/gpu": "8"},
            "dgx-h100-4of8-shared": {"nvidia.com/gpu": "4", "nvidia.com/gpu.shared": "16"},
            "mi300x-x8-spx": {"amd.com/gpu": "8"}, "t4-time-slicing": {"nvidia.com/gpu": "4"}}
PHASES = ("Running", "Running", "Pending", "Succeeded")


def profile_labels(profile: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "labeller.cli", "labels", "--simulate", profile, "--format", "json"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    labels: dict[str, str] = json.loads(out.stdout)
    return labels


def fill(api: FakeApiServer, gpu_nodes: int, cpu_nodes: int, pods_per_node: int) -> None:
    labels = {profile: profile_labels(profile) for profile in PROFILES}
    profiles = list(PROFILES)
    for i in range(gpu_nodes):
        profile = profiles[i % len(profiles)]
        name = f"gpu-{i:04d}"
        api.create_node(name, labels[profile])
        api.set_node_status(name, {"cpu": "96", **PROFILES[profile]})
        resource = next(iter(PROFILES[profile]))
        for j in range(pods_per_node):
            api.create_pod(f"job-{i:04d}-{j}", node=name, containers={"main": {resource: "1"}}, phase=PHASES[j % 4])
    for i in range(cpu_nodes):
        api.create_node(f"cpu-{i:04d}", {"kubernetes.io/os": "linux"})
        api.set_node_status(f"cpu-{i:04d}", {"cpu": "32"})


def one_run(kubeconfig: Path) -> tuple[float, float, int]:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "labeller.cli", "nodes", "--kubeconfig", str(kubeconfig),
                             "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    stdout = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"nodes failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_maxrss / 1024, len(json.loads(stdout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--cpu-nodes", type=int, default=200)
    parser.add_argument("--pods-per-node", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with FakeApiServer() as api, tempfile.TemporaryDirectory() as tmp:
        fill(api, args.nodes, args.cpu_nodes, args.pods_per_node)
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        runs = []
        for _ in range(args.runs):
            before = len(api.log.requests)
            wall, rss, rows = one_run(kubeconfig)
            requests = Counter(f"{r.verb} {r.resource}" for r in api.log.requests[before:])
            runs.append((wall, rss, rows, requests))
    walls = [w for w, _, _, _ in runs]
    median = statistics.median(walls)
    print(f"gpu-labeller nodes: {args.nodes} GPU nodes + {args.cpu_nodes} CPU nodes, "
          f"{args.nodes * args.pods_per_node} pods ({args.pods_per_node} per GPU node), {args.runs} cold runs")
    print(f"rows printed: {runs[0][2]}")
    print(f"wall: median {median:.3f} s, min {min(walls):.3f} s, max {max(walls):.3f} s")
    print(f"peak RSS: {max(r for _, r, _, _ in runs):.1f} MiB")
    print(f"requests per run: {dict(runs[0][3])} (pages of 500)")
    verdict = "ok" if median <= WALL_BUDGET_S and runs[0][2] == args.nodes else "OVER BUDGET"
    print(f"budget: median <= {WALL_BUDGET_S} s, one row per GPU node: {verdict}")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
