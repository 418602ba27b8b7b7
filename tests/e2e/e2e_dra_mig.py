"""End to end: MIG devices made at prepare (``labeller.dra.dynamicMig``) on a real Kubernetes v1.34
control plane with DRA. Not a test.

Run by hand (pytest does not collect ``e2e_*.py``); it needs the shared ``k8s-dra`` folder:

    python tests/e2e/e2e_dra_mig.py [--k8s-dra DIR]

One node, ``dra-mig-dyn``: a drakubelet and ``gpu-labeller dra-plugin`` on the ``dgx-a100-mig-dynamic``
profile (A100 40GB: GPUs 0-1 whole, 2-3 split 3g+2g+1g+1g by an admin, 4-7 MIG enabled and empty),
its simulated NVML keeping its MIG devices in a state file, which this script reads to see what the
plugin made. The DeviceClasses are the chart's. NVIDIA's gpu-test4 (demo/specs/quickstart/v1): four
pods, each asking 1g.5gb twice, 2g.10gb and 3g.20gb of one GPU (``matchAttribute: parentUUID``).

1. With DRAPartitionableDevices on the API server, scheduler and controller manager:
   a. the plugin without dynamicMig: 2 of the 4 pods fit (on GPUs 2-3, whose MIG devices exist), the
      other two stay Pending with the scheduler's reason;
   b. the plugin restarted with dynamicMig: it publishes one counter set per empty MIG GPU (the real
      API server validates them), the Pending pods are scheduled onto those GPUs, and their MIG
      devices are made at prepare (the simulated driver holds them; each claim's CDI spec names its
      MIG devices' UUIDs): 4 of 4;
   c. the pods deleted: unprepared, the MIG devices made destroyed, the admin's left alone.
   d. AMD: a node on ``mi300x-x8-spx`` (8 MI300X in SPX, NPS1) with dynamicMig publishes a counter set
      per GPU and its partitions of every mode (the real API server validates them); a pod asking two
      CPX partitions of one GPU is scheduled, and prepare switches that GPU to CPX: the claim's CDI
      spec names two render nodes.
2. The control plane again without the gate: the plugin with dynamicMig publishes the devices that
   exist, as without it, after one warning line saying the API server dropped the counters; a pod
   asking an existing MIG device is still served.

The control plane runs with ``DRA_STATE`` (default: a folder in the run's temporary folder) and the
ports of ``DRA_API_PORT``, ``DRA_ETCD_PORT``, ``DRA_ETCD_PEER_PORT``, ``DRA_SCHED_PORT`` and
``DRA_KCM_PORT`` when set (``up.sh`` reads them), and is stopped with ``down.sh --wipe`` at the end.

Prints each check and the figures; exits with 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e import e2e_dra  # noqa: E402
from tests.e2e.e2e_dra import DEVICE_CLASSES, Cluster, Node, check, figure, results, wait  # noqa: E402

NODE = "dra-mig-dyn"
PROFILE = "dgx-a100-mig-dynamic"
GATE = "DRAPartitionableDevices"
NVIDIA = "gpu.nvidia.com"
TEST4 = {"mig-1g-5gb-0": "1g.5gb", "mig-1g-5gb-1": "1g.5gb", "mig-2g-10gb": "2g.10gb", "mig-3g-20gb": "3g.20gb"}


def gpu_test4(cluster: Cluster) -> None:
    """gpu-test4's ResourceClaimTemplate, and its Deployment's four replicas as pods (this control plane
    runs no deployment controller), each container using one request."""
    requests = [{"name": name, "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [
        {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"}}]}}
        for name, profile in TEST4.items()]
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "mig-devices", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": requests, "constraints": [
                    {"requests": [], "matchAttribute": "gpu.nvidia.com/parentUUID"}]}}}}
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"test4-{n}", "namespace": "default"},
             "spec": {"terminationGracePeriodSeconds": 30, "restartPolicy": "Never",
                      "resourceClaims": [{"name": "mig-devices", "resourceClaimTemplateName": "mig-devices"}],
                      "containers": [{"name": f"ctr{i}", "image": "ubuntu:22.04",
                                      "resources": {"claims": [{"name": "mig-devices", "request": request}]}}
                                     for i, request in enumerate(TEST4)]}} for n in range(4)]
    cluster.apply([template, *pods])


def gpu_uuid(gpu: int) -> str:
    """The UUID of GPU ``gpu`` of the profile."""
    return f"GPU-5d1a9c2e-7b3f-4e8a-9c6d-0e1f2a3b4c{gpu:02d}"


class MigNode(Node):
    """The drakubelet and plugin of ``dra-mig-dyn``: the profile as a file, its MIG devices in a state file."""

    def __init__(self, cluster: Cluster, work: Path) -> None:
        e2e_dra.NODES[NODE] = (PROFILE, ["nvidia"])
        super().__init__(cluster, NODE, work)
        source = yaml.safe_load((ROOT / "vendors" / "profiles" / f"{PROFILE}.yaml").read_text())
        source["nvidia"]["state_file"] = "mig-state.json"
        self.profile = str(self.dir / "node.yaml")
        Path(self.profile).write_text(yaml.safe_dump(source))
        self.state_file = self.dir / "mig-state.json"

    def configure(self, dynamic: bool) -> None:
        self.config.write_text(json.dumps({"version": "v1", "labeller": {"dra": {"vendors": ["nvidia"],
                                                                                 "dynamicMig": dynamic}}}))

    def layout(self, gpu: int) -> list[tuple[str, int]]:
        """The GPU's MIG devices as the simulated driver holds them: (profile, first memory slice)."""
        if not self.state_file.exists():
            return []
        state = json.loads(self.state_file.read_text())["gpus"]
        return sorted((entry["profile"], entry["start"]) for entry in state.get(gpu_uuid(gpu), []))

    def mig_uuids(self, gpus: range) -> set[str]:
        """The UUIDs of the MIG devices the simulated driver holds on ``gpus``."""
        if not self.state_file.exists():
            return set()
        state = json.loads(self.state_file.read_text())["gpus"]
        return {ci["uuid"] for gpu in gpus for entry in state.get(gpu_uuid(gpu), []) for ci in entry["cis"]}

    def published_after_start(self) -> float | None:
        """Seconds from the plugin's latest start (its first log line, once Python has loaded it) to its
        first slices written, from its log's timestamps."""
        log = self.log()
        starts = [i for i, e in enumerate(log) if e.get("event") == "metrics server listening"]
        if not starts:
            return None
        first = log[starts[-1]]
        done = next((e for e in log[starts[-1]:] if e.get("event") == "ResourceSlices published"), None)
        if done is None:
            return None
        stamp = lambda e: datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))  # noqa: E731
        return (stamp(done) - stamp(first)).total_seconds()


