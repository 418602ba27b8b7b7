"""End to end: MIG devices made at prepare (``labeller.dra.dynamicMig``) on a real Kubernetes v1.34
control plane with DRA. Not a test.

Run by hand (pytest does not collect ``e2e_*.py``); it needs the shared ``k8s-dra`` folder:

    python tests/e2e/e2e_dra_mig.py [--k8s-dra DIR]    (default: $K8S_DRA_DIR, else shared/k8s-dra)

One node, ``dra-mig-dyn``: a drakubelet and ``gpu-labeller dra-plugin`` on the ``dgx-a100-mig-dynamic``
profile (A100 40GB: GPUs 0-1 whole, 2-3 split 3g+2g+1g+1g by an admin, 4-7 MIG enabled and empty),
its simulated NVML keeping its MIG devices in a state file, which this script reads to see what the
plugin made. The DeviceClasses are the chart's. NVIDIA's gpu-test4 (demo/specs/quickstart/v1): four
pods, each asking 1g.5gb twice, 2g.10gb and 3g.20gb of one GPU (``matchAttribute: parentUUID``), created
one after the other (see ``gpu_test4``).

1. With DRAPartitionableDevices on the API server, scheduler and controller manager:
   a. the plugin without dynamicMig: 2 of the 4 pods fit (on GPUs 2-3, whose MIG devices exist), the
      other two stay Pending with the scheduler's reason;
   b. the plugin restarted with dynamicMig: it publishes one counter set per empty MIG GPU (the real
      API server validates them), the Pending pods are scheduled onto those GPUs, and their MIG
      devices are made at prepare (the simulated driver holds them; each claim's CDI spec names its
      MIG devices' GPU, one GPU per claim, and no UUID: ``NVIDIA_VISIBLE_DEVICES=void``): 4 of 4; while
      nothing changes, no slice is written;
   c. the pods deleted: unprepared, the MIG devices made destroyed, the admin's left alone.
   d. AMD: a node on ``mi300x-x8-spx`` (8 MI300X in SPX, NPS1) with dynamicMig publishes a counter set
      per GPU and its partitions of every mode (the real API server validates them); a pod asking two
      CPX partitions of one GPU is scheduled, and prepare switches that GPU to CPX: the claim's CDI
      spec names two render nodes.
2. The control plane again, wiped, without the gate: the plugin with dynamicMig publishes the devices
   that exist, as without it, after one warning line (the one gate-off mechanism: ``reason:
   feature-gate-off``, ``gate: DRAPartitionableDevices``, and its metric); a pod asking an existing MIG
   device is still served, and nothing is made.

The control plane runs with ``DRA_STATE`` (default: a folder in the run's temporary folder) and the
ports of ``DRA_API_PORT``, ``DRA_ETCD_PORT``, ``DRA_ETCD_PEER_PORT``, ``DRA_SCHED_PORT`` and
``DRA_KCM_PORT`` when set (``up.sh`` reads them), and is stopped with ``down.sh --wipe`` at the end.

Prints each check and the figures; exits 1 when a check fails, 2 when there is no DRA plane.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.draplane import (Cluster, Node, chart_device_classes, check, figure, open_plane, verdict,  # noqa: E402
                                wait)
from tests.e2e.e2e_dra import claim_template, delete_pod, pod, prepared, request  # noqa: E402

NODE, AMD_NODE = "dra-mig-dyn", "dra-amd-dyn"
PROFILE, AMD_PROFILE = "dgx-a100-mig-dynamic", "mi300x-x8-spx"
GATE = "DRAPartitionableDevices"
NVIDIA = "gpu.nvidia.com"
TEST4 = {"mig-1g-5gb-0": "1g.5gb", "mig-1g-5gb-1": "1g.5gb", "mig-2g-10gb": "2g.10gb", "mig-3g-20gb": "3g.20gb"}
ADMIN_LAYOUT = [("1g.5gb", 2), ("1g.5gb", 3), ("2g.10gb", 0), ("3g.20gb", 4)]  # GPUs 2-3, as the profile says
Obj = dict[str, Any]


def gpu_test4(cluster: Any, container: Obj | None = None) -> None:
    """gpu-test4 applied: its template, then its pods one after the other, each once the scheduler has placed
    or refused the one before. Created at once on a loaded machine, kube-scheduler 1.34.2 once allocated the
    admin's MIG devices to two claims each (kubernetes#133602, fixed after 1.34.2 by kubernetes#136269); the
    plugin refused the second claims' prepare (each device prepared for one claim), and their pods never
    started. ``cluster``: this plane's or k8s-node's (``apply`` and ``json``)."""
    template, *pods = gpu_test4_objects(container)
    cluster.apply([template])
    for one in pods:
        cluster.apply([one])
        name = one["metadata"]["name"]
        wait(lambda: settled(cluster, name), 60)  # noqa: B023 (called within this iteration)


def settled(cluster: Any, name: str) -> bool:
    """The scheduler placed pod ``name`` (default namespace) or said why not (PodScheduled false)."""
    pod = cluster.json("get", "pod", name, "-n", "default")
    conditions = pod.get("status", {}).get("conditions", [])
    return bool(pod["spec"].get("nodeName")) or any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)


def allocated_twice(cluster: Any) -> list[str]:
    """Devices the scheduler allocated to more than one claim of the default namespace, not as shares (no
    ``shareID``, no admin access): what the plugin refuses to prepare for the second claim."""
    holders: dict[str, list[str]] = {}
    for claim in cluster.json("get", "resourceclaims", "-n", "default")["items"]:
        for result in claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", []):
            if not result.get("shareID") and not result.get("adminAccess"):
                holders.setdefault(f"{result['pool']}/{result['device']}", []).append(claim["metadata"]["name"])
    return [f"{device} to {claims}" for device, claims in holders.items() if len(claims) > 1]


def why_not(cluster: Cluster, events: list[Any]) -> str:
    """For a failed check: the prepare errors seen, and any device the scheduler allocated twice."""
    errors = [e["error"][:200] for e in events if e is not None and e["error"]]
    twice = allocated_twice(cluster)
    return (f"; {events.count(None)} never prepared, errors {errors}" if None in events or errors else "") + (
        f"; the scheduler allocated devices twice (kubernetes#133602): {twice}" if twice else "")


def gpu_test4_objects(container: Obj | None = None) -> list[Obj]:
    """gpu-test4's ResourceClaimTemplate, and its Deployment's four replicas as pods (the control planes here
    run no deployment controller), each container (``container``: image and command) using one request."""
    requests = [request(name, "mig.nvidia.com", f"device.attributes['{NVIDIA}'].profile == '{profile}'")
                for name, profile in TEST4.items()]
    template = claim_template("mig-devices", requests, [{"requests": [], "matchAttribute": f"{NVIDIA}/parentUUID"}])
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"test4-{n}", "namespace": "default"},
             "spec": {"terminationGracePeriodSeconds": 30, "restartPolicy": "Never",
                      "resourceClaims": [{"name": "mig-devices", "resourceClaimTemplateName": "mig-devices"}],
                      "containers": [{**(container or {"image": "ubuntu:22.04"}), "name": f"ctr{i}",
                                      "resources": {"claims": [{"name": "mig-devices", "request": request}]}}
                                     for i, request in enumerate(TEST4)]}} for n in range(4)]
    return [template, *pods]


def dynamic_profile() -> Obj:
    """The profile with its simulated NVML keeping its MIG devices in ``mig-state.json`` beside the file."""
    source: Obj = yaml.safe_load((ROOT / "vendors" / "profiles" / f"{PROFILE}.yaml").read_text())
    source["nvidia"]["state_file"] = "mig-state.json"
    return source


def layout(state_file: Path, gpu: int) -> list[tuple[str, int]]:
    """GPU ``gpu``'s MIG devices as the simulated driver holds them in its state file: (profile, first memory
    slice)."""
    gpus = json.loads(state_file.read_text())["gpus"] if state_file.exists() else {}
    return sorted((entry["profile"], entry["start"]) for entry in gpus.get(gpu_uuid(gpu), []))


def gpu_uuid(gpu: int) -> str:
    """The UUID of GPU ``gpu`` of the profile."""
    return f"GPU-5d1a9c2e-7b3f-4e8a-9c6d-0e1f2a3b4c{gpu:02d}"


class MigNode(Node):
    """The drakubelet and plugin of ``dra-mig-dyn``: the profile as a file whose simulated NVML keeps its
    MIG devices in a state file (what the plugin made, read here), probed every half second."""

    def __init__(self, cluster: Cluster, work: Path) -> None:
        super().__init__(cluster, NODE, work, PROFILE, ["nvidia"], plugin_args=["--probe-interval", "0.5s"])
        self.profile = str(self.dir / "node.yaml")
        Path(self.profile).write_text(yaml.safe_dump(dynamic_profile()))
        self.state_file = self.dir / "mig-state.json"

    def configure(self, dynamic: bool) -> None:
        self.config.write_text(json.dumps({"version": "v1", "labeller": {"dra": {"vendors": ["nvidia"],
                                                                                 "dynamicMig": dynamic}}}))

    def _state(self) -> dict[str, list[Obj]]:
        return json.loads(self.state_file.read_text())["gpus"] if self.state_file.exists() else {}

    def layout(self, gpu: int) -> list[tuple[str, int]]:
        return layout(self.state_file, gpu)

    def mig_uuids(self, gpus: range) -> set[str]:
        """The UUIDs of the MIG devices the simulated driver holds on ``gpus``."""
        state = self._state()
        return {ci["uuid"] for gpu in gpus for entry in state.get(gpu_uuid(gpu), []) for ci in entry["cis"]}

    def published_after_start(self) -> float | None:
        """Seconds from the plugin's latest start (its first log line, once Python has loaded it) to its
        first slices written, from its log's timestamps."""
        log = self.log()
        starts = [i for i, e in enumerate(log) if e.get("event") == "metrics server listening"]
        done = next((e for e in log[starts[-1]:] if e.get("event") == "ResourceSlices published"), None) \
            if starts else None
        if done is None:
            return None
        return (stamp(done) - stamp(log[starts[-1]])).total_seconds()


