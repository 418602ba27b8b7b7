"""End to end: GPU-memory sharing in DRA (``sharing.memory``, Kubernetes 1.34's consumable capacity) on a
real v1.34 control plane. Not a test.

Run by hand (pytest does not collect ``e2e_*.py``); it needs the shared ``k8s-dra`` folder:

    python tests/e2e/e2e_dra_memory.py [--k8s-dra DIR] [--pods N]

One node, ``mem-t4`` (t4-x4-gpushare: 4 Tesla T4 of 15109 MiB, ``sharing: {memory: {unit: GiB}}``,
NVIDIA served through DRA), a drakubelet and a ``gpu-labeller dra-plugin`` (NVIDIA's tools are the
stand-ins of tests/fakes/bin).

A. The gate on (``DRAConsumableCapacity=true`` on the API server, the scheduler and the
   controller-manager):
   1. the slices the real API server keeps: each GPU ``allowMultipleAllocations`` with a ``memory``
      request policy in GiB; nothing written while idle (the plugin's slice-write counter across probes);
   2. MPS: two claims of a DeviceClass with NVIDIA's MPS GpuConfig, on one GPU, each prepared with its
      share as the MPS client's pinned memory limit, one daemon for both;
   3. two pods whose claims ask 8 GiB of one GPU (a CEL selector on its UUID): the second is never
      prepared beside the first (the scheduler leaves it unallocated; were it allocated, the plugin
      refuses the share, naming what holds the GPU);
   4. ``--pods`` pods (default 36) created at once, each claiming 1-6 GiB (``capacity.requests.memory``):
      the real scheduler places them on a GPU until it is full (kube-scheduler 1.34.2 also wants room
      on the device at the request's index in the candidate's slice, kubernetes#133705, so it fills
      the first GPU only); the pods that do not fit stay Pending with the scheduler's reason; every
      allocated claim is prepared by drakubelet with a CDI device per share (naming its shareID) and
      gpushare's environment (``ALIYUN_COM_GPU_MEM_CONTAINER`` = the GiB allocated); deleting pods frees
      memory the Pending ones then get. Sampled all along: the shares the plugin prepared never pass a
      GPU's memory (0 over-commits on the node); the scheduler's allocations at rest neither, and a
      share it allocates past a GPU's memory while pods come and go (seen once in three runs) is
      refused by the plugin, the pod failed with the reason (counted).
B. The gate off (1.34's default, everywhere): the plugin's first write comes back without the fields,
   it logs one ``reason=feature-gate-off`` line and publishes exclusive GPUs (nothing written after);
   claims asking memory (the API server drops the request) get a whole GPU each, so 4 of 6 pods run.

The control plane runs with ``DRA_STATE`` (default: a folder in the run's temporary folder) and the
ports of ``DRA_API_PORT``, ``DRA_ETCD_PORT``, ``DRA_ETCD_PEER_PORT``, ``DRA_SCHED_PORT`` and
``DRA_KCM_PORT`` when set; ``down.sh --wipe`` at the end.

Prints each check and the figures; exits with 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.model.quantity import parse as parse_quantity  # noqa: E402
from tests.e2e import e2e_dra  # noqa: E402
from tests.e2e.draplane import (Cluster, Node, check, figure, open_plane, verdict, wait)  # noqa: E402
from tests.e2e.e2e_dra import claim_template, pod, request  # noqa: E402

NODE, PROFILE = "mem-t4", "t4-x4-gpushare"
GATE = "DRAConsumableCapacity"
GIB = 1 << 30
CAPACITY = 15843721216  # each T4's memory (NVML), the slice's memory capacity
FAKES = ROOT / "tests" / "fakes" / "bin"
GPU_CLASS = ("gpu.nvidia.com", 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"')
MPS_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
              "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}
Obj = dict[str, Any]


class MemoryNode(Node):
    """The node with memory sharing: its config, NVIDIA's tools' stand-ins and a short MPS root."""

    def __init__(self, cluster: Cluster, work: Path) -> None:
        super().__init__(cluster, NODE, work, PROFILE, ["nvidia"])
        self.config.write_text(json.dumps({"version": "v1", "sharing": {"memory": {"unit": "GiB"}},
                                           "labeller": {"dra": {"vendors": ["nvidia"]}}}))

    def start_plugin(self) -> float:
        self.plugin = self._popen(["--mps-root", str(self.dir / "mps"), "--mps-control",
                                   str(FAKES / "nvidia-cuda-mps-control"), "--nvidia-smi", str(FAKES / "nvidia-smi"),
                                   "--probe-interval", "0.5s"])
        return time.monotonic()

    def _popen(self, extra: list[str]) -> Any:
        import subprocess

        env = {**os.environ, "FAKE_NVIDIA_SMI_LOG": str(self.dir / "nvidia-smi.log"),
               "FAKE_MPS_CONTROL_LOG": str(self.dir / "mps-control.log")}
        return subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "dra-plugin", "--simulate", self.profile,
             "--config", str(self.config), "--node-name", self.name, "--kubeconfig", self.plugin_kubeconfig,
             "--registry-dir", str(self.dir / "reg"), "--plugins-dir", str(self.dir / "plugins"),
             "--cdi-spec-dir", str(self.dir / "cdi"), "--metrics-port", "0", "--metrics-bind", "127.0.0.1", *extra],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(self.dir / "plugin.log").open("a"), text=True, env=env)

    def spec_env(self, cdi_id: str) -> dict[str, str]:
        return cdi_env(self.spec_files(), cdi_id)


def cdi_env(spec_files: Iterable[Path], cdi_id: str) -> dict[str, str]:
    """The environment a container given this CDI device gets from the spec files: the claim's and the
    device's."""
    kind, name = cdi_id.split("=", 1)
    for path in spec_files:
        spec = json.loads(path.read_text())
        for device in spec.get("devices", []):
            if device["name"] == name:
                entries = [*spec["containerEdits"].get("env", []), *device["containerEdits"].get("env", [])]
                return dict(e.split("=", 1) for e in entries)
    return {}


