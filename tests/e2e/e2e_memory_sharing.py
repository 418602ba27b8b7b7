"""End to end: memory sharing (gpushare's aliyun.com/gpu-mem) on a real kube-apiserver v1.24 and the real
kubelet device manager (dpkubelet in node mode). Prints every check and figure; exits 1 if a check
failed. Not a test (pytest does not collect e2e_*.py): run it by hand.

    python tests/e2e/e2e_memory_sharing.py [--k8s DIR] [--keep]

Uses K8S_STATE and the K8S_*_PORT variables of the k8s folder's up.sh. It
1. starts etcd and the API server (up.sh), and dpkubelet in node mode for one Node;
2. applies the chart's RBAC for a named config with `sharing: {memory: {unit: GiB}}` and runs
   `gpu-labeller device-plugin` with its ServiceAccount's token on a simulated 4 x T4 node;
3. creates pods bound to the Node carrying the annotations the scheduler extender writes at bind
   (one at a time, as its per-node lock does; equal requests on different GPUs), a pod with two
   gpu-mem containers and a cpu/memory one, and a pod without the extender's annotations; and checks
   what the real device manager got from Allocate (its `allocate` events), the pods' phases and
   ALIYUN_COM_GPU_MEM_ASSIGNED, and what the plugin's ServiceAccount may do;
4. starts the real kube-scheduler with `gpu-labeller scheduler-extender` (port --extender-port) as its
   extender for aliyun.com/gpu-mem and creates --burst pods at once, all asking the same memory: every
   container must get the GPU its pod was bound to, no GPU may hold more than it has, and the time
   until all run is the throughput the extender's per-node lock allows;
then stops everything and the cluster with `scheduler-down.sh` and `down.sh --wipe` (unless --keep).
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.model import gpushare  # noqa: E402
from labeller.cluster.kube import Kube  # noqa: E402
from labeller.host.machine import NodeOptions, open_host  # noqa: E402
from tests.builders import config_map_volume  # noqa: E402
from tests.deploy import render  # noqa: E402
from tests.e2e.e2e_config_switch import NAMESPACE, Cluster, ms  # noqa: E402
from tests.e2e.e2e_ownership import add_k8s_argument, check, figure, results, wait  # noqa: E402
from tests.e2e.e2e_sharing import stop  # noqa: E402

NODE = "e2e-gpushare-node"
PROFILE = "t4-x4-gpushare"  # 4 x T4, 14 GiB each
UNITS = 14
CONFIGS = {"gpushare": {"version": "v1", "sharing": {"memory": {"unit": "GiB"}}}}
PLUGIN_USER = f"system:serviceaccount:{NAMESPACE}:gpu-labeller-device-plugin"


def uuids() -> list[str]:
    with open_host(NodeOptions(simulate=PROFILE)) as node:
        return [p.health_key for p in node.offer(node.probe()).resources[0].physical_devices]


def json_lines(log: Path) -> list[dict[str, Any]]:
    events = []
    for line in log.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def allocations(log: Path) -> list[dict[str, Any]]:
    """The device manager's ``allocate`` events."""
    return [e for e in json_lines(log) if e.get("event") == "allocate"]


def envs_of(event: dict[str, Any]) -> dict[str, str]:
    return {e["Name"]: e["Value"] for e in event.get("envs") or []}


def annotations_of(admin: Kube, name: str) -> dict[str, str]:
    return dict(admin.get_pod("default", name)["metadata"].get("annotations") or {})


def pod_body(name: str, containers: dict[str, dict[str, str]], annotations: dict[str, str] | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
            "spec": {"nodeName": NODE, "containers": [{"name": c, "image": "cuda", "resources": {"limits": limits}}
                                                      for c, limits in containers.items()]}}


# A plain-HTTP KubeSchedulerConfiguration (v1beta3) for the extender on loopback without TLS, with this run's port;
# the chart's mutual-TLS one (docs/memory-sharing.md) is driven by e2e_extender_tls.py.
SCHEDULER_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1beta3
kind: KubeSchedulerConfiguration
extenders:
  - urlPrefix: http://127.0.0.1:{port}/gpushare-scheduler
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: 1
    bindVerb: bind
    enableHTTPS: false
    nodeCacheCapable: true
    ignorable: false
    httpTimeout: 10s
    managedResources:
      - name: aliyun.com/gpu-mem
        ignoredByScheduler: false
