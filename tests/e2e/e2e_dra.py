"""End to end: ``gpu-labeller dra-plugin`` on a real Kubernetes v1.34 control plane with DRA. Not a test.

Run by hand (pytest does not collect ``e2e_*.py``); it needs the shared ``k8s-dra`` folder (a real
kube-apiserver, kube-scheduler and resourceclaim controller v1.34.2, and ``drakubelet``: the real
kubelet DRA manager and plugin watcher for one node):

    python tests/e2e/e2e_dra.py [--k8s-dra DIR]

Four nodes, each a drakubelet and a ``gpu-labeller dra-plugin`` on a simulated profile:
``dra-h100`` (dgx-h100, NVIDIA through DRA), ``dra-mig`` (dgx-a100-mig-mixed), ``dra-amd``
(mi300x-x8-cpx), ``dra-mixed`` (mixed-l40s-mi210, both vendors). The DeviceClasses are the chart's.

1. A pod whose ResourceClaimTemplate asks for an H100 with at least 40 GiB: scheduled on dra-h100, its
   claim allocated to one of our devices, prepared (drakubelet's ``prepare`` event carries our CDI IDs
   and the spec file defines them), unprepared when the pod is deleted; no spec file or checkpoint left.
2. A claim nothing satisfies: the pod stays Pending with the scheduler's reason; deleting it leaves
   no slice change, spec file or checkpoint behind.
3. MIG: ``profile == "1g.5gb"`` gets a MIG device of dra-mig, named as NVIDIA's driver names it
   (``gpu-<minor>-mig-1g5gb-19-<start>``). AMD: two partitions of one GPU through
   ``matchAttribute: resource.kubernetes.io/pciBusID`` on dra-amd. Mixed node: both drivers publish,
   a pod with an NVIDIA claim and an AMD claim gets each from its driver.
4. Faults on dra-h100: drakubelet restarted (registered again, prepared claims still known: the pod's
   unprepare after the restart succeeds); the plugin SIGKILLed between prepare and unprepare (the
   unprepare after its restart succeeds, nothing leaks); the API server restarted (the slices are
   there and right once it answers).
5. A pool generation of 2^63-1 on dra-h100: the real API server refuses 2^63 (400), so after someone
   sets our slice's generation to 2^63-1 and edits an attribute, the plugin deletes the pool and
   publishes it again from generation 1 (/readyz 200 within 2 s of that, one warning saying why); the
   same after the plugin itself wrote 2^63-1 and the slice was deleted; the scheduler then allocates
   from the pool published again.
6. Hostile files and a second claim for a held device, on dra-h100 (issue 28): a symlink planted at a
   claim's CDI spec path fails the real kubelet's prepare with one line and its target is untouched,
   until it is removed (then the kubelet's retry prepares it); a FIFO planted as a claim's checkpoint
   record is moved aside and the claim prepared; a claim whose status is allocated by hand to the
   device another pod's claim holds is refused by the plugin, naming that claim.

The control plane runs with ``DRA_STATE`` (default: a folder in the run's temporary folder) and the
ports of ``DRA_API_PORT``, ``DRA_ETCD_PORT``, ``DRA_ETCD_PEER_PORT``, ``DRA_SCHED_PORT`` and
``DRA_KCM_PORT`` when set (``up.sh`` reads them), so that two copies can run side by side.

Prints each check and the figures; exits with 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.draplane import (Cluster, Event, Node, chart_device_classes, check, figure, open_plane,  # noqa: E402
                                start_nodes, stop_nodes, verdict, wait)

NODES = {  # node -> (profile, vendors served through DRA)
    "dra-h100": ("dgx-h100", ["nvidia"]),
    "dra-mig": ("dgx-a100-mig-mixed", ["nvidia"]),
    "dra-amd": ("mi300x-x8-cpx", ["amd"]),
    "dra-mixed": ("mixed-l40s-mi210", ["nvidia", "amd"]),
}
INT64_MAX = 2**63 - 1  # the largest pool generation the API can hold


def claim_template(name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None
                   ) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"spec": {"devices": devices}}}


def request(name: str, device_class: str, cel: str | None = None, count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": name, "exactly": exactly}


def pod(name: str, claims: dict[str, str]) -> dict[str, Any]:
    """A pod with one container using every claim (claim name -> template); deleted gracefully."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"terminationGracePeriodSeconds": 30, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"claims": [{"name": c} for c in claims]}}],
                     "resourceClaims": [{"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()]}}


def prepared(node: Node, pod_name: str, since: int, timeout: float = 90) -> Event | None:
    return node.events.wait("prepare", since, timeout, pod=f"default/{pod_name}")


def delete_pod(cluster: Cluster, node: Node, pod_name: str, since: int) -> Event | None:
    cluster.kubectl("delete", "pod", pod_name, "--grace-period=30", "--wait=false")
    return node.events.wait("unprepare", since, 90, pod=f"default/{pod_name}")


def allocated_devices(cluster: Cluster, pod_name: str) -> list[dict[str, Any]]:
    claims = cluster.json("get", "resourceclaims")["items"]
    owned = [c for c in claims if any(r.get("name") == pod_name for r in c.get("status", {}).get("reservedFor", []))]
    return [r for c in owned for r in c["status"]["allocation"]["devices"]["results"]]


def scenario_claim_lifecycle(cluster: Cluster, node: Node) -> None:
    print("1. an H100 with at least 40 GiB: allocated, prepared, unprepared", flush=True)
    cluster.apply([
        claim_template("h100-40gi", [request("gpu", "gpu.nvidia.com",
            'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3" && '
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0')]),
        pod("h100-pod", {"gpu": "h100-40gi"}),
    ])
    since = node.events.mark()
    began = time.monotonic()
    event = prepared(node, "h100-pod", since)
    check(event is not None and event["error"] == "", "the pod's claim was prepared by drakubelet on dra-h100")
    if event is None:
        return
    figure(f"pod created -> prepared in {event['at'] - began:.2f} s")
    ids = event["cdi_devices"]
    check(len(ids) == 1 and ids[0].startswith("k8s.gpu-labeller.io/gpu="), f"one CDI device of ours: {ids}")
    check(set(ids) <= node.cdi_names(), "the spec file in --cdi-spec-dir defines it")
    results_ = allocated_devices(cluster, "h100-pod")
    check(len(results_) == 1 and results_[0]["driver"] == "gpu.nvidia.com" and results_[0]["pool"] == "dra-h100",
          "the scheduler allocated one device of our pool: "
          f"{[(r['driver'], r['pool'], r['device']) for r in results_]}")
    phase = wait(lambda: cluster.json("get", "pod", "h100-pod")["status"].get("phase") == "Running", 30)
    check(phase is not None, "the pod is Running")
    gone = delete_pod(cluster, node, "h100-pod", since)
    check(gone is not None and gone["error"] == "", "unprepared when the pod was deleted")
    check(wait(lambda: not node.spec_files() and not node.checkpoints(), 10) is not None,
          "no spec file and no checkpoint left")


def scenario_unsatisfiable(cluster: Cluster, node: Node) -> None:
    print("2. a claim nothing satisfies", flush=True)
    before = cluster.devices(node.name)
    cluster.apply([
        claim_template("too-big", [request("gpu", "gpu.nvidia.com",
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("1000Gi")) >= 0')]),
        pod("too-big-pod", {"gpu": "too-big"}),
    ])

    def reason() -> str:
        events = cluster.json("get", "events", "--field-selector", "involvedObject.name=too-big-pod")["items"]
        return next((e["message"] for e in events if e.get("reason") == "FailedScheduling"), "")

    wait(reason, 60)
    message = reason()
    check(bool(message) and cluster.json("get", "pod", "too-big-pod")["status"].get("phase") == "Pending",
          f"Pending with the scheduler's reason: {message[:140]!r}")
    cluster.kubectl("delete", "pod", "too-big-pod", "--grace-period=0", "--force", "--wait=true")
    check(cluster.devices(node.name) == before and not node.spec_files() and not node.checkpoints(),
          "deleting it leaves the slices as they were, no spec file, no checkpoint")


def scenario_mig_amd_mixed(cluster: Cluster, nodes: dict[str, Node]) -> None:
    print("3. MIG profile, AMD partitions of one GPU, a mixed node", flush=True)
    mig, amd, mixed = nodes["dra-mig"], nodes["dra-amd"], nodes["dra-mixed"]
    marks = {n: nodes[n].events.mark() for n in nodes}
    cluster.apply([
        claim_template("mig-1g5gb", [request("mig", "mig.nvidia.com",
            'device.attributes["gpu.nvidia.com"].profile == "1g.5gb"')]),
        pod("mig-pod", {"mig": "mig-1g5gb"}),
        claim_template("two-partitions", [request("parts", "gpu.amd.com",
            'device.attributes["gpu.amd.com"].type == "amdgpu-partition"', count=2)],
            [{"requests": ["parts"], "matchAttribute": "resource.kubernetes.io/pciBusID"}]),
        pod("amd-pod", {"parts": "two-partitions"}),
        claim_template("l40s", [request("gpu", "gpu.nvidia.com",
            'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L40S"')]),
        claim_template("mi210", [request("gpu", "gpu.amd.com",
            'device.attributes["gpu.amd.com"].productName == "AMD_Instinct_MI210"')]),
        pod("mixed-pod", {"nvidia": "l40s", "amd": "mi210"}),
    ])
    event = prepared(mig, "mig-pod", marks["dra-mig"])
    devices = allocated_devices(cluster, "mig-pod")
    check(event is not None and event["error"] == "" and len(devices) == 1
          and re.fullmatch(r"gpu-\d+-mig-1g5gb-19-\d", devices[0]["device"]) is not None  # NVIDIA's name
          and devices[0]["pool"] == "dra-mig", f"MIG 1g.5gb: {[d['device'] for d in devices]} prepared on dra-mig")
    event = prepared(amd, "amd-pod", marks["dra-amd"])
    devices = allocated_devices(cluster, "amd-pod")
    slices = {d["name"]: d for s in cluster.slices("dra-amd") for d in s["spec"]["devices"]}
    parents = {slices[d["device"]]["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
               for d in devices if d["device"] in slices}
    check(event is not None and event["error"] == "" and len(devices) == 2 and len(parents) == 1
          and len(event["cdi_devices"]) == 2,
          f"two partitions of one GPU ({sorted(d['device'] for d in devices)}, parent {parents}), prepared")
    drivers = cluster.devices("dra-mixed")
    check(set(drivers) == {"gpu.nvidia.com", "gpu.amd.com"},
          f"the mixed node publishes both drivers: {sorted(drivers)}")
    prepares = [mixed.events.wait("prepare", marks["dra-mixed"], 90, pod="default/mixed-pod")]
    devices = allocated_devices(cluster, "mixed-pod")
    check(all(p is not None and p["error"] == "" for p in prepares)
          and sorted(d["driver"] for d in devices) == ["gpu.amd.com", "gpu.nvidia.com"],
          f"the mixed pod's claims went one to each driver: {sorted((d['driver'], d['device']) for d in devices)}")
    for name, node in (("mig-pod", mig), ("amd-pod", amd), ("mixed-pod", mixed)):
        gone = delete_pod(cluster, node, name, marks[node.name])
        check(gone is not None and gone["error"] == "", f"{name} unprepared")
    check(wait(lambda: not any(n.spec_files() or n.checkpoints() for n in (mig, amd, mixed)), 10) is not None,
          "no spec file and no checkpoint left on the three nodes")


def scenario_faults(cluster: Cluster, node: Node) -> None:
    print("4. faults: drakubelet restart, plugin SIGKILL, API server restart", flush=True)
    cluster.apply([pod("fault-pod", {"gpu": "h100-40gi"})])
    since = node.events.mark()
    check(prepared(node, "fault-pod", since) is not None, "a pod prepared before the faults")
    node.stop(node.kubelet)
    node.start_kubelet()
    began = time.monotonic()
    registered = node.events.wait("plugin_registered", 0, 30)
    if check(registered is not None and registered["error"] == "", "registered again after drakubelet restarted"):
        figure(f"drakubelet restarted -> plugin registered in {registered['at'] - began:.2f} s (budget 2 s)")
        check(registered["at"] - began <= 2.0, "re-registration within 2 s")
    back = wait(lambda: len(cluster.devices(node.name).get("gpu.nvidia.com", [])) == 8, 30)
    check(back is not None, "the slices are back (drakubelet deletes the node's slices at start)")
    if back is not None:
        figure(f"slices back {back:.2f} s after registration")
    mark = node.events.mark()
    node.stop(node.plugin, signal.SIGKILL)
    node.start_plugin()
    check(node.events.wait("plugin_registered", mark, 60) is not None, "the SIGKILLed plugin is back")
    since = node.events.mark()
    gone = delete_pod(cluster, node, "fault-pod", since)
    check(gone is not None and gone["error"] == "",
          "the pod prepared before the drakubelet restart and the plugin SIGKILL is unprepared")
    check(wait(lambda: not node.spec_files() and not node.checkpoints(), 10) is not None, "nothing leaked")
    before = cluster.devices(node.name)
    pid = int((cluster.state / "kube-apiserver.pid").read_text())
    os.kill(pid, signal.SIGKILL)  # a crash: its graceful shutdown would take a minute
    wait(lambda: subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0, 30)
    down_since = time.monotonic()
    subprocess.run([str(cluster.k8s_dra / "up.sh")], env=cluster.env, check=True, stdout=subprocess.DEVNULL)
    figure(f"API server down for {time.monotonic() - down_since:.1f} s (killed, started again by up.sh)")
    right = wait(lambda: cluster.devices(node.name) == before, 30)  # up.sh returns once /readyz answers
    check(right is not None and right <= 1.0, f"slices right within 1 s of the API server answering ({right})")
    if right is not None:
        figure(f"API server answering -> slices right in {right:.2f} s (budget 1 s)")
    # the plugin's watch came back with the API server: a slice deleted now is written again at once
    name = cluster.slices(node.name)[0]["metadata"]["name"]
    cluster.kubectl("delete", "resourceslice", name)
    rewritten = wait(lambda: cluster.devices(node.name) == before, 30)
    check(rewritten is not None and rewritten <= 1.0,
          f"a slice deleted after the restart is back within 1 s ({rewritten})")
    if rewritten is not None:
        figure(f"slice deleted by hand after the API server restart -> written again in {rewritten:.2f} s")


def scenario_generation_exhausted(cluster: Cluster, node: Node) -> None:
    print("5. a pool generation of 2^63-1: the pool is published again from generation 1", flush=True)
    ours = cluster.slices(node.name)
    devices = [s["spec"]["devices"] for s in ours]
    path = "/apis/resource.k8s.io/v1/resourceslices"
    too_big = {**ours[0], "metadata": {"name": "gpu-labeller-e2e-too-big"},
               "spec": {**ours[0]["spec"], "pool": {**ours[0]["spec"]["pool"], "generation": INT64_MAX + 1}}}
    code, answer = cluster.raw("POST", path, too_big)
    check(code == 400 and answer.get("reason") == "BadRequest" and "cannot unmarshal number 9223372036854775808"
          in answer.get("message", ""), f"the API refuses a generation of 2^63: {code} {answer.get('reason')}: "
          f"{answer.get('message')}")

    def published_again(generation: int) -> bool:
        now = cluster.slices(node.name)
        return ([s["spec"]["devices"] for s in now] == devices
                and {s["spec"]["pool"]["generation"] for s in now} == {generation})

    def edit(generation: int) -> float:
        """What someone with write access does (kubectl edit): the pool's generation and an attribute."""
        (slice_,) = cluster.slices(node.name)
        slice_["spec"]["pool"]["generation"] = generation
        slice_["spec"]["devices"][0]["attributes"]["productName"] = {"string": "edited"}
        cluster.kubectl("replace", "-f", "-", stdin=json.dumps(slice_))
        return time.monotonic()

    def repaired(what: str, edited: float) -> None:
        if wait(lambda: published_again(1), 30) is None:
            check(False, f"{what}: our devices published again at generation 1")
            return
        back = time.monotonic() - edited
        check(True, f"{what}: our devices published again at generation 1")
        ready = wait(node.ready, 10)
        check(ready is not None and ready <= 2.0, f"{what}: /readyz 200 within 2 s of that ({ready})")
        if ready is not None:
            figure(f"{what} -> published again in {back:.2f} s, /readyz 200 {ready:.2f} s later (budget 2 s)")

    warned = len([e for e in node.log() if e.get("reason") == "generation-exhausted"])
    repaired("generation set to 2^63-1 and an attribute edited", edit(INT64_MAX))
    warnings = [e for e in node.log() if e.get("reason") == "generation-exhausted"][warned:]
    check(len(warnings) == 1 and warnings[0].get("generation") == INT64_MAX,
          f"one warning says why: {[(e.get('event'), e.get('reason'), e.get('generation')) for e in warnings]}")
    edit(INT64_MAX - 1)
    check(wait(lambda: published_again(INT64_MAX), 30) is not None,
          "an edit at 2^63-2 is written back at 2^63-1 (the last generation there is)")
    (slice_,) = cluster.slices(node.name)
    cluster.kubectl("delete", "resourceslice", slice_["metadata"]["name"])
    repaired("the slice the plugin wrote at 2^63-1 deleted", time.monotonic())
    since = node.events.mark()
    cluster.apply([pod("after-repair-pod", {"gpu": "h100-40gi"})])
    event = prepared(node, "after-repair-pod", since)
    results_ = allocated_devices(cluster, "after-repair-pod")
    check(event is not None and event["error"] == "" and [r["pool"] for r in results_] == [node.name],
          f"the scheduler allocates from the pool published again: {[r['device'] for r in results_]}, prepared")
    gone = delete_pod(cluster, node, "after-repair-pod", since)
    check(gone is not None and gone["error"] == "", "and it is unprepared")


def claim_object(name: str, cel: str) -> dict[str, Any]:
    """A ResourceClaim made directly (its UID known before a pod uses it): one gpu.nvidia.com device."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [request("gpu", "gpu.nvidia.com", cel)]}}}


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod using the ResourceClaim ``claim`` by name."""
    obj = pod(name, {})
    obj["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return obj


def scenario_hostile_files(cluster: Cluster, node: Node) -> None:
    print("6. a symlink at a spec path, a FIFO as a checkpoint record, a second claim for a held device", flush=True)
    h100 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'
    cluster.apply([claim_object("trap-claim", h100), claim_object("fifo-claim", h100)])
    trap_uid = cluster.json("get", "resourceclaim", "trap-claim")["metadata"]["uid"]
    fifo_uid = cluster.json("get", "resourceclaim", "fifo-claim")["metadata"]["uid"]
    victim = node.dir / "victim.txt"
    victim.write_text("never written by the plugin\n")
    link = node.dir / "cdi" / f"gpu-labeller-dra_gpu.nvidia.com_{trap_uid}.json"
    link.symlink_to(victim)
    fifo = node.dir / "plugins" / "gpu.nvidia.com" / "claims" / f"{fifo_uid}.json"
    os.mkfifo(fifo)
    since = node.events.mark()
    cluster.apply([claim_pod("trap-pod", "trap-claim"), claim_pod("fifo-pod", "fifo-claim")])
    log = node.dir / "plugin.log"
    refused = wait(lambda: f"{link} is a symlink, not a regular file; left alone" in log.read_text(), 60)
    check(refused is not None, "a symlink at the spec path fails the claim's prepare (the kubelet retries it)")
    check(victim.read_text() == "never written by the plugin\n" and link.is_symlink(), "its target is untouched")
    link.unlink()
    event = prepared(node, "trap-pod", since)
    check(event is not None and event["error"] == "" and event["attempts"] > 1,
          f"with the link gone, the kubelet's next try prepares it (attempt {(event or {}).get('attempts')})")
    event = prepared(node, "fifo-pod", since)
    check(event is not None and event["error"] == "" and fifo.with_name(fifo.name + ".bad").is_fifo(),
          "a FIFO as the checkpoint record: moved aside, the claim prepared")
    held = cluster.json("get", "resourceclaim", "trap-claim")["status"]["allocation"]["devices"]["results"][0]
    cluster.apply([claim_object("rival-claim", h100)])
    allocation = {"devices": {"results": [dict(held)]}, "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node.name]}]}]}}
    cluster.kubectl("patch", "resourceclaim", "rival-claim", "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"allocation": allocation}}))
    since = node.events.mark()
    cluster.apply([claim_pod("rival-pod", "rival-claim")])
    event = prepared(node, "rival-pod", since)
    check(event is not None and f"device {held['device']} is prepared for claim default/trap-claim ({trap_uid})"
          in event["error"], f"a second claim for {held['device']} is refused: {(event or {}).get('error', '')!r}")
    since = node.events.mark()
    for name in ("trap-pod", "fifo-pod", "rival-pod"):
        cluster.kubectl("delete", "pod", name, "--grace-period=0", "--force", "--wait=true")
    cluster.kubectl("delete", "resourceclaim", "trap-claim", "fifo-claim", "rival-claim", "--wait=true")
    check(wait(lambda: not node.spec_files() and not node.checkpoints(), 60) is not None,
          "unprepared: no spec file and no checkpoint record left (the FIFO stays aside, .bad)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    opened = open_plane(parser, "gld-")
    if opened is None:
        return 2
    _, cluster, work = opened
    nodes: dict[str, Node] = {}
    try:
        cluster.up()
        cluster.apply(chart_device_classes())
        nodes.update((name, Node(cluster, name, work, *NODES[name])) for name in NODES)
        start_nodes(cluster, list(nodes.values()))
        scenario_claim_lifecycle(cluster, nodes["dra-h100"])
        scenario_unsatisfiable(cluster, nodes["dra-h100"])
        scenario_mig_amd_mixed(cluster, nodes)
        scenario_faults(cluster, nodes["dra-h100"])
        scenario_generation_exhausted(cluster, nodes["dra-h100"])
        scenario_hostile_files(cluster, nodes["dra-h100"])
    finally:
        stop_nodes(list(nodes.values()))
        cluster.down()
    return verdict(work)


if __name__ == "__main__":
    sys.exit(main())