def memory_claim(name: str, gib: int, device_class: str = GPU_CLASS[0], cel: str | None = None) -> Obj:
    template = claim_template(name, [request("gpu", device_class, cel)])
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": f"{gib}Gi"}}
    return template


def claims_of(cluster: Cluster) -> list[Obj]:
    return [c for c in cluster.json("get", "resourceclaims")["items"] if (c.get("status") or {}).get("allocation")]


def usage(cluster: Cluster) -> dict[str, Fraction]:
    """Memory the allocated claims consume on each GPU (device name), as their results say."""
    used: dict[str, Fraction] = Counter()  # type: ignore[assignment]
    for claim in claims_of(cluster):
        for result in claim["status"]["allocation"]["devices"]["results"]:
            used[result["device"]] += parse_quantity((result.get("consumedCapacity") or {}).get("memory", "0")) or 0
    return dict(used)


def over_commits(cluster: Cluster) -> list[str]:
    return [f"{gpu}: {float(used) / GIB:.1f} GiB" for gpu, used in usage(cluster).items() if used > CAPACITY]


def pods(cluster: Cluster, prefix: str) -> list[Obj]:
    return [p for p in cluster.json("get", "pods")["items"] if p["metadata"]["name"].startswith(prefix)]


def unschedulable(cluster: Cluster) -> set[str]:
    events = cluster.json("get", "events")["items"]
    return {e["involvedObject"]["name"] for e in events if e.get("reason") == "FailedScheduling"}


def refused_for_memory(pod_obj: Obj) -> bool:
    """The pod failed because the plugin refused a share that would pass its GPU's memory."""
    return pod_obj["status"].get("phase") == "Failed" and "is prepared for" in pod_obj["status"].get("message", "")


def prepared_usage(checkpoints: Iterable[Path]) -> dict[str, Fraction]:
    """Memory the claims the plugin prepared consume on each GPU, as its checkpoint (records) says."""
    used: dict[str, Fraction] = Counter()  # type: ignore[assignment]
    for path in checkpoints:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being removed
        for device in record["devices"]:
            used[device["device"]] += parse_quantity(device["consumedCapacity"].get("memory", "0")) or 0
    return dict(used)


