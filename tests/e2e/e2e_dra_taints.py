"""End to end: health as device taints, and ``nvidia.com/gpu`` through DRA, on a real Kubernetes v1.34 control plane
with the feature gates on. Not a test.

Run by hand (pytest does not collect ``e2e_*.py``); it needs the shared ``k8s-dra`` folder (a real kube-apiserver,
kube-scheduler and kube-controller-manager v1.34.2, and ``drakubelet``: the real kubelet DRA manager):

    python tests/e2e/e2e_dra_taints.py [--k8s-dra DIR]

The control plane starts with DRADeviceTaints and DRAExtendedResource on the API server, the scheduler and the
controller-manager, the API server also serving ``resource.k8s.io/v1alpha3`` (the 1.34 scheduler with
DRADeviceTaints watches DeviceTaintRules and schedules no DRA pod until it can list them), and the
controller-manager also running the ``device-taint-eviction-controller``. One node, ``taints-node``: a drakubelet
and the DRA plugin of this checkout on a simulated node of 2 NVIDIA L40S and 2 AMD MI210 (a profile file), run
in this process (the simulated NVML's XID injection and lost GPUs are hooks on it), recovery after 5 s, a device
gone from the probe held 10 s. The DeviceClasses are the chart's (dra.enabled, for 1.34: with extendedResourceName).

1. An XID: the GPU stays in its slice tainted ``gpu.nvidia.com/xid=79:NoSchedule`` (the API server stamps
   timeAdded); the scheduler gives a pod the other GPU and leaves a second pod Pending, then gives it the GPU once
   the taint is gone (recovered).
2. A lost GPU under a running pod: tainted ``gpu.nvidia.com/gpu-lost:NoExecute``; the eviction controller deletes
   the pod (drakubelet unprepares it); the taint goes on recovery.
3. A GPU gone from the probe (the profile file edited) under a running pod: published as it was, tainted
   ``gpu-lost:NoExecute``; the pod is evicted and unprepared; the GPU leaves the slice once its hold is over;
   back in the file, it is published untainted.
4. An AMD KFD node gone: tainted ``gpu.amd.com/kfd-node-lost:NoExecute``, untainted when it is back.
5. Extended resources: a pod asking ``nvidia.com/gpu: 1`` (``amd.com/gpu: 1``) gets a special ResourceClaim
   from the scheduler (``<pod>-extended-resources-<suffix>``, annotated, owned by the pod, one request per
   container and resource of the DeviceClass with that extendedResourceName) allocated to one of our devices,
   named in ``pod.status.extendedResourceClaimStatus``; a pod asking more than the node has stays Pending.
   drakubelet has no feature gates (DRAExtendedResource off in its kubelet DRA manager): it does not prepare that
   claim (no NodePrepareResources call, no CDI spec), and sets the pod Running with no device: the real kubelet
   with the gate prepares it (tests/e2e/e2e_node_dra.py).
6. The gates off (the control plane started again without them): the API server drops the taints; the plugin
   says so once (``reason: feature-gate-off``, ``gate: DRADeviceTaints``: the one gate-off mechanism, with its
   metric) and an unhealthy GPU leaves its slice, as before taints; the API server
   drops the DeviceClasses' extendedResourceName too.

The control plane runs with ``DRA_STATE`` (default: a folder in the run's temporary folder) and the ports of
``DRA_API_PORT``, ``DRA_ETCD_PORT``, ``DRA_ETCD_PEER_PORT``, ``DRA_SCHED_PORT`` and ``DRA_KCM_PORT`` when set, and
is stopped with ``down.sh --wipe`` whatever happened. Prints each check and the figures; exits 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.apps.draplugin.app import DraPlugin  # noqa: E402
from labeller.host.machine import Host, NodeOptions, open_host  # noqa: E402
from tests.draplugin.conftest import Dirs, plugin_on_loop  # noqa: E402
from tests.e2e import e2e_dra  # noqa: E402
from tests.e2e.draplane import (Cluster, Node, chart_device_classes, check, figure, open_plane, verdict,  # noqa: E402
                                wait)
from tests.e2e.e2e_dra import allocated_devices, claim_template, pod, prepared, request  # noqa: E402
from tests.plugin.profile_files import l40s_node, write_yaml  # noqa: E402

Obj = dict[str, Any]
NODE = "taints-node"
NVIDIA, AMD = "gpu.nvidia.com", "gpu.amd.com"
GATES = "--feature-gates=DRADeviceTaints=true,DRAExtendedResource=true"
GATED = {"APISERVER_EXTRA_ARGS": f"{GATES} --runtime-config=resource.k8s.io/v1alpha3=true",
         "SCHEDULER_EXTRA_ARGS": GATES,
         "KCM_EXTRA_ARGS": f"{GATES} --controllers=device-taint-eviction-controller"}
RECOVERY_S, HOLD_S = 5.0, 10.0
XID, LOST, KFD_LOST = f"{NVIDIA}/xid", f"{NVIDIA}/gpu-lost", f"{AMD}/kfd-node-lost"


def node_profile(nvidia_gpus: int) -> Obj:
    return l40s_node(nvidia_gpus, amd_gpus=2)


def devices(cluster: Cluster, driver: str) -> dict[str, Obj]:
    return {d["name"]: d for s in cluster.slices(NODE) if s["spec"]["driver"] == driver for d in s["spec"]["devices"]}


def taints(cluster: Cluster, name: str, driver: str = NVIDIA) -> list[tuple[str, str, str]]:
    device = devices(cluster, driver).get(name, {})
    return [(t["key"], t.get("value", ""), t["effect"]) for t in device.get("taints", [])]


def pinned(template: str, uuid: str) -> Obj:
    return claim_template(template, [request("gpu", NVIDIA, f'device.attributes["{NVIDIA}"].uuid == "{uuid}"')])


def pod_gone(cluster: Cluster, name: str) -> bool:
    return not cluster.json("get", "pods", "--field-selector", f"metadata.name={name}")["items"]


def scheduling_message(cluster: Cluster, name: str) -> str:
    events = cluster.json("get", "events", "--field-selector", f"involvedObject.name={name}")["items"]
    return next((e["message"] for e in events if e.get("reason") == "FailedScheduling"), "")


class Plugin:
    """The in-process plugin of the node, and its simulated hardware."""

    def __init__(self, plugin: DraPlugin, host: Host, profile: Path, log: Path) -> None:
        self.plugin, self.host, self.profile, self.log = plugin, host, profile, log

    def uuid(self, name: str) -> str:
        return self.plugin.drivers[NVIDIA].snapshot.by_name[name].health_key

    @property
    def nvml(self) -> Any:
        return self.host.handles["nvidia"]

    def lines(self) -> list[Obj]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]


@contextmanager
def plugin_of(cluster: Cluster, node: Node, profile: Path) -> Iterator[Plugin]:
    dirs = Dirs(node.dir / "reg", node.dir / "plugins", node.dir / "cdi", node.dir / "mps")
    with open_host(NodeOptions(simulate=str(profile), config_path=node.config)) as host, \
            plugin_on_loop(host, Path(cluster.kubeconfig), NODE, dirs, config_path=node.config,
                           recovery_seconds=RECOVERY_S, probe_interval=1.0, gone_hold_seconds=HOLD_S,
                           ready=False) as (plugin, _, _):
        yield Plugin(plugin, host, profile, node.dir / "plugin.log")


def log_to(path: Path) -> None:
    """The plugin's log, as JSON lines in ``path`` (it runs in this process)."""
    structlog.configure(processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                                    structlog.processors.JSONRenderer()],
                        logger_factory=structlog.PrintLoggerFactory(file=path.open("a")))


