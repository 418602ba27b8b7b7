"""End to end: per-node named configs on a real kube-apiserver v1.24 and the real kubelet device
manager (dpkubelet in node mode). Prints every check and figure; exits 1 if a check failed. Not a
test (pytest does not collect e2e_*.py): run it by hand.

    python tests/e2e/e2e_config_switch.py [--k8s DIR] [--switches 10] [--keep]

Uses K8S_STATE and the K8S_*_PORT variables of the k8s folder's up.sh. It
1. starts etcd and the API server (up.sh), and dpkubelet in node mode for one Node;
2. applies the chart's RBAC for two named configs (ServiceAccounts gpu-labeller and
   gpu-labeller-device-plugin, their ClusterRoles and bindings, rendered from deploy/helm) and runs
   `gpu-labeller run` and `gpu-labeller device-plugin` with those ServiceAccounts' tokens, on a
   simulated dgx-h100 with a config directory laid out as a ConfigMap volume;
3. switches the label nvidia.com/device-plugin.config back and forth (the merge patch `kubectl label`
   sends, field manager kubectl-label) and measures
   label change -> the labeller's labels on the Node, and -> the Node's `status.allocatable` that
   dpkubelet posts from what the plugin serves; a pod running on the Node stays Running;
4. sets an unknown name (a Warning Event on the Node, state label failed, nothing else changes),
   removes the label (the default), edits the ConfigMap files, and checks what the plugin's
   ServiceAccount may and may not do;
then stops everything and the cluster with `down.sh --wipe` (unless --keep).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.cluster.kube import Kube  # noqa: E402
from labeller.model.namedconfigs import APPLIED_LABEL, CONFIG_LABEL, STATE_LABEL  # noqa: E402
from tests.builders import config_map_volume  # noqa: E402
from tests.deploy import render  # noqa: E402
from tests.e2e.e2e_ownership import add_k8s_argument, check, results, wait  # noqa: E402
from tests.plugin.profile_files import time_slicing  # noqa: E402

NODE = "e2e-config-node"
NAMESPACE = "gpu-labeller"
PROFILE = "dgx-h100"  # 8 GPUs
GPU, SHARED = "nvidia.com/gpu", "nvidia.com/gpu.shared"
WHOLE = {"version": "v1"}


CONFIGS = {"default": WHOLE, "ts4": time_slicing(4), "ts2-renamed": time_slicing(2, rename=True)}
# label value -> (nvidia.com/gpu.replicas label, the resource and its allocatable on the Node)
EXPECTED: dict[str | None, tuple[str, str, str]] = {None: ("1", GPU, "8"), "ts4": ("4", GPU, "32"),
                                                    "ts2-renamed": ("2", SHARED, "16")}

def ms(values: list[float]) -> str:
    ordered = sorted(v * 1000 for v in values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"median {statistics.median(ordered):.0f} ms, p95 {p95:.0f} ms, max {ordered[-1]:.0f} ms"


class Cluster:
    def __init__(self, k8s: Path, state: Path) -> None:
        self.k8s, self.state = k8s, state
        self.env = {**os.environ, "K8S_STATE": str(state), "PATH": f"{k8s / 'bin'}:{os.environ['PATH']}"}
        self.admin = state / "kubeconfig"

    def up(self) -> None:
        subprocess.run([str(self.k8s / "up.sh")], env=self.env, check=True, stdout=subprocess.DEVNULL)

    def down(self) -> None:
        subprocess.run([str(self.k8s / "down.sh"), "--wipe"], env=self.env, check=False, stdout=subprocess.DEVNULL)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, user: str | None = None) -> str:
        command = [str(self.k8s / "bin" / "kubectl"), "--kubeconfig", str(self.admin), *args]
        if user:
            command += ["--as", user]
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, env=self.env, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout.strip()

    def kubeconfig_for(self, account: str, path: Path) -> Path:
        token = self.kubectl("-n", NAMESPACE, "create", "token", account, "--duration", "2h")
        server = self.kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
        ca = self.kubectl("config", "view", "--raw", "--minify", "-o",
                          "jsonpath={.clusters[0].cluster.certificate-authority-data}")
        cluster: dict[str, Any] = {"server": server}
        if ca:
            cluster["certificate-authority-data"] = ca
        else:
            cluster["insecure-skip-tls-verify"] = True
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": account,
            "clusters": [{"name": "e2e", "cluster": cluster}], "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": account, "context": {"cluster": "e2e", "user": account}}]}))
        return path


def set_label(kube: Kube, value: str | None) -> None:
    """What `kubectl label node --overwrite` sends (a merge patch, field manager kubectl-label), timed from here."""
    body = {"metadata": {"labels": {CONFIG_LABEL: value}}}
    kube._request("patch", "nodes", "PATCH", f"/api/v1/nodes/{NODE}", {"fieldManager": "kubectl-label"}, body,
                  "application/merge-patch+json")


def rbac(cluster: Cluster) -> None:
    """The chart's ServiceAccounts, ClusterRoles and bindings for two named configs (the label is followed)."""
    objects = render({"config": {"data": CONFIGS}})
    wanted = [o for o in objects if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": wanted}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_k8s_argument(parser)
    parser.add_argument("--switches", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    state = Path(os.environ.get("K8S_STATE", "/tmp/gpu-labeller-k8s"))
    cluster = Cluster(args.k8s, state)
    work = Path(tempfile.mkdtemp(prefix="e2e-cfg-"))
    processes: list[subprocess.Popen[str]] = []
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    try:
        cluster.up()
        rbac(cluster)
        admin = Kube(str(cluster.admin))
        sockets = work / "sockets"
        dpk_log = (work / "dpkubelet.jsonl").open("w")
        processes.append(subprocess.Popen(
            [str(args.k8s / "bin" / "dpkubelet"), "--socket-dir", str(sockets), "--node-name", NODE, "--kubeconfig",
             str(cluster.admin), "--duration", "0"], stdout=dpk_log, stderr=(work / "dpkubelet.klog").open("w"),
            text=True))
        check(wait(lambda: "kubelet_started" in (work / "dpkubelet.jsonl").read_text(), 30) is not None,
              "dpkubelet started in node mode")
        wait(lambda: admin.get_node(NODE), 30)
        configs = config_map_volume(work / "configs", CONFIGS)
        common = ["--simulate", PROFILE, "--config-dir", str(configs), "--node-name", NODE, "--metrics-port", "0"]
        labeller_config = cluster.kubeconfig_for("gpu-labeller", work / "kubeconfig-labeller")
        plugin_config = cluster.kubeconfig_for("gpu-labeller-device-plugin", work / "kubeconfig-plugin")
        cli = [sys.executable, "-m", "labeller.cli", "--log-format", "json"]
        processes.append(subprocess.Popen(
            [*cli, "run", *common, "--kubeconfig", str(labeller_config), "--interval", "3600", "--start-jitter", "0",
             "--events"], stderr=(work / "labeller.base.log").open("w"), text=True, cwd=ROOT))
        processes.append(subprocess.Popen(
            [*cli, "device-plugin", *common, "--kubeconfig", str(plugin_config), "--socket-dir", str(sockets),
             "--metrics-bind", "127.0.0.1"], stderr=(work / "plugin.log").open("w"), text=True, cwd=ROOT,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR"}))

        def labels() -> dict[str, str]:
            return dict(admin.get_node(NODE)["metadata"].get("labels") or {})

        def allocatable(resource: str) -> str | None:
            value = (admin.get_node(NODE).get("status") or {}).get("allocatable", {}).get(resource)
            return None if value is None else str(value)

        def settled(value: str | None) -> tuple[Callable[[], bool], Callable[[], bool]]:
            replicas, resource, count = EXPECTED[value]
            return (lambda: labels().get("nvidia.com/gpu.replicas") == replicas and
                    labels().get(APPLIED_LABEL) == (value or "default"),
                    lambda: allocatable(resource) == count)

        on_labels, on_capacity = settled(None)
        check(wait(on_labels, 60) is not None and wait(on_capacity, 60) is not None,
              "both started: the default config's labels and nvidia.com/gpu=8 allocatable on the Node")
        cluster.kubectl("create", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-pod", "namespace": "default"},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox",
                                                       "resources": {"limits": {GPU: 1}}}]}}))
        check(wait(lambda: cluster.kubectl("get", "pod", "gpu-pod", "-o", "jsonpath={.status.phase}") == "Running",
                   30) is not None, "a pod holding one nvidia.com/gpu runs on the Node")

        to_labels: dict[str, list[float]] = {"same name": [], "renamed": []}
        to_capacity: dict[str, list[float]] = {"same name": [], "renamed": []}
        sequence = [("ts4", "same name"), (None, "same name"), ("ts2-renamed", "renamed"), (None, "renamed")]
        failed = 0
        for i in range(args.switches):
            value, kind = sequence[i % len(sequence)]
            replicas, resource, count = EXPECTED[value]
            started = time.monotonic()
            set_label(admin, value)
            seen: dict[str, float] = {}
            while len(seen) < 2 and time.monotonic() - started < 10:  # one GET shows both: labels and status
                node = admin.get_node(NODE)
                now = time.monotonic()
                replicas_now = node["metadata"].get("labels", {}).get("nvidia.com/gpu.replicas")
                if "labels" not in seen and replicas_now == replicas:
                    seen["labels"] = now
                if "capacity" not in seen and str(node["status"].get("allocatable", {}).get(resource)) == count:
                    seen["capacity"] = now
                time.sleep(0.005)
            if len(seen) < 2:
                failed += 1
                continue
            to_labels[kind].append(seen["labels"] - started)
            to_capacity[kind].append(seen["capacity"] - started)
        check(failed == 0, f"{args.switches} label switches, each followed by labels and capacity within 10 s")
        for kind in ("same name", "renamed"):
            if to_labels[kind]:
                print(f"  figure: kubectl label -> new labels on the Node ({kind}, {len(to_labels[kind])}): "
                      f"{ms(to_labels[kind])}  (budget 5 s)")
                print(f"  figure: kubectl label -> Node status.allocatable ({kind}, {len(to_capacity[kind])}): "
                      f"{ms(to_capacity[kind])}  (budget 5 s)")
        check(cluster.kubectl("get", "pod", "gpu-pod", "-o", "jsonpath={.status.phase}") == "Running",
              "the pod kept running through every switch")

        cluster.kubectl("label", "node", NODE, f"{CONFIG_LABEL}=ts4", "--overwrite")
        wait(settled("ts4")[0], 10)
        wait(settled("ts4")[1], 10)
        cluster.kubectl("label", "node", NODE, f"{CONFIG_LABEL}=ts-typo", "--overwrite")
        wait(lambda: labels().get(STATE_LABEL) == "failed", 10)
        time.sleep(1)  # nothing to await: what is served must not change
        now = (labels().get(STATE_LABEL), labels().get(APPLIED_LABEL), labels().get("nvidia.com/gpu.replicas"),
               allocatable(GPU))
        check(now == ("failed", "ts4", "4", "32"),
              f"an unknown name: (config.state, config.applied, gpu.replicas, allocatable) = {now}, "
              "expected (failed, ts4, 4, 32)")
        events = json.loads(cluster.kubectl("get", "events", "-n", "default", "-o", "json",
                                            "--field-selector", f"involvedObject.name={NODE}"))["items"]
        warning = [e for e in events if e["reason"] == "GPUConfigFailed"]
        check(len(warning) == 1 and "ts-typo" in warning[0]["message"] and warning[0]["type"] == "Warning",
              f"one Warning Event on the Node: {warning[0]['message'] if warning else None!r}")
        cluster.kubectl("label", "node", NODE, f"{CONFIG_LABEL}-")
        check(wait(settled(None)[0], 10) is not None and wait(settled(None)[1], 10) is not None,
              "the label removed: the default config, nvidia.com/gpu=8")

        started = time.monotonic()
        config_map_volume(configs, {**CONFIGS, "default": time_slicing(3)})
        took_labels = wait(lambda: labels().get("nvidia.com/gpu.replicas") == "3", 10, step=0.005)
        took_capacity = wait(lambda: allocatable(GPU) == "24", 10, step=0.005)
        check(took_labels is not None and took_capacity is not None,
              f"a ConfigMap edit (..data swap) is followed: labels after {took_labels and round(took_labels, 2)} s, "
              f"allocatable 24 {round(time.monotonic() - started, 2)} s after the edit (1 s poll)")

        account = f"system:serviceaccount:{NAMESPACE}:gpu-labeller-device-plugin"
        can = {verb: cluster.kubectl("auth", "can-i", verb, "nodes", user=account, check=False)
               for verb in ("get", "list", "watch", "patch", "update", "delete")}
        check(can == {"get": "yes", "list": "yes", "watch": "yes", "patch": "no", "update": "no", "delete": "no"},
              f"the plugin's ServiceAccount may only read Nodes: {can}")
        check(cluster.kubectl("auth", "can-i", "get", "secrets", "-A", user=account, check=False) == "no",
              "and nothing else (secrets: no)")
        for process, name in ((processes[1], "labeller"), (processes[2], "device-plugin")):
            check(process.poll() is None, f"the {name} process ran all along (no restart)")
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
        if not args.keep:
            cluster.down()
        print(f"logs: {work}")
    failures = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failures)} passed, {len(failures)} failed")
    if not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