def stamp(line: Obj) -> datetime:
    """When a log line was written (its ISO timestamp)."""
    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00"))


def scheduled(cluster: Cluster) -> dict[str, str]:
    """Pod -> node, for the gpu-test4 pods the scheduler bound."""
    pods = cluster.json("get", "pods")["items"]
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods
            if p["metadata"]["name"].startswith("test4-") and p["spec"].get("nodeName")}


def pending_reason(cluster: Cluster, name: str) -> str:
    events = cluster.json("get", "events", "--field-selector", f"involvedObject.name={name}")["items"]
    return next((e["message"] for e in events if e.get("reason") == "FailedScheduling"), "")


def claim_gpus(spec_files: list[Path]) -> list[set[str]]:
    """Per CDI spec file (one per claim): the GPU device nodes its devices name."""
    found = []
    for path in spec_files:
        devices = json.loads(path.read_text())["devices"]
        found.append({n["path"] for d in devices for n in d["containerEdits"].get("deviceNodes", [])
                      if n["path"].removeprefix("/dev/nvidia").isdigit()})
    return found


def start_plugin(cluster: Cluster, node: MigNode, dynamic: bool, counter_sets: int = 0) -> float | None:
    """The plugin (re)started; seconds from its start until ``counter_sets`` slices with counters and the
    others are there and it is ready."""
    node.stop(node.plugin)
    node.configure(dynamic)
    started = node.start_plugin()

    def published() -> bool:
        slices = cluster.slices(NODE)
        with_counters = [s for s in slices if s["spec"].get("sharedCounters")]
        return bool(slices) and len(with_counters) == counter_sets and node.ready()

    took = wait(published, 60)
    return None if took is None else time.monotonic() - started