class Peaks:
    """The most memory allocated (the scheduler's claims) and prepared (the plugin's checkpoint) on each
    GPU, over every sample taken while waiting."""

    def __init__(self, cluster: Cluster, node: MemoryNode) -> None:
        self.cluster, self.node = cluster, node
        self.allocated: dict[str, Fraction] = {}
        self.prepared: dict[str, Fraction] = {}
        self.samples = 0

    def sample(self) -> None:
        prepared = prepared_usage(self.node.checkpoints())
        for peak, now in ((self.allocated, usage(self.cluster)), (self.prepared, prepared)):
            for gpu, used in now.items():
                peak[gpu] = max(peak.get(gpu, Fraction(0)), used)
        self.samples += 1

    def over(self, peak: dict[str, Fraction]) -> list[str]:
        return [f"{gpu}: {float(used) / GIB:.1f} GiB" for gpu, used in sorted(peak.items()) if used > CAPACITY]


def gib(per_gpu: dict[str, Fraction]) -> str:
    return ", ".join(f"{gpu} {float(used) / GIB:.0f} GiB" for gpu, used in sorted(per_gpu.items()))


def settled(cluster: Cluster, prefix: str, peaks: Peaks | None = None) -> bool:
    """Every pod runs, the scheduler said why it cannot place it, or the plugin refused its share."""
    if peaks is not None:
        peaks.sample()
    waiting = unschedulable(cluster)
    return all(p["status"].get("phase") == "Running" or refused_for_memory(p)
               or (not p["spec"].get("nodeName") and p["metadata"]["name"] in waiting) for p in pods(cluster, prefix))


def delete_pods(cluster: Cluster, names: list[str]) -> None:
    if names:
        cluster.kubectl("delete", "pod", *names, "--grace-period=30", "--wait=false")


# --- A: the gate on -----------------------------------------------------------------------------------

def scenario_published(cluster: Cluster, node: MemoryNode) -> None:
    print("A1. the slices the API server keeps, and nothing written while idle", flush=True)
    devices = [d for s in cluster.slices(NODE) for d in s["spec"]["devices"]]
    check(len(devices) == 4 and all(d.get("allowMultipleAllocations") is True for d in devices),
          "each of the 4 GPUs allowMultipleAllocations")
    policies = {json.dumps(d["capacity"]["memory"].get("requestPolicy"), sort_keys=True) for d in devices}
    check(policies == {json.dumps({"default": "14Gi", "validRange": {"max": "14Gi", "min": "1Gi", "step": "1Gi"}},
                                  sort_keys=True)}, f"memory consumed in GiB, at most 14: {sorted(policies)}")
    writes, probes = node.metric("gpu_labeller_dra_slice_writes_total"), node.metric("gpu_labeller_dra_probes_total")
    versions = [s["metadata"]["resourceVersion"] for s in cluster.slices(NODE)]
    assert node.plugin is not None
    node.plugin.send_signal(signal.SIGHUP)  # and the probes every 0.5 s: the same node found again
    wait(lambda: node.metric("gpu_labeller_dra_probes_total") >= probes + 6, 30)
    idle = node.metric("gpu_labeller_dra_slice_writes_total") - writes
    done = node.metric("gpu_labeller_dra_probes_total") - probes
    check(idle == 0 and done >= 6 and [s["metadata"]["resourceVersion"] for s in cluster.slices(NODE)] == versions,
          f"0 slice writes across {done:.0f} probes ({idle:.0f})")
    figure(f"slice writes while idle: {idle:.0f} in {done:.0f} probes")