"""


def through_the_scheduler(cluster: Cluster, admin: Kube, args: argparse.Namespace, work: Path,
                          processes: list[subprocess.Popen[str]], dpk: Path, gpus: list[str]) -> None:
    """A burst of equal requests through the real scheduler and gpu-labeller's extender."""
    config = work / "scheduler.yaml"
    config.write_text(SCHEDULER_CONFIG.format(port=args.extender_port))
    processes.append(subprocess.Popen(
        [sys.executable, "-m", "labeller.cli", "--log-format", "json", "scheduler-extender", "--port",
         str(args.extender_port), "--bind", "127.0.0.1", "--kubeconfig", str(cluster.admin)],
        stderr=(work / "extender.log").open("w"), text=True, cwd=ROOT))
    subprocess.run([str(args.k8s / "scheduler-up.sh"), "--config", str(config)], env=cluster.env, check=True,
                   stdout=subprocess.DEVNULL)
    earlier = [p["metadata"]["name"] for p in admin.list_pods(field_selector=f"spec.nodeName={NODE}")[0]]
    for name in earlier:  # free every GPU first
        cluster.kubectl("delete", "pod", name, "--wait=false")
    check(wait(lambda: not admin.list_pods(field_selector=f"spec.nodeName={NODE}")[0], 60) is not None,
          f"the {len(earlier)} earlier pods are gone")
    names = [f"burst-{i}" for i in range(args.burst)]
    started = time.monotonic()
    for name in names:
        body = pod_body(name, {"main": {gpushare.RESOURCE_MEM: "4"}}, None)
        del body["spec"]["nodeName"]
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(body))

    def phases() -> list[str]:
        return [str(admin.get_pod("default", n).get("status", {}).get("phase")) for n in names]

    all_running = wait(lambda: phases() == ["Running"] * len(names), 120)
    figure(f"{len(names)} pods of 4 GiB created at once -> all Running through scheduler, extender and plugin: "
           f"{time.monotonic() - started:.2f} s" if all_running is not None else f"not all Running: {phases()}")
    events = {e.get("name"): envs_of(e) for e in allocations(dpk)}
    used = [0] * len(gpus)
    wrong = []
    for name in names:
        index = gpushare.assigned_gpu(admin.get_pod("default", name))
        visible = events.get(name, {}).get("NVIDIA_VISIBLE_DEVICES")
        if index is None or visible != gpus[index]:
            wrong.append(f"{name}: IDX {index}, NVIDIA_VISIBLE_DEVICES {visible}")
        else:
            used[index] += 4
    check(all_running is not None and not wrong,
          f"every pod of the burst runs on the GPU the extender bound it to (GiB per GPU: {used})"
          + "".join(f"; {w}" for w in wrong))
    check(max(used) <= UNITS, f"no GPU holds more than its {UNITS} GiB")
    body = pod_body("one-too-many", {"main": {gpushare.RESOURCE_MEM: "4"}}, None)
    del body["spec"]["nodeName"]
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(body))

    def unschedulable() -> str:
        conditions = admin.get_pod("default", "one-too-many").get("status", {}).get("conditions") or []
        return next((str(c.get("message")) for c in conditions if c.get("type") == "PodScheduled"
                     and c.get("status") == "False"), "")

    wait(lambda: unschedulable() != "", 30)
    check(unschedulable() != "" and gpushare.ANN_IDX not in annotations_of(admin, "one-too-many"),
          f"a pod that fits no GPU stays Pending, unbound: {unschedulable()[:140]!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_k8s_argument(parser)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument("--extender-port", type=int, default=int(os.environ.get("K8S_SCHED_PORT", "10259")) + 1)
    parser.add_argument("--burst", type=int, default=12,
                        help="4 GiB pods created at once through the scheduler (12 fill the 4 x 14 GiB GPUs 3 each)")
    args = parser.parse_args()
    cluster = Cluster(args.k8s, Path(os.environ.get("K8S_STATE", "/tmp/gpu-labeller-k8s")))
    work = Path(tempfile.mkdtemp(prefix="e2e-gpushare-"))
    processes: list[subprocess.Popen[str]] = []
    gpus = uuids()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    try:
        cluster.up()
        wanted = [o for o in render({"config": {"data": CONFIGS}})
                  if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
        cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": wanted}))
        admin = Kube(str(cluster.admin))
        sockets, dpk = work / "sockets", work / "dpkubelet.jsonl"
        processes.append(subprocess.Popen(
            [str(args.k8s / "bin" / "dpkubelet"), "--socket-dir", str(sockets), "--node-name", NODE, "--kubeconfig",
             str(cluster.admin), "--duration", "0"], stdout=dpk.open("w"), stderr=(work / "dpkubelet.klog").open("w"),
            text=True))
        check(wait(lambda: "kubelet_started" in dpk.read_text(), 30) is not None, "dpkubelet started in node mode")
        configs = config_map_volume(work / "configs", CONFIGS)
        plugin_config = cluster.kubeconfig_for("gpu-labeller-device-plugin", work / "kubeconfig-plugin")
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "device-plugin", "--simulate", PROFILE,
             "--config-dir", str(configs), "--config-label", "", "--node-name", NODE, "--kubeconfig",
             str(plugin_config), "--socket-dir", str(sockets), "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
            stderr=(work / "plugin.log").open("w"), text=True, cwd=ROOT, env={**os.environ, "GRPC_VERBOSITY": "ERROR"}))

        def allocatable() -> dict[str, Any]:
            return dict((admin.get_node(NODE).get("status") or {}).get("allocatable") or {})

        check(wait(lambda: allocatable().get(gpushare.RESOURCE_MEM) == str(4 * UNITS)
                   and allocatable().get(gpushare.RESOURCE_COUNT) == "4", 60) is not None,
              f"the Node shows {gpushare.RESOURCE_MEM}={4 * UNITS} and {gpushare.RESOURCE_COUNT}=4 allocatable")

        def phase(name: str) -> str:
            return str(admin.get_pod("default", name).get("status", {}).get("phase"))

        def annotations(name: str) -> dict[str, str]:
            return annotations_of(admin, name)

        # 1. As the extender binds with its per-node lock: one assumed pod at a time, equal requests, different GPUs.
        to_running = []
        for i, gpu in enumerate((2, 0, 3, 2, 1)):
            name = f"equal-{i}"
            placed = gpushare.placement_annotations(gpu, 4, UNITS, time.time_ns())
            started = time.monotonic()
            cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod_body(name, {"main": {gpushare.RESOURCE_MEM: "4"}},
                                                                            placed)))
            took = wait(lambda: phase(name) == "Running", 30)  # noqa: B023 - called before the loop moves on
            if took is not None:
                to_running.append(time.monotonic() - started)
            event = next((e for e in allocations(dpk) if e.get("name") == name), {})
            envs = envs_of(event)
            check(took is not None and envs.get("NVIDIA_VISIBLE_DEVICES") == gpus[gpu]
                  and envs.get(gpushare.ENV_IDX) == str(gpu) and annotations(name).get(gpushare.ANN_ASSIGNED) == "true",
                  f"{name} (4 GiB, GPU {gpu}) Running with NVIDIA_VISIBLE_DEVICES=...{gpus[gpu][-4:]}, marked assigned")
            ids = event.get("device_ids") or []
            check(len(ids) == 4 and all(str(i).startswith(gpus[gpu]) for i in ids),
                  f"{name}: the device manager's 4 units are on GPU {gpu} (preferred allocation)")
        if to_running:
            figure(f"pod created (annotated, bound) -> Running: {ms(to_running)} over {len(to_running)} pods")

        # 2. Two gpu-mem containers and a cpu/memory one.
        placed = gpushare.placement_annotations(1, 5, UNITS, time.time_ns())
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod_body("multi", {
            "trainer": {gpushare.RESOURCE_MEM: "3", "cpu": "1", "memory": "1Gi"},
            "logger": {"cpu": "100m", "memory": "64Mi"},
            "evaluator": {gpushare.RESOURCE_MEM: "2"}}, placed)))
        running = wait(lambda: phase("multi") == "Running", 30) is not None
        events = {e.get("container"): envs_of(e) for e in allocations(dpk) if e.get("name") == "multi"}
        check(running and {c: (v.get("NVIDIA_VISIBLE_DEVICES"), v.get(gpushare.ENV_CONTAINER))
                           for c, v in events.items() if v} == {"trainer": (gpus[1], "3"), "evaluator": (gpus[1], "2")}
              and annotations("multi").get(gpushare.ANN_ASSIGNED) == "true",
              "a pod with gpu-mem containers of 3 and 2 GiB and a cpu/memory one: both on GPU 1, one Allocate each, "
              "assigned after the second")

        # 3. No extender annotations: the pod fails with the plugin's message, not a fake device.
        unplaced = pod_body("unplaced", {"main": {gpushare.RESOURCE_MEM: "2"}}, None)
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(unplaced))
        failed = wait(lambda: phase("unplaced") == "Failed", 30) is not None
        message = str(admin.get_pod("default", "unplaced").get("status", {}).get("message", ""))
        check(failed and "no pod bound to this node waits to start a container of 2 GiB" in message,
              f"a pod without the extender's annotations fails with the plugin's reason: {message[:160]!r}")

        took = [float(e["took_ms"]) for e in json_lines(work / "plugin.log") if e.get("event") == "allocated by memory"]
        if took:
            figure(f"Allocate in the plugin (pod LIST + match + ASSIGNED patch on the real API server): "
                   f"median {statistics.median(took):.1f} ms, max {max(took):.1f} ms over {len(took)} containers")

        # 4. What the plugin's ServiceAccount may do.
        def can(verb: str, resource: str) -> str:
            return cluster.kubectl("auth", "can-i", verb, resource, "--as", PLUGIN_USER, check=False)

        check([can(v, "pods") for v in ("list", "patch", "create", "delete")] == ["yes", "yes", "no", "no"]
              and can("patch", "nodes") == "no" and can("create", "configmaps") == "no" and can("get", "nodes") == "no",
              "the plugin's ServiceAccount may list and patch pods, and nothing else "
              "(no node access: no label followed)")
        through_the_scheduler(cluster, admin, args, work, processes, dpk, gpus)
    finally:
        stop(*reversed(processes))
        if not args.keep:
            subprocess.run([str(args.k8s / "scheduler-down.sh")], env=cluster.env, check=False,
                           stdout=subprocess.DEVNULL)
            cluster.down()
        print(f"logs in {work}")
    failed_checks = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed_checks)} checks passed, {len(failed_checks)} failed")
    return 1 if failed_checks else 0


if __name__ == "__main__":
    sys.exit(main())