def idle_writes(node: Node, probes: int = 6) -> tuple[float, float]:
    """Slice writes during the next ``probes`` probes of the plugin (nothing changing), and the probes seen."""
    writes, before = node.metric("gpu_labeller_dra_slice_writes_total"), node.metric("gpu_labeller_dra_probes_total")
    wait(lambda: node.metric("gpu_labeller_dra_probes_total") >= before + probes, 30)
    return (node.metric("gpu_labeller_dra_slice_writes_total") - writes,
            node.metric("gpu_labeller_dra_probes_total") - before)


def phase_gate_on(cluster: Cluster, node: MigNode) -> None:
    print("1a. gpu-test4 without dynamicMig: only the GPUs an admin split serve it", flush=True)
    check(start_plugin(cluster, node, dynamic=False) is not None, "the plugin publishes the MIG devices that exist")
    mark = node.events.mark()
    gpu_test4(cluster)
    two = wait(lambda: len(scheduled(cluster)) == 2, 60)
    waiting = wait(lambda: all(pending_reason(cluster, f"test4-{n}") for n in range(4)
                               if f"test4-{n}" not in scheduled(cluster)), 60)
    bound = scheduled(cluster)
    reasons = [pending_reason(cluster, f"test4-{n}") for n in range(4) if f"test4-{n}" not in bound]
    check(two is not None and waiting is not None and len(bound) == 2 and len(reasons) == 2 and all(reasons),
          f"2 of 4 fit; the others wait: {[r[:100] for r in reasons]}" + ("" if len(bound) == 2 else
                                                                          f"; bound: {bound}"))
    events = [prepared(node, name, mark) for name in bound]
    ok = all(e is not None and e["error"] == "" for e in events)
    check(ok, "the two are prepared" + ("" if ok else why_not(cluster, events)))

    print("1b. the plugin restarted with dynamicMig", flush=True)
    restarted = time.monotonic()
    took = start_plugin(cluster, node, dynamic=True, counter_sets=4)
    if check(took is not None, "one counter set per empty MIG GPU published, the API server validating them"):
        after = node.published_after_start()
        figure(f"plugin process started -> counter sets of 4 A100s published and /readyz 200 in {took:.2f} s "
               f"(the plugin's first log line to its slices written: {after if after is None else round(after, 2)} s)")
    spec: Obj = next((s["spec"] for s in cluster.slices(NODE) if s["spec"].get("sharedCounters")), {})
    counters = spec.get("sharedCounters", [{}])[0].get("counters", {})
    check(len(spec.get("devices", [])) == 25 and counters.get("memory-slice-7") == {"value": "1"}
          and counters.get("compute-slices") == {"value": "7"},
          f"an empty A100 40GB: 25 devices (every profile at every placement), counters {sorted(counters)[:3]}...")
    four = wait(lambda: len(scheduled(cluster)) == 4, 120)
    check(four is not None, "4 of 4 gpu-test4 pods scheduled")
    events = [prepared(node, f"test4-{n}", mark) for n in range(4)]
    ok = all(e is not None and e["error"] == "" for e in events)
    check(ok, "4 of 4 prepared" + ("" if ok else why_not(cluster, events)))
    if all(events):
        figure(f"plugin restarted with dynamicMig -> the 2 waiting pods' MIG devices made and prepared in "
               f"{max(e['at'] for e in events if e) - restarted:.2f} s")
    made = {gpu: node.layout(gpu) for gpu in range(4, 8)}
    split = [gpu for gpu, layout in made.items() if layout]
    check(len(split) == 2 and all(sorted(p for p, _ in made[gpu]) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
                                  for gpu in split),
          f"the MIG devices of the 2 pods made at prepare on GPUs {split}: {[made[g] for g in split]}")
    per_claim = claim_gpus(node.spec_files())
    wanted = sorted([f"/dev/nvidia{g}"] for g in (2, 3, *split))
    uuids = node.mig_uuids(range(4, 8))
    specs = " ".join(path.read_text() for path in node.spec_files())
    check(sorted(sorted(g) for g in per_claim) == wanted and len(uuids) == 8 and not any(u in specs for u in uuids)
          and specs.count("NVIDIA_VISIBLE_DEVICES=void") == 4,
          f"each claim's CDI spec names its one GPU ({[sorted(g) for g in per_claim]}), the 8 MIG devices made "
          "named by their nodes, not their UUIDs (NVIDIA_VISIBLE_DEVICES=void)")
    check(node.layout(2) == node.layout(3) == ADMIN_LAYOUT, "the admin's MIG devices of GPUs 2-3 are as they were")
    writes, probes = idle_writes(node)
    check(writes == 0 and probes >= 6, f"idle: {writes:.0f} slice writes in {probes:.0f} probes")
    figure(f"slice writes while idle: {writes:.0f} in {probes:.0f} probes (every 0.5 s)")

    print("1c. the pods deleted: the MIG devices made are destroyed", flush=True)
    mark = node.events.mark()
    cluster.kubectl("delete", "pod", *[f"test4-{n}" for n in range(4)], "--grace-period=30", "--wait=false")
    gone = [node.events.wait("unprepare", mark, 90, pod=f"default/test4-{n}") for n in range(4)]
    check(all(e is not None and e["error"] == "" for e in gone), "4 unprepared")
    check(all(node.layout(gpu) == [] for gpu in range(4, 8)), "no MIG device left on GPUs 4-7")
    check(node.layout(2) == node.layout(3) == ADMIN_LAYOUT, "the admin's left alone")
    check(wait(lambda: not node.spec_files() and not node.checkpoints()
               and not list((node.dir / "plugins").glob("*/made/*.json")), 10) is not None,
          "no spec file, checkpoint record or ledger record left")


