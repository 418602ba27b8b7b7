"""End to end: ``gpu-labeller nodes`` and ``match --kubeconfig`` on a real kube-apiserver v1.24.
Prints every check and figure; exits 1 if a check failed. Not a test (pytest does not collect
e2e_*.py): run it by hand.

    python tests/e2e/e2e_selectors.py [--k8s DIR] [--nodes 50] [--keep]

Uses K8S_STATE and the K8S_*_PORT variables of the k8s folder's up.sh. It starts etcd and the API
server, creates Nodes labelled as built-in profiles with the capacity their plugin would post, and
pods bound to them (Pending, Running, Succeeded, Failed: phases set through the status
subresource) and unbound; then checks that the real server takes the Pod field selector ``nodes``
sends, that in-use counts only bound, unfinished pods, that ``match`` on live Nodes finds the same
nodes as on the profiles, and that the selector snippets select their node on the real server too
(``kubectl get nodes -l``). Stops the cluster with ``down.sh --wipe`` unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.e2e_config_switch import Cluster  # noqa: E402
from tests.e2e.e2e_ownership import add_k8s_argument, check, figure, results  # noqa: E402

PROFILES = {"dgx-h100": {"nvidia.com/gpu": "8"},
            "dgx-h100-4of8-shared": {"nvidia.com/gpu": "4", "nvidia.com/gpu.shared": "16"},
            "mi300x-x8-spx": {"amd.com/gpu": "8"}, "t4-time-slicing": {"nvidia.com/gpu": "4"}}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labeller.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          check=False, timeout=120)


def labels_of(profile: str) -> dict[str, str]:
    labels: dict[str, str] = json.loads(cli("labels", "--simulate", profile, "--format", "json").stdout)
    return labels


def node(cluster: Cluster, name: str, labels: dict[str, str], capacity: dict[str, str]) -> None:
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}))
    status = {"capacity": {"cpu": "8", "pods": "110", **capacity},
              "allocatable": {"cpu": "8", "pods": "110", **capacity}}
    cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))


def pod(cluster: Cluster, name: str, node_name: str | None, resource: str, amount: str, phase: str | None) -> None:
    spec: dict[str, object] = {"containers": [{"name": "c", "image": "busybox",
                                               "resources": {"limits": {resource: amount}}}]}
    if node_name:
        spec["nodeName"] = node_name
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
    if phase:
        cluster.kubectl("patch", "pod", name, "--subresource=status", "--type=merge", "-p",
                        json.dumps({"status": {"phase": phase}}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_k8s_argument(parser)
    parser.add_argument("--nodes", type=int, default=50, help="GPU nodes (the profiles in turn)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    state = Path(os.environ.get("K8S_STATE") or tempfile.mkdtemp(prefix="gpu-labeller-e2e-"))  # no stray empty dir
    cluster = Cluster(args.k8s, state)
    print(f"starting the API server (K8S_STATE={state})", flush=True)
    cluster.up()
    try:
        labels = {p: labels_of(p) for p in PROFILES}
        names = list(PROFILES)
        began = time.monotonic()
        for i in range(args.nodes):
            profile = names[i % len(names)]
            node(cluster, f"gpu-{i:03d}", labels[profile], PROFILES[profile])
        node(cluster, "cpu-000", {"kubernetes.io/os": "linux"}, {})
        figure(f"{args.nodes} GPU nodes and 1 CPU node created in {time.monotonic() - began:.1f} s")
        pod(cluster, "running", "gpu-000", "nvidia.com/gpu", "2", "Running")
        pod(cluster, "pending", "gpu-000", "nvidia.com/gpu", "1", None)
        pod(cluster, "done", "gpu-000", "nvidia.com/gpu", "4", "Succeeded")
        pod(cluster, "failed", "gpu-002", "amd.com/gpu", "8", "Failed")
        pod(cluster, "amd", "gpu-002", "amd.com/gpu", "3", "Running")
        pod(cluster, "unbound", None, "nvidia.com/gpu", "8", None)

        result = cli("nodes", "--kubeconfig", str(cluster.admin), "--format", "json")
        check(result.returncode == 0, f"nodes --format json exits 0 ({result.stderr.strip()[:200]})")
        rows = {r["name"]: r for r in json.loads(result.stdout or "[]")}
        check(len(rows) == args.nodes and "cpu-000" not in rows, f"one row per GPU node ({len(rows)} rows)")
        used = {r["name"]: r["used"] for r in rows.get("gpu-000", {}).get("resources", [])}
        check(used == {"nvidia.com/gpu": 3},
              f"gpu-000 in use = Running 2 + Pending 1, Succeeded and unbound not counted: {used}")
        amd = {r["name"]: (r["capacity"], r["used"]) for r in rows.get("gpu-002", {}).get("resources", [])}
        check(amd == {"amd.com/gpu": (8, 3)}, f"gpu-002 amd.com/gpu capacity 8, in use 3 (Failed not counted): {amd}")
        check(all(r["labeller"] == "ready" and r["plugin"] == "ready" for r in rows.values()), "every node ready")
        timings = []
        for _ in range(5):
            began = time.monotonic()
            cli("nodes", "--kubeconfig", str(cluster.admin))
            timings.append(time.monotonic() - began)
        figure(f"nodes on {args.nodes} GPU nodes (real v1.24 API server): median {sorted(timings)[2]:.2f} s "
               "over 5 cold runs")

        live = cli("match", "nvidia.com/gpu.product=NVIDIA-H100-80GB", "--kubeconfig", str(cluster.admin))
        check(live.returncode == 1 and "closest existing value: NVIDIA-H100-80GB-HBM3" in live.stdout,
              "match on live Nodes: nothing matches NVIDIA-H100-80GB, the closest value is named")
        found = cli("match", "nvidia.com/gpu.present,nvidia.com/gpu.memory>40000", "--kubeconfig", str(cluster.admin))
        matched = [line.split()[1] for line in found.stdout.splitlines() if line.startswith("match")]
        kubectl = cluster.kubectl("get", "nodes", "-l", "nvidia.com/gpu.present,nvidia.com/gpu.memory>40000",
                                  "-o", "jsonpath={.items[*].metadata.name}").split()
        check(found.returncode == 0 and sorted(matched) == sorted(kubectl) and matched,
              f"match agrees with kubectl get nodes -l on the real server ({len(matched)} nodes)")
        for profile in PROFILES:
            wanted = yaml.safe_load(cli("labels", "--simulate", profile, "--format", "selector").stdout)["nodeSelector"]
            selector = ",".join(f"{k}={v}" for k, v in wanted.items())
            selected = cluster.kubectl("get", "nodes", "-l", selector, "-o",
                                       "jsonpath={.items[*].metadata.name}").split()
            expected = [f"gpu-{i:03d}" for i in range(args.nodes)
                        if labels[names[i % len(names)]].items() >= wanted.items()]
            check(sorted(selected) == sorted(expected) and f"gpu-{names.index(profile):03d}" in selected,
                  f"{profile}: its nodeSelector snippet selects the same {len(selected)} nodes on the real server")
    finally:
        if not args.keep:
            cluster.down()
    failed = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed)} checks passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