def scheduled(cluster: Cluster) -> dict[str, str]:
    """Pod -> node, for the gpu-test4 pods the scheduler bound."""
    pods = cluster.json("get", "pods")["items"]
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods
            if p["metadata"]["name"].startswith("test4-") and p["spec"].get("nodeName")}


def pending_reason(cluster: Cluster, pod: str) -> str:
    events = cluster.json("get", "events", "--field-selector", f"involvedObject.name={pod}")["items"]
    return next((e["message"] for e in events if e.get("reason") == "FailedScheduling"), "")


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


def phase_gate_on(cluster: Cluster, node: MigNode) -> None:
    print("1a. gpu-test4 without dynamicMig: only the GPUs an admin split serve it", flush=True)
    check(start_plugin(cluster, node, dynamic=False) is not None, "the plugin publishes the MIG devices that exist")
    mark = node.events.mark()
    gpu_test4(cluster)
    two = wait(lambda: len(scheduled(cluster)) == 2, 60)
    wait(lambda: all(pending_reason(cluster, f"test4-{n}") for n in range(4) if f"test4-{n}" not in scheduled(cluster)),
         60)
    time.sleep(3)  # the scheduler's retries: still two, not more
    bound = scheduled(cluster)
    reasons = [pending_reason(cluster, f"test4-{n}") for n in range(4) if f"test4-{n}" not in bound]
    check(two is not None and len(bound) == 2 and all(reasons),
          f"2 of 4 fit; the others wait: {[r[:100] for r in reasons]}")
    prepared = [node.events.wait("prepare", mark, 60, pod=f"default/{p}") for p in bound]
    check(all(e is not None and e["error"] == "" for e in prepared), "the two are prepared")

    print("1b. the plugin restarted with dynamicMig", flush=True)
    took = start_plugin(cluster, node, dynamic=True, counter_sets=4)
    if check(took is not None, "one counter set per empty MIG GPU published, the API server validating them"):
        figure(f"plugin process started -> counter sets of 4 A100s published and /readyz 200 in {took:.2f} s "
               f"(of which Python's start and imports: the plugin's first log line to its slices written took "
               f"{node.published_after_start():.2f} s)")
    spec = next(s["spec"] for s in cluster.slices(NODE) if s["spec"].get("sharedCounters"))
    counters = spec["sharedCounters"][0]["counters"]
    check(len(spec["devices"]) == 25 and counters.get("memory-slice-7") == {"value": "1"}
          and counters.get("compute-slices") == {"value": "7"},
          f"an empty A100 40GB: 25 devices (every profile at every placement), counters {sorted(counters)[:3]}...")
    began = time.monotonic()
    four = wait(lambda: len(scheduled(cluster)) == 4, 120)
    check(four is not None, "4 of 4 gpu-test4 pods scheduled")
    prepared = [node.events.wait("prepare", mark, 90, pod=f"default/test4-{n}") for n in range(4)]
    check(all(e is not None and e["error"] == "" for e in prepared), "4 of 4 prepared")
    if four is not None:
        figure(f"dynamicMig published -> the 2 waiting pods bound in {four:.2f} s, prepared "
               f"{max(e['at'] for e in prepared if e) - began:.2f} s after")
    made = {gpu: node.layout(gpu) for gpu in range(4, 8)}
    split = [gpu for gpu, layout in made.items() if layout]
    check(len(split) == 2 and all(made[gpu] == [("1g.5gb", 0), ("1g.5gb", 1), ("2g.10gb", 2), ("3g.20gb", 4)]
                                   or sorted(p for p, _ in made[gpu]) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
                                   for gpu in split),
          f"the MIG devices of the 2 pods made at prepare on GPUs {split}: {[made[g] for g in split]}")
    named = set()
    for path in node.spec_files():
        for entry in json.loads(path.read_text())["containerEdits"].get("env", []):
            if entry.startswith("NVIDIA_VISIBLE_DEVICES="):
                named.update(entry.split("=", 1)[1].split(","))
    made_uuids = node.mig_uuids(range(4, 8))
    check(len(made_uuids) == 8 and made_uuids <= named, "the claims' CDI specs name the 8 MIG devices made")
    check(node.layout(2) == node.layout(3) == [("1g.5gb", 2), ("1g.5gb", 3), ("2g.10gb", 0), ("3g.20gb", 4)],
          "the admin's MIG devices of GPUs 2-3 are as they were")

    print("1c. the pods deleted: the MIG devices made are destroyed", flush=True)
    mark = node.events.mark()
    cluster.kubectl("delete", "pod", *[f"test4-{n}" for n in range(4)], "--grace-period=30", "--wait=false")
    gone = [node.events.wait("unprepare", mark, 90, pod=f"default/test4-{n}") for n in range(4)]
    check(all(e is not None and e["error"] == "" for e in gone), "4 unprepared")
    check(all(node.layout(gpu) == [] for gpu in range(4, 8)), "no MIG device left on GPUs 4-7")
    check(node.layout(2) != [] and node.layout(3) != [], "the admin's left alone")
    check(wait(lambda: not node.spec_files() and not node.checkpoints()
               and not list((node.dir / "plugins").glob("*/made/*.json")), 10) is not None,
          "no spec file, checkpoint record or ledger record left")