def phase_amd(cluster: Cluster, work: Path) -> None:
    print("1d. AMD: compute partitions switched at prepare", flush=True)
    node = Node(cluster, AMD_NODE, work, AMD_PROFILE, ["amd"])
    node.config.write_text(json.dumps({"version": "v1", "labeller": {"dra": {"vendors": ["amd"],
                                                                             "dynamicMig": True}}}))
    try:
        node.start_kubelet()
        check(node.events.wait("kubelet_started", 0, 60) is not None, f"{AMD_NODE}: drakubelet started")
        node.start_plugin()
        published = wait(lambda: len([s for s in cluster.slices(AMD_NODE) if s["spec"].get("sharedCounters")]) == 8
                         and node.ready(), 60)
        devices = cluster.devices(AMD_NODE).get("gpu.amd.com", [])
        check(published is not None and len(devices) == 8 * 15,
              f"8 counter sets, {len(devices)} partitions of every mode published and validated")
        mark = node.events.mark()
        cluster.apply([
            claim_template("two-cpx", [request("parts", "gpu.amd.com",
                                               'device.attributes["gpu.amd.com"].partitionProfile == "cpx_nps1"',
                                               count=2)],
                           [{"requests": ["parts"], "matchAttribute": "resource.kubernetes.io/pciBusID"}]),
            pod("cpx-pod", {"parts": "two-cpx"})])
        event = prepared(node, "cpx-pod", mark)
        renders: set[str] = set()
        for path in node.spec_files():
            for device in json.loads(path.read_text())["devices"]:
                renders.update(n["path"] for n in device["containerEdits"].get("deviceNodes", [])
                               if "renderD" in n["path"])
        switched = [e for e in node.log() if e.get("event") == "compute partition mode switched"]
        check(event is not None and event["error"] == "" and len(renders) == 2 and len(switched) == 1
              and switched[0]["mode"] == "cpx", f"two CPX partitions of one GPU prepared, the GPU switched to CPX "
              f"({[s.get('device') for s in switched]}), render nodes {sorted(renders)}")
        gone = delete_pod(cluster, node, "cpx-pod", mark)
        check(gone is not None and gone["error"] == "", "unprepared")
    finally:
        node.stop(node.plugin)
        node.stop(node.kubelet)