def start_node(cluster: Cluster, work: Path, profile: Path) -> Node:
    node = Node(cluster, NODE, work, str(profile), ["nvidia", "amd"])
    node.start_kubelet()
    check(node.events.wait("kubelet_started", 0, 60) is not None, f"{NODE}: drakubelet started")
    return node


def registered(cluster: Cluster, node: Node, began: float) -> None:
    ok = node.events.wait("plugin_registered", 0, 60) is not None and wait(
        lambda: len(devices(cluster, NVIDIA)) == 2 and len(devices(cluster, AMD)) == 2, 60) is not None
    check(ok, f"{NODE}: both drivers registered and published (2 NVIDIA, 2 AMD devices)")
    figure(f"plugin start -> slices published in {time.monotonic() - began:.2f} s")


# --- the scenarios ---------------------------------------------------------------------------------------------

def scenario_xid(cluster: Cluster, node: Node, plugin: Plugin) -> None:
    print("1. an XID: tainted NoSchedule, skipped by the scheduler, untainted on recovery", flush=True)
    began = time.monotonic()
    plugin.nvml.inject_xid(plugin.uuid("gpu-0"), 79)
    seen = wait(lambda: taints(cluster, "gpu-0") == [(XID, "79", "NoSchedule")], 30)
    stamp = next((t.get("timeAdded") for t in devices(cluster, NVIDIA).get("gpu-0", {}).get("taints", [])), None)
    check(seen is not None and bool(stamp) and len(devices(cluster, NVIDIA)) == 2,
          f"gpu-0 stays in the slice tainted {XID}=79:NoSchedule, timeAdded {stamp} (the server's stamp)")
    figure(f"XID -> taint on the API server in {time.monotonic() - began:.2f} s")
    since = node.events.mark()
    cluster.apply([claim_template("any-nvidia", [request("gpu", NVIDIA)]), pod("xid-a", {"gpu": "any-nvidia"})])
    event = prepared(node, "xid-a", since)
    given = [r["device"] for r in allocated_devices(cluster, "xid-a")]
    check(event is not None and event["error"] == "" and given == ["gpu-1"],
          f"a pod asking any NVIDIA GPU gets the untainted one: {given}")
    cluster.apply([pod("xid-b", {"gpu": "any-nvidia"})])
    message = wait(lambda: scheduling_message(cluster, "xid-b"), 60)
    check(message is not None and not allocated_devices(cluster, "xid-b"),
          f"a second pod stays Pending: {scheduling_message(cluster, 'xid-b')!r}")
    untainted = wait(lambda: not taints(cluster, "gpu-0"), 60)
    check(untainted is not None, f"the taint goes once gpu-0 answered normally for {RECOVERY_S:g} s")
    event = prepared(node, "xid-b", since)
    given = [r["device"] for r in allocated_devices(cluster, "xid-b")]
    check(event is not None and event["error"] == "" and given == ["gpu-0"],
          f"then the Pending pod gets gpu-0 and is prepared: {given}")
    for name in ("xid-a", "xid-b"):
        e2e_dra.delete_pod(cluster, node, name, since)
    check(wait(lambda: pod_gone(cluster, "xid-a") and pod_gone(cluster, "xid-b"), 60) is not None, "both pods gone")