class AmdNode(Node):
    """``dra-amd-dyn``: 8 MI300X in SPX, served through DRA with dynamicMig."""

    def __init__(self, cluster: Cluster, work: Path) -> None:
        e2e_dra.NODES["dra-amd-dyn"] = ("mi300x-x8-spx", ["amd"])
        super().__init__(cluster, "dra-amd-dyn", work)
        self.config.write_text(json.dumps({"version": "v1", "labeller": {"dra": {"vendors": ["amd"],
                                                                                 "dynamicMig": True}}}))


def phase_amd(cluster: Cluster, work: Path) -> None:
    print("1d. AMD: compute partitions switched at prepare", flush=True)
    node = AmdNode(cluster, work / "gate-on")
    try:
        node.start_kubelet()
        node.events.wait("kubelet_started", 0, 60)
        node.start_plugin()
        published = wait(lambda: len([s for s in cluster.slices(node.name) if s["spec"].get("sharedCounters")]) == 8
                         and node.ready(), 60)
        devices = cluster.devices(node.name).get("gpu.amd.com", [])
        check(published is not None and len(devices) == 8 * 15,
              f"8 counter sets, {len(devices)} partitions of every mode published and validated")
        mark = node.events.mark()
        cluster.apply([
            e2e_dra.claim_template("two-cpx", [e2e_dra.request("parts", "gpu.amd.com",
                'device.attributes["gpu.amd.com"].partitionProfile == "cpx_nps1"', count=2)],
                [{"requests": ["parts"], "matchAttribute": "resource.kubernetes.io/pciBusID"}]),
            e2e_dra.pod("cpx-pod", {"parts": "two-cpx"})])
        event = e2e_dra.prepared(node, "cpx-pod", mark)
        renders = set()
        for path in node.spec_files():
            for device in json.loads(path.read_text())["devices"]:
                renders.update(n["path"] for n in device["containerEdits"].get("deviceNodes", [])
                               if "renderD" in n["path"])
        switched = [e for e in node.log() if e.get("event") == "compute partition mode switched"]
        check(event is not None and event["error"] == "" and len(renders) == 2 and len(switched) == 1
              and switched[0]["mode"] == "cpx", f"two CPX partitions of one GPU prepared, the GPU switched to CPX "
              f"({[s.get('device') for s in switched]}), render nodes {sorted(renders)}")
        gone = e2e_dra.delete_pod(cluster, node, "cpx-pod", mark)
        check(gone is not None and gone["error"] == "", "unprepared")
    finally:
        node.stop(node.plugin)
        node.stop(node.kubelet)