def phase_gate_off(cluster: Cluster, node: MigNode) -> None:
    print("2. without the gate: the devices that exist, after one warning", flush=True)
    took = start_plugin(cluster, node, dynamic=True, counter_sets=0)
    check(took is not None, "published without counters")
    said = [e for e in node.log() if e.get("reason") == "feature-gate-off"]
    check(len(said) == 1 and said[0].get("gate") == GATE
          and said[0].get("fields") == ["devices[].consumesCounters", "sharedCounters"],
          f"one line says so: {[(e.get('event'), e.get('fields')) for e in said]}")
    gauge = node.metric("gpu_labeller_dra_feature_gate_off")
    check(gauge == 1, f"gpu_labeller_dra_feature_gate_off{{gate={GATE}}} {gauge:.0f}")
    devices = cluster.devices(NODE).get(NVIDIA, [])
    check(sorted(devices) == sorted(["gpu-0", "gpu-1", *(f"gpu-{g}-mig-{n}" for g in (2, 3) for n in (
        "1g5gb-19-2", "1g5gb-19-3", "2g10gb-14-0", "3g20gb-9-4"))]), f"today's devices: {len(devices)}")
    writes, probes = idle_writes(node)
    check(writes == 0, f"idle: {writes:.0f} slice writes in {probes:.0f} probes (not told again each probe)")
    mark = node.events.mark()
    cluster.apply([
        claim_template("one-3g", [request("mig", "mig.nvidia.com",
                                          'device.attributes["gpu.nvidia.com"].profile == "3g.20gb"')]),
        pod("one-3g-pod", {"mig": "one-3g"})])
    event = prepared(node, "one-3g-pod", mark)
    check(event is not None and event["error"] == "", "a pod asking an existing 3g.20gb is prepared")
    gone = delete_pod(cluster, node, "one-3g-pod", mark)
    check(gone is not None and gone["error"] == "" and all(node.layout(g) == [] for g in range(4, 8)),
          "unprepared; nothing was made")