def scenario_lost(cluster: Cluster, node: Node, plugin: Plugin) -> None:
    print("2. a lost GPU under a running pod: tainted NoExecute, the pod evicted", flush=True)
    uuid = plugin.uuid("gpu-1")
    since = node.events.mark()
    cluster.apply([pinned("gpu-1-only", uuid), pod("lost-pod", {"gpu": "gpu-1-only"})])
    event = prepared(node, "lost-pod", since)
    check(event is not None and event["error"] == "", "a pod on gpu-1 prepared")
    began = time.monotonic()
    plugin.nvml.set_lost(uuid, True)
    tainted = wait(lambda: taints(cluster, "gpu-1") == [(LOST, "", "NoExecute")], 30)
    check(tainted is not None, f"gpu-1 tainted {LOST}:NoExecute")
    gone = node.events.wait("unprepare", since, 90, pod="default/lost-pod")
    said = [line.strip()[:240] for line in (cluster.state / "kube-controller-manager.log").read_text().splitlines()
            if "lost-pod" in line]
    check(gone is not None and gone["error"] == "" and wait(lambda: pod_gone(cluster, "lost-pod"), 60) is not None,
          f"the eviction controller deleted the pod, drakubelet unprepared it; the controller-manager: {said[:2]}")
    if gone is not None:
        figure(f"GPU lost -> pod evicted and unprepared in {gone['at'] - began:.2f} s")
    plugin.nvml.set_lost(uuid, False)
    check(wait(lambda: not taints(cluster, "gpu-1"), 60) is not None, "the taint goes once the GPU answers again")