def phase_gate_off(cluster: Cluster, node: MigNode) -> None:
    print("2. without the gate: the devices that exist, after one warning", flush=True)
    took = start_plugin(cluster, node, dynamic=True, counter_sets=0)
    check(took is not None, "published without counters")
    warned = [e for e in node.log() if e.get("reason") == "counters-dropped"]
    check(len(warned) == 1 and GATE in warned[0]["event"], f"one warning: {[w['event'][:90] for w in warned]}")
    devices = cluster.devices(NODE).get(NVIDIA, [])
    check(sorted(devices) == sorted(["gpu-0", "gpu-1", *(f"gpu-{g}-mig-{n}" for g in (2, 3) for n in (
        "1g5gb-19-2", "1g5gb-19-3", "2g10gb-14-0", "3g20gb-9-4"))]), f"today's devices: {len(devices)}")
    mark = node.events.mark()
    cluster.apply([
        e2e_dra.claim_template("one-3g", [e2e_dra.request("mig", "mig.nvidia.com",
            'device.attributes["gpu.nvidia.com"].profile == "3g.20gb"')]),
        e2e_dra.pod("one-3g-pod", {"mig": "one-3g"})])
    event = e2e_dra.prepared(node, "one-3g-pod", mark)
    check(event is not None and event["error"] == "", "a pod asking an existing 3g.20gb is prepared")
    gone = e2e_dra.delete_pod(cluster, node, "one-3g-pod", mark)
    check(gone is not None and gone["error"] == "" and all(node.layout(g) == [] for g in range(4, 8)),
          "unprepared; nothing was made")


def run_phase(k8s_dra: Path, work: Path, state: Path, gate: bool) -> None:
    cluster = Cluster(k8s_dra, state)
    if gate:
        for key in ("APISERVER_EXTRA_ARGS", "SCHEDULER_EXTRA_ARGS", "KCM_EXTRA_ARGS"):
            cluster.env[key] = f"--feature-gates={GATE}=true"
    node: MigNode | None = None
    try:
        cluster.up()
        cluster.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                        "spec": {"selectors": [{"cel": {"expression": cel}}]}} for name, cel in DEVICE_CLASSES])
        node = MigNode(cluster, work / ("gate-on" if gate else "gate-off"))
        node.start_kubelet()
        check(node.events.wait("kubelet_started", 0, 60) is not None, "drakubelet started")
        if gate:
            phase_gate_on(cluster, node)
            phase_amd(cluster, work)
        else:
            phase_gate_off(cluster, node)
    finally:
        if node is not None:
            node.stop(node.plugin)
            node.stop(node.kubelet)
        cluster.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s-dra", type=Path, default=ROOT.parent / "shared" / "k8s-dra")
    args = parser.parse_args()
    if not (args.k8s_dra / "up.sh").exists():
        print(f"SKIP: no k8s-dra folder at {args.k8s_dra} (give --k8s-dra DIR)")
        return 0
    work = Path(tempfile.mkdtemp(prefix="gld-mig-", dir="/tmp"))
    state = Path(os.environ.get("DRA_STATE") or work / "state")
    run_phase(args.k8s_dra, work, state, gate=True)
    run_phase(args.k8s_dra, work, state, gate=False)
    failed = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed)} checks passed, {len(failed)} failed; logs in {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