def scenario_mps(cluster: Cluster, node: MemoryNode) -> None:
    print("A2. MPS: two shares of one GPU under one daemon, each limited to its share", flush=True)
    uuid = next(d["attributes"]["uuid"]["string"] for s in cluster.slices(NODE) for d in s["spec"]["devices"]
                if d["name"] == "gpu-3")
    cluster.apply([
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mps.gpu.nvidia.com"},
         "spec": {"selectors": [{"cel": {"expression": GPU_CLASS[1]}}],
                  "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": MPS_CONFIG}}]}},
        memory_claim("mps-3gi", 3, "mps.gpu.nvidia.com", f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'),
        memory_claim("mps-5gi", 5, "mps.gpu.nvidia.com", f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'),
        pod("mps-a", {"gpu": "mps-3gi"}), pod("mps-b", {"gpu": "mps-5gi"}),
    ])
    since = 0
    for name, mib in (("mps-a", 3072), ("mps-b", 5120)):
        event = e2e_dra.prepared(node, name, since)
        ok = event is not None and event["error"] == ""
        check(ok, f"{name} prepared" + ("" if ok else f": {event and event['error']}"))
        if not ok:
            continue
        assert event is not None
        (cdi_id,) = event["cdi_devices"]
        told = node.spec_env(cdi_id)
        check(told.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == f"0={mib}M" and
              told.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "50" and bool(told.get("CUDA_MPS_PIPE_DIRECTORY")),
              f"{name}: MPS client limited to its share: {told.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}")
    started = [line for line in (node.dir / "mps-control.log").read_text().splitlines() if "START" in line] \
        if (node.dir / "mps-control.log").exists() else []
    check(len(started) == 1 and uuid in started[0], f"one MPS daemon for the GPU's shares: {started}")
    since = node.events.mark()
    delete_pods(cluster, ["mps-a", "mps-b"])
    gone = wait(lambda: all(node.events.find("unprepare", since, pod=f"default/{p}") for p in ("mps-a", "mps-b"))
                and not list((node.dir / "mps").glob("shares-*")), 60)
    check(gone is not None, "both unprepared; the daemon quit after the last share")


def scenario_scheduler_over_commit(cluster: Cluster, node: MemoryNode) -> None:
    print("A3. two 8 GiB claims pinned to one GPU: never both prepared", flush=True)
    uuid = next(d["attributes"]["uuid"]["string"] for s in cluster.slices(NODE) for d in s["spec"]["devices"]
                if d["name"] == "gpu-2")
    pinned = f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'
    since = node.events.mark()
    cluster.apply([memory_claim("pin-8gi", 8, cel=pinned), pod("pin-a", {"gpu": "pin-8gi"})])
    first = e2e_dra.prepared(node, "pin-a", since)
    check(first is not None and first["error"] == "", "the first is prepared")
    cluster.apply([pod("pin-b", {"gpu": "pin-8gi"})])
    wait(lambda: results_of(cluster, "pin-b") or "pin-b" in unschedulable(cluster), 60)
    if not results_of(cluster, "pin-b"):
        reasons = [e["message"] for e in cluster.json("get", "events")["items"]
                   if e.get("reason") == "FailedScheduling" and e["involvedObject"]["name"] == "pin-b"]
        check(bool(reasons), f"the scheduler leaves the second unallocated: {reasons[:1]}")
    else:
        over = sum(parse_quantity(r["consumedCapacity"]["memory"]) or 0 for c in claims_of(cluster)
                   for r in c["status"]["allocation"]["devices"]["results"] if r["device"] == "gpu-2")
        figure(f"kube-scheduler allocated {float(over) / GIB:.0f} GiB of gpu-2's 14.75")
        refused = node.events.wait("prepare", since, 60, pod="default/pin-b")
        error = (refused or {}).get("error", "")
        check("8Gi of its memory asked, but 8Gi of its 15472384Ki is prepared for 1 other claim(s)" in error,
              f"the plugin refuses the share that would pass gpu-2's memory: {error[-160:]}")
    delete_pods(cluster, ["pin-a", "pin-b"])
    check(wait(lambda: not pods(cluster, "pin-") and not node.checkpoints(), 60) is not None, "both gone")


def results_of(cluster: Cluster, pod_name: str) -> list[Obj]:
    return [r for c in claims_of(cluster) if any(u.get("name") == pod_name for u in c["status"].get("reservedFor", []))
            for r in c["status"]["allocation"]["devices"]["results"]]