def scenario_gone(cluster: Cluster, node: Node, plugin: Plugin) -> None:
    print("3. a GPU gone from the probe under a running pod: held tainted NoExecute, the pod evicted", flush=True)
    since = node.events.mark()
    cluster.apply([pod("gone-pod", {"gpu": "gpu-1-only"})])
    event = prepared(node, "gone-pod", since)
    check(event is not None and event["error"] == "", "a pod on gpu-1 prepared")
    attributes = devices(cluster, NVIDIA)["gpu-1"].get("attributes")
    began = time.monotonic()
    write_yaml(plugin.profile, node_profile(1))
    tainted = wait(lambda: taints(cluster, "gpu-1") == [(LOST, "", "NoExecute")], 30)
    check(tainted is not None and devices(cluster, NVIDIA)["gpu-1"].get("attributes") == attributes,
          f"gpu-1 still published as it was, tainted {LOST}:NoExecute")
    gone = node.events.wait("unprepare", since, 90, pod="default/gone-pod")
    check(gone is not None and gone["error"] == "" and wait(lambda: pod_gone(cluster, "gone-pod"), 60) is not None,
          "the pod using it evicted and unprepared")
    left = wait(lambda: "gpu-1" not in devices(cluster, NVIDIA), HOLD_S + 30)
    check(left is not None, f"gpu-1 leaves the slice once nothing holds it and its {HOLD_S:g} s hold is over")
    figure(f"GPU gone -> pod evicted {gone['at'] - began:.2f} s, GPU out of the slice "
           f"{time.monotonic() - began:.2f} s" if gone is not None else "GPU gone: pod not evicted")
    write_yaml(plugin.profile, node_profile(2))
    check(wait(lambda: "gpu-1" in devices(cluster, NVIDIA) and not taints(cluster, "gpu-1"), 30) is not None,
          "back in the profile, gpu-1 is published untainted")


def scenario_amd(cluster: Cluster, plugin: Plugin) -> None:
    print("4. an AMD KFD node gone: tainted NoExecute, untainted when back", flush=True)
    name = sorted(devices(cluster, AMD))[1]
    device = plugin.plugin.drivers[AMD].snapshot.by_name[name].physical
    path = plugin.host.host_root / f"sys/class/kfd/kfd/topology/nodes/{device.health_key.split(':')[1]}"
    saved = path.with_name("saved")
    path.rename(saved)
    try:
        check(wait(lambda: taints(cluster, name, AMD) == [(KFD_LOST, "", "NoExecute")], 30) is not None,
              f"{name} tainted {KFD_LOST}:NoExecute")
    finally:
        saved.rename(path)
    check(wait(lambda: not taints(cluster, name, AMD), 60) is not None, f"{name} untainted once its KFD node is back")


def extended_pod(name: str, resource: str, count: int = 1) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"terminationGracePeriodSeconds": 30, "restartPolicy": "Never", "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {resource: str(count)}}}]}}


def scenario_extended(cluster: Cluster, node: Node) -> None:
    print("5. extended resources: the scheduler allocates a special claim; drakubelet does not prepare it", flush=True)
    since = node.events.mark()
    for name, resource, driver in (("ext-nvidia", "nvidia.com/gpu", NVIDIA), ("ext-amd", "amd.com/gpu", AMD)):
        cluster.apply([extended_pod(name, resource)])
        wait(lambda name=name: cluster.json("get", "pod", name)["status"].get("extendedResourceClaimStatus"), 60)
        claim_status = cluster.json("get", "pod", name)["status"].get("extendedResourceClaimStatus") or {}
        claim_name = claim_status.get("resourceClaimName", "")
        claim = cluster.json("get", "resourceclaim", claim_name) if claim_name else {}
        results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        check(claim_name.startswith(f"{name}-extended-resources-")
              and claim["metadata"].get("annotations", {}).get("resource.kubernetes.io/extended-resource-claim")
              == "true" and [o["name"] for o in claim["metadata"].get("ownerReferences", [])] == [name],
              f"{name} ({resource}: 1): the scheduler made claim {claim_name}, annotated and owned by the pod; "
              f"pod.status.extendedResourceClaimStatus = {json.dumps(claim_status)}")
        requests = claim.get("spec", {}).get("devices", {}).get("requests", [])
        check(len(results) == 1 and results[0]["driver"] == driver and results[0]["pool"] == NODE
              and [r["exactly"]["deviceClassName"] for r in requests] == [driver],
              f"its one request of class {driver} is allocated {[(r['driver'], r['device']) for r in results]}")
        running = wait(lambda name=name: cluster.json("get", "pod", name)["status"].get("phase") == "Running", 60)
        prepares = [e for e in node.events.since(since) if e.get("event") == "prepare" and e.get("pod") ==
                    f"default/{name}"]
        uid = claim.get("metadata", {}).get("uid", "")
        check(running is not None and all(not e["claims"] for e in prepares)
              and not any(uid in p.name for p in node.spec_files()),
              f"drakubelet (no feature gates) set {name} Running without preparing the claim: "
              f"prepare events {[(e['claims'], e['cdi_devices']) for e in prepares]}, no CDI spec for it")
    cluster.apply([extended_pod("ext-too-many", "nvidia.com/gpu", 3)])
    message = wait(lambda: scheduling_message(cluster, "ext-too-many"), 60)
    check(message is not None, f"a pod asking nvidia.com/gpu: 3 of a node with 2 stays Pending: "
          f"{scheduling_message(cluster, 'ext-too-many')!r}")
    for name in ("ext-nvidia", "ext-amd", "ext-too-many"):
        cluster.kubectl("delete", "pod", name, "--grace-period=30", "--wait=false")
    claims_gone = wait(lambda: not [c for c in cluster.json("get", "resourceclaims")["items"]
                                    if "-extended-resources-" in c["metadata"]["name"]], 90)
    check(claims_gone is not None, "the pods deleted, the garbage collector deletes their claims")


