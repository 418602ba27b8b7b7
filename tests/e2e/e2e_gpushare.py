"""End to end: memory sharing scheduled by the real kube-scheduler v1.24 through ``gpu-labeller
scheduler-extender``, on a real kube-apiserver, with ``gpu-labeller device-plugin`` on two nodes run by
dpkubelet (the real kubelet device manager, node mode). Prints every check and figure; exits 1 if a
check failed. Not a test (pytest does not collect e2e_*.py): run it by hand.

    K8S_STATE=/tmp/k8s-x K8S_API_PORT=... K8S_ETCD_PORT=... K8S_ETCD_PEER_PORT=... K8S_SCHED_PORT=... \\
        python tests/e2e/e2e_gpushare.py [--k8s DIR] [--port 39999] [--keep]

1. up.sh, the chart's RBAC (plugin with a memory-sharing named config, and the extender), two Nodes
   with dpkubelet and the plugin (4 x T4, 14 GiB each: aliyun.com/gpu-mem 56, gpu-count 4), the
   extender with its own ServiceAccount's token, and the scheduler configured as docs/memory-sharing.md says.
2. One pod on idle nodes: creation -> bound -> Running.
3. A burst of pods created at once: every one Running, no GPU holds more than 14 GiB, each
   container got the GPU the extender chose (dpkubelet's ``allocate`` events), figures.
4. A pod larger than one GPU stays Pending with the extender's reason in its FailedScheduling event;
   a pod without gpu-mem is scheduled without the extender.
5. Deleting pods frees their memory: a whole-GPU pod then fits. The extender restarts mid-way and
   rebuilds its view from the API server (no overcommit after it).
6. ``gpu-labeller inspect`` prints the cluster.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.model import gpushare  # noqa: E402
from labeller.cluster.kube import Kube  # noqa: E402
from tests.builders import config_map_volume  # noqa: E402
from tests.deploy import render  # noqa: E402
from tests.e2e.e2e_config_switch import NAMESPACE, Cluster, ms  # noqa: E402
from tests.e2e.e2e_memory_sharing import (CONFIGS, PROFILE, SCHEDULER_CONFIG, UNITS, allocations,  # noqa: E402
                                          envs_of, uuids)
from tests.e2e.e2e_ownership import add_k8s_argument, check, figure, verdict, wait  # noqa: E402
from tests.e2e.e2e_sharing import stop  # noqa: E402

NODES = ("e2e-gpushare-a", "e2e-gpushare-b")
EXTENDER_ACCOUNT = "gpu-labeller-scheduler-extender"


def pod_body(name: str, containers: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": c, "image": "cuda", "resources": {"limits": limits}}
                                    for c, limits in containers.items()]}}


class Run:
    """The processes of the run and the admin client."""

    def __init__(self, args: argparse.Namespace, cluster: Cluster, work: Path) -> None:
        self.args, self.cluster, self.work = args, cluster, work
        self.processes: list[subprocess.Popen[str]] = []
        self.extender: subprocess.Popen[str] | None = None
        self.admin = Kube(str(cluster.admin))

    def node(self, name: str, configs: Path, plugin_config: Path) -> Path:
        """dpkubelet in node mode for ``name`` and the plugin on its socket directory; its JSON log."""
        sockets, log = self.work / f"sockets-{name}", self.work / f"dpkubelet-{name}.jsonl"
        self.processes.append(subprocess.Popen(
            [str(self.args.k8s / "bin" / "dpkubelet"), "--socket-dir", str(sockets), "--node-name", name,
             "--kubeconfig", str(self.cluster.admin), "--duration", "0"], stdout=log.open("w"),
            stderr=(self.work / f"dpkubelet-{name}.klog").open("w"), text=True))
        wait(lambda: "kubelet_started" in log.read_text(), 30)
        self.processes.append(subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "device-plugin", "--simulate", PROFILE,
             "--config-dir", str(configs), "--config-label", "", "--node-name", name, "--kubeconfig",
             str(plugin_config), "--socket-dir", str(sockets), "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
            stderr=(self.work / f"plugin-{name}.log").open("w"), text=True, cwd=ROOT,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR"}))
        return log

    def start_extender(self, kubeconfig: Path) -> float | None:
        """Start the extender; seconds until /readyz answers 200."""
        self.extender = subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "scheduler-extender", "--port",
             str(self.args.port), "--bind", "127.0.0.1", "--kubeconfig", str(kubeconfig)],
            stderr=(self.work / "extender.log").open("a"), text=True, cwd=ROOT)
        self.processes.append(self.extender)

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.args.port}/readyz", timeout=1) as answer:
                    return answer.status == 200
            except OSError:
                return False
        return wait(ready, 30)

    def pod(self, name: str) -> dict[str, Any]:
        return self.admin.get_pod("default", name)

    def phase(self, name: str) -> str:
        return str(self.pod(name).get("status", {}).get("phase"))

    def create(self, body: dict[str, Any]) -> float:
        self.cluster.kubectl("create", "-f", "-", stdin=json.dumps(body))
        return time.monotonic()

    def placed(self) -> dict[tuple[str, int], int]:
        """(node, GPU) -> gpu-mem of the unfinished pods the API server shows there."""
        used: dict[tuple[str, int], int] = collections.Counter()
        for pod in self.admin.list_pods()[0]:
            gpu = gpushare.assigned_gpu(pod)
            if pod["spec"].get("nodeName") and gpu is not None and not gpushare.is_finished(pod):
                used[(pod["spec"]["nodeName"], gpu)] += gpushare.pod_request(pod)
        return dict(used)


def timed(run: Run, names: list[str], created: dict[str, float],
          timeout: float = 60) -> tuple[list[float], list[float]]:
    """Seconds from creation to bound and to Running for each pod (polled every 10 ms)."""
    bound: dict[str, float] = {}
    running: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(running) < len(names):
        for pod in run.admin.list_pods(field_selector="metadata.namespace=default")[0]:
            name = pod["metadata"]["name"]
            if name not in created:
                continue
            if pod["spec"].get("nodeName") and name not in bound:
                bound[name] = time.monotonic() - created[name]
            if pod.get("status", {}).get("phase") == "Running" and name not in running:
                running[name] = time.monotonic() - created[name]
        time.sleep(0.01)
    return [bound[n] for n in names if n in bound], [running[n] for n in names if n in running]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_k8s_argument(parser)
    parser.add_argument("--port", type=int, default=int(os.environ.get("K8S_SCHED_PORT", "10259")) + 3,
                        help="the extender's port (default: K8S_SCHED_PORT + 3)")
    parser.add_argument("--burst", type=int, default=12, help="pods of 7 GiB created at once (16 fit)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    cluster = Cluster(args.k8s, Path(os.environ.get("K8S_STATE", "/tmp/gpu-labeller-k8s")))
    work = Path(tempfile.mkdtemp(prefix="e2e-gpushare-"))
    gpus = uuids()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    run: Run | None = None
    try:
        cluster.up()
        wanted = [o for o in render({"config": {"data": CONFIGS}, "extender": {"enabled": True}})
                  if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
        cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": wanted}))
        run = Run(args, cluster, work)
        configs = config_map_volume(work / "configs", CONFIGS)
        plugin_config = cluster.kubeconfig_for("gpu-labeller-device-plugin", work / "kubeconfig-plugin")
        logs = {name: run.node(name, configs, plugin_config) for name in NODES}
        admin = run.admin

        def shares(name: str) -> bool:
            allocatable = (admin.get_node(name).get("status") or {}).get("allocatable") or {}
            return bool(allocatable.get(gpushare.RESOURCE_MEM) == str(4 * UNITS))
        check(wait(lambda: all(shares(n) for n in NODES), 60) is not None,
              f"both Nodes show {gpushare.RESOURCE_MEM}={4 * UNITS} (4 x {UNITS} GiB) allocatable")

        extender_config = cluster.kubeconfig_for(EXTENDER_ACCOUNT, work / "kubeconfig-extender")
        ready = run.start_extender(extender_config)
        check(ready is not None,
              f"the extender is ready with its ServiceAccount's token (chart RBAC) in {ready or 0:.2f} s")
        config = work / "scheduler.yaml"
        config.write_text(SCHEDULER_CONFIG.format(port=args.port))
        subprocess.run([str(args.k8s / "scheduler-up.sh"), "--config", str(config)], env=cluster.env, check=True,
                       stdout=subprocess.DEVNULL)

        # 2. One pod on idle nodes.
        created = {"first": run.create(pod_body("first", {"main": {gpushare.RESOURCE_MEM: "7", "cpu": "100m"}}))}
        bound, running = timed(run, ["first"], created)
        check(len(running) == 1, "a 7 GiB pod is scheduled by the real scheduler through the extender and Running")
        if running:
            figure(f"one pod on idle nodes: created -> bound {bound[0] * 1000:.0f} ms, "
                   f"-> Running {running[0] * 1000:.0f} ms")

        # 3. A burst.
        names = [f"burst-{i:02}" for i in range(args.burst)]
        created = {}
        for name in names:
            created[name] = run.create(pod_body(name, {"main": {gpushare.RESOURCE_MEM: "7"}}))
        bound, running = timed(run, names, created, timeout=120)
        check(len(running) == len(names), f"all {len(names)} pods of a burst of 7 GiB pods are Running "
                                          f"({len(running)} Running)")
        if running:
            figure(f"burst of {len(names)}: created -> bound {ms(bound)}; created -> Running {ms(running)}")
        used = run.placed()
        check(max(used.values()) <= UNITS and sum(used.values()) == 7 * (len(names) + 1),
              f"no GPU holds more than {UNITS} GiB: {sorted(used.items())}")
        events = [e for log in logs.values() for e in allocations(log) if not e.get("error")]
        mismatched = []
        for name in ["first", *names]:
            pod = run.pod(name)
            got = next((envs_of(e) for e in events if e.get("name") == name), {})
            if got.get("NVIDIA_VISIBLE_DEVICES") != gpus[gpushare.assigned_gpu(pod) or 0] or \
                    pod["metadata"]["annotations"].get(gpushare.ANN_ASSIGNED) != "true":
                mismatched.append(name)
        check(not mismatched, f"every container got the GPU the extender chose (its UUID), every pod assigned; "
                              f"mismatched: {mismatched}")

        # 4. Too large for one GPU; no gpu-mem at all.
        run.create(pod_body("too-big", {"main": {gpushare.RESOURCE_MEM: str(UNITS + 1)}}))

        def reason() -> str:
            text = cluster.kubectl("get", "events", "--field-selector",
                                   "involvedObject.name=too-big,reason=FailedScheduling",
                                   "-o", "jsonpath={.items[*].message}")
            return text
        wait(lambda: "single GPU" in reason(), 30)
        check("must fit on a single GPU" in reason() and run.phase("too-big") == "Pending",
              f"a {UNITS + 1} GiB pod stays Pending: {reason()[:200]!r}")
        started = run.create(pod_body("plain", {"main": {"cpu": "100m"}}))
        took = wait(lambda: run.phase("plain") == "Running", 30)
        check(took is not None, "a pod without gpu-mem is scheduled without the extender and Running")
        if took is not None:
            figure(f"pod without gpu-mem: created -> Running {(time.monotonic() - started) * 1000:.0f} ms")

        # 5. Deletions free memory; the extender restarts.
        run.cluster.kubectl("delete", "pod", "too-big", "--wait=false")
        stop(run.extender) if run.extender else None
        full = sorted(key for key, value in run.placed().items() if value == UNITS)
        node, gpu = full[0]
        holders = [p["metadata"]["name"] for p in admin.list_pods(field_selector=f"spec.nodeName={node}")[0]
                   if gpushare.assigned_gpu(p) == gpu]
        for name in holders:
            cluster.kubectl("delete", "pod", name, "--wait=false")
        wait(lambda: not any(p["metadata"]["name"] in holders for p in admin.list_pods()[0]), 30)
        ready = run.start_extender(extender_config)
        check(ready is not None,
              f"the extender restarted and rebuilt its view from the API server in {ready or 0:.2f} s")
        free_now = 8 * UNITS - sum(run.placed().values())
        created = {"whole": run.create(pod_body("whole", {"main": {gpushare.RESOURCE_MEM: str(UNITS)}}))}
        _, running = timed(run, ["whole"], created)
        check(len(running) == 1 and (run.pod("whole")["spec"]["nodeName"], gpushare.assigned_gpu(run.pod("whole")))
              == (node, gpu), f"after deleting {holders} on {node} GPU {gpu}, a {UNITS} GiB pod takes that GPU "
                              f"({free_now} GiB free in all)")
        used = run.placed()
        check(max(used.values()) <= UNITS, "still no GPU over its memory after the restart")

        # 6. inspect
        inspect = subprocess.run([sys.executable, "-m", "labeller.cli", "inspect", "--kubeconfig", str(cluster.admin)],
                                 capture_output=True, text=True, cwd=ROOT, check=False)
        print(inspect.stdout)
        check(inspect.returncode == 0 and f"{NODES[0]}  0" in inspect.stdout, "gpu-labeller inspect prints every GPU")
    finally:
        if run is not None:
            stop(*reversed(run.processes))
        subprocess.run([str(args.k8s / "scheduler-down.sh")], env=cluster.env, check=False, stdout=subprocess.DEVNULL)
        if not args.keep:
            cluster.down()
        print(f"logs in {work}")
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