def run_phase(cluster: Cluster, work: Path, gate: bool) -> None:
    """The plane up with the gate on or off, the phase's scenarios, the plane down and wiped."""
    extra = f"--feature-gates={GATE}=true" if gate else ""
    cluster.env.update({"APISERVER_EXTRA_ARGS": extra, "SCHEDULER_EXTRA_ARGS": extra, "KCM_EXTRA_ARGS": extra})
    node: MigNode | None = None
    try:
        cluster.up()
        cluster.apply(chart_device_classes())
        node = MigNode(cluster, work / ("gate-on" if gate else "gate-off"))
        node.start_kubelet()
        check(node.events.wait("kubelet_started", 0, 60) is not None, f"{NODE}: drakubelet started")
        if gate:
            phase_gate_on(cluster, node)
            phase_amd(cluster, work / "gate-on")
        else:
            phase_gate_off(cluster, node)
    finally:
        if node is not None:
            node.stop(node.plugin)
            node.stop(node.kubelet)
        cluster.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    opened = open_plane(parser, "gld-mig-")
    if opened is None:
        return 2
    _, cluster, work = opened
    began = time.monotonic()
    run_phase(cluster, work, gate=True)
    run_phase(cluster, work, gate=False)
    figure(f"the whole run {time.monotonic() - began:.0f} s")
    return verdict(work)


if __name__ == "__main__":
    sys.exit(main())