def scenario_many_claims(cluster: Cluster, node: MemoryNode, count: int) -> None:
    print(f"A4. {count} pods at once, each claiming 1-6 GiB: on a GPU until it is full, never past its memory",
          flush=True)
    sizes = {f"mem-{i:02d}": 1 + i % 6 for i in range(count)}
    cluster.apply([memory_claim(f"mem-{gib}gi", gib) for gib in range(1, 7)])
    since = node.events.mark()
    peaks = Peaks(cluster, node)
    cluster.apply([pod(name, {"gpu": f"mem-{gib}gi"}) for name, gib in sizes.items()])
    took = wait(lambda: settled(cluster, "mem-", peaks), 240, step=0.5)
    check(took is not None, "every pod Running or Pending with the scheduler's reason")
    running = [p["metadata"]["name"] for p in pods(cluster, "mem-") if p["status"].get("phase") == "Running"]
    used = usage(cluster)
    figure(f"{len(running)} of {count} pods Running ({sum(sizes[n] for n in running)} of {sum(sizes.values())} GiB "
           f"asked) {took or 0:.1f} s after creation; per GPU: {gib(used)}")
    check(over_commits(cluster) == [], f"0 over-commits: {over_commits(cluster)}")
    first = used.get("gpu-0", Fraction(0))
    check(first >= 12 * GIB, f"claims land on a GPU until it is full: gpu-0 holds {float(first) / GIB:.0f} of 14 GiB")
    if len(used) == 1:
        figure("only gpu-0 was used: kube-scheduler 1.34.2 also wants room for the claim on the device at the "
               "request's index in the candidate's slice, gpu-0 (kubernetes#133705, fixed in 1.35 by "
               "kubernetes#133706)")
    check_prepared(node, sizes, running, since)
    waiting = [p["metadata"]["name"] for p in pods(cluster, "mem-") if not p["spec"].get("nodeName")]
    reasons = [e["message"] for e in cluster.json("get", "events")["items"]
               if e.get("reason") == "FailedScheduling" and e["involvedObject"]["name"] in waiting]
    check(bool(waiting) and bool(reasons) and all("cannot allocate all claims" in r for r in reasons),
          f"{len(waiting)} pods Pending: {reasons[0] if reasons else 'no reason'}")
    # free memory: the scheduler gives it to pods that waited, again within each GPU's memory
    freed = running[:6]
    since = node.events.mark()
    began = time.monotonic()
    delete_pods(cluster, freed)
    more = wait(lambda: len([p for p in pods(cluster, "mem-") if p["status"].get("phase") == "Running"])
                > len(running) - len(freed) and settled(cluster, "mem-", peaks), 180, step=0.5)
    now_running = [p["metadata"]["name"] for p in pods(cluster, "mem-") if p["status"].get("phase") == "Running"]
    check(more is not None and bool(set(now_running) & set(waiting)), f"pods that waited got the freed memory "
          f"({len(set(now_running) & set(waiting))} of them)")
    figure(f"6 pods deleted -> waiting pods Running in {time.monotonic() - began:.1f} s")
    check(over_commits(cluster) == [], f"still 0 over-commits at rest: {over_commits(cluster)}")
    check_prepared(node, sizes, sorted(set(now_running) & set(waiting)), since)
    refused = [p["metadata"]["name"] for p in pods(cluster, "mem-") if refused_for_memory(p)]
    check(peaks.over(peaks.prepared) == [], f"0 over-commits on the node: the prepared shares never passed a GPU's "
          f"memory in {peaks.samples} samples (peak: {gib(peaks.prepared)})")
    figure(f"kube-scheduler's allocations peaked at {gib(peaks.allocated)} (a GPU holds 14.75 GiB); shares the "
           f"plugin refused because they would pass it: {len(refused)} {refused}")
    delete_pods(cluster, [p["metadata"]["name"] for p in pods(cluster, "mem-")])
    check(wait(lambda: not pods(cluster, "mem-") and not node.checkpoints(), 180, step=0.5) is not None,
          "all pods gone, every claim unprepared")


def check_prepared(node: MemoryNode, sizes: dict[str, int], names: list[str], since: int) -> None:
    """Each pod's claim prepared with one CDI device naming its share and gpushare's environment."""
    wrong = []
    for name in names:
        event = node.events.find("prepare", since, pod=f"default/{name}") or node.events.find(
            "prepare", 0, pod=f"default/{name}")
        ids = (event or {}).get("cdi_devices") or []
        told = node.spec_env(ids[0]) if len(ids) == 1 else {}
        share = re.fullmatch(r"k8s\.gpu-labeller\.io/gpu=[0-9a-f-]{36}-gpu-\d-[0-9a-f-]{36}", ids[0]) if ids else None
        if not event or event["error"] or share is None or told.get("ALIYUN_COM_GPU_MEM_CONTAINER") != str(sizes[name]):
            wrong.append(f"{name}: {ids} {told.get('ALIYUN_COM_GPU_MEM_CONTAINER')} {event and event['error']}")
    check(not wrong, f"{len(names)} pods prepared, each a CDI device per share and its GiB in "
          f"ALIYUN_COM_GPU_MEM_CONTAINER{': ' + '; '.join(wrong[:3]) if wrong else ''}")