def scenario_gate_off(cluster: Cluster, work: Path, profile: Path) -> None:
    print("6. the gates off: taints and extendedResourceName dropped by the API server, the old behaviour",
          flush=True)
    for key in GATED:
        cluster.env.pop(key, None)
    cluster.up()
    cluster.apply(chart_device_classes())
    stored = cluster.json("get", "deviceclass", NVIDIA)["spec"]
    check("extendedResourceName" not in stored, f"the API server dropped extendedResourceName: {json.dumps(stored)}")
    node = start_node(cluster, work / "off", profile)
    log_to(node.dir / "plugin.log")
    began = time.monotonic()
    with plugin_of(cluster, node, profile) as plugin:
        registered(cluster, node, began)
        plugin.nvml.inject_xid(plugin.uuid("gpu-0"), 79)
        left = wait(lambda: list(devices(cluster, NVIDIA)) == ["gpu-1"], 30)
        check(left is not None and not [d for d in devices(cluster, NVIDIA).values() if "taints" in d],
              "gpu-0 leaves the slice, no device keeps a taint")
        plugin.nvml.set_lost(plugin.uuid("gpu-1"), True)
        check(wait(lambda: not devices(cluster, NVIDIA), 30) is not None, "a lost GPU leaves the slice too")
        said = [e for e in plugin.lines() if e.get("reason") == "feature-gate-off"]
        check(len(said) == 1 and said[0].get("gate") == "DRADeviceTaints"
              and said[0].get("fields") == ["devices[].taints"],
              f"the plugin said why, once: {[(e.get('event'), e.get('fields')) for e in said]}")
        gauge = plugin.plugin.metrics.registry.get_sample_value("gpu_labeller_dra_feature_gate_off",
                                                                {"gate": "DRADeviceTaints"})
        check(plugin.plugin.gates.off == ("DRADeviceTaints",) and gauge == 1,
              f"the gate is off for the plugin, gpu_labeller_dra_feature_gate_off{{gate=DRADeviceTaints}} {gauge}")
    node.stop(node.kubelet)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    opened = open_plane(parser, "gldt-")
    if opened is None:
        return 2
    _, cluster, work = opened
    cluster.env.update(GATED)
    profile = work / "node.yaml"
    write_yaml(profile, node_profile(2))
    node: Node | None = None
    began = time.monotonic()
    try:
        cluster.up()
        cluster.apply(chart_device_classes())
        node = start_node(cluster, work, profile)
        log_to(node.dir / "plugin.log")
        started = time.monotonic()
        with plugin_of(cluster, node, profile) as plugin:
            registered(cluster, node, started)
            scenario_xid(cluster, node, plugin)
            scenario_lost(cluster, node, plugin)
            scenario_gone(cluster, node, plugin)
            scenario_amd(cluster, plugin)
            scenario_extended(cluster, node)
        node.stop(node.kubelet)
        cluster.down()  # --wipe: the gates off on an empty cluster (a field in use would be kept on update)
        scenario_gate_off(cluster, work, profile)
    finally:
        if node is not None:
            node.stop(node.kubelet)
        cluster.down()
    figure(f"the whole run {time.monotonic() - began:.0f} s")
    return verdict(work)


if __name__ == "__main__":
    sys.exit(main())