# --- B: the gate off ----------------------------------------------------------------------------------

def scenario_gate_off(cluster: Cluster, node: MemoryNode) -> None:
    print("B. DRAConsumableCapacity off: one line, exclusive GPUs, claims asking memory get whole GPUs", flush=True)
    said = [e for e in node.log() if e.get("reason") == "feature-gate-off"]
    check(len(said) == 1 and said[0].get("gate") == GATE, f"one line says so: {[e.get('event') for e in said]}")
    devices = [d for s in cluster.slices(NODE) for d in s["spec"]["devices"]]
    check(len(devices) == 4 and not any("allowMultipleAllocations" in d or "requestPolicy" in d["capacity"]["memory"]
                                        for d in devices), "the 4 GPUs published as today (exclusive)")
    probes = node.metric("gpu_labeller_dra_probes_total")
    wait(lambda: node.metric("gpu_labeller_dra_probes_total") >= probes + 4, 30)
    writes = node.metric("gpu_labeller_dra_slice_writes_total")
    check(writes == 1 and node.metric("gpu_labeller_dra_feature_gate_off") == 1,
          f"one slice write at start (the one that told), none in the probes after ({writes:.0f}); the gate's "
          "metric says it is off")
    cluster.apply([memory_claim("off-2gi", 2), *(pod(f"off-{i}", {"gpu": "off-2gi"}) for i in range(6))])
    check(wait(lambda: settled(cluster, "off-"), 120, step=0.5) is not None, "every pod Running or Pending")
    running = [p for p in pods(cluster, "off-") if p["status"].get("phase") == "Running"]
    claims = claims_of(cluster)
    whole = all("shareID" not in r and "consumedCapacity" not in r for c in claims
                for r in c["status"]["allocation"]["devices"]["results"])
    check(len(running) == 4 and whole, f"{len(running)} of 6 pods Running, each with a whole GPU")
    figure(f"gate off: {len(running)} of 6 two-GiB pods placed (one per GPU)")
    delete_pods(cluster, [p["metadata"]["name"] for p in pods(cluster, "off-")])
    check(wait(lambda: not pods(cluster, "off-") and not node.checkpoints(), 120, step=0.5) is not None,
          "all pods gone, every claim unprepared")


def start(cluster: Cluster, work: Path, gates: bool) -> MemoryNode:
    extra = f"--feature-gates={GATE}=true" if gates else ""
    cluster.env.update({"APISERVER_EXTRA_ARGS": extra, "SCHEDULER_EXTRA_ARGS": extra, "KCM_EXTRA_ARGS": extra})
    cluster.up()
    name, expression = GPU_CLASS
    cluster.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                    "spec": {"selectors": [{"cel": {"expression": expression}}]}}])
    node = MemoryNode(cluster, work / ("gate-on" if gates else "gate-off"))
    node.start_kubelet()
    check(node.events.wait("kubelet_started", 0, 60) is not None, "drakubelet started")
    began = node.start_plugin()
    registered = node.events.wait("plugin_registered", 0, 60)
    published = wait(lambda: node.ready(), 60)
    check(registered is not None and published is not None, f"{NODE}: registered and published")
    figure(f"gate {'on' if gates else 'off'}: plugin start -> ready in {time.monotonic() - began:.2f} s")
    return node


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=36)
    opened = open_plane(parser, "glm-")
    if opened is None:
        return 2
    args, cluster, work = opened
    node: MemoryNode | None = None
    try:
        node = start(cluster, work, gates=True)
        scenario_published(cluster, node)
        scenario_mps(cluster, node)
        scenario_scheduler_over_commit(cluster, node)
        scenario_many_claims(cluster, node, args.pods)
        node.stop(node.plugin)
        node.stop(node.kubelet)
        cluster.down()
        node = start(cluster, work, gates=False)
        scenario_gate_off(cluster, node)
    finally:
        if node is not None:
            node.stop(node.plugin)
            node.stop(node.kubelet)
        cluster.down()
    return verdict(work)


if __name__ == "__main__":
    sys.exit(main())
