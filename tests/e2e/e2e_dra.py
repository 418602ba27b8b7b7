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
3. MIG: ``profile == "1g.5gb"`` gets a MIG device of dra-mig. AMD: two partitions of one GPU through
   ``matchAttribute: resource.kubernetes.io/pciBusID`` on dra-amd. Mixed node: both drivers publish,
   a pod with an NVIDIA claim and an AMD claim gets each from its driver.
4. Faults on dra-h100: drakubelet restarted (registered again, prepared claims still known: the pod's
   unprepare after the restart succeeds); the plugin SIGKILLed between prepare and unprepare (the
   unprepare after its restart succeeds, nothing leaks); the API server restarted (the slices are
   there and right once it answers).

Prints each check and the figures; exits with 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.e2e_plugin import JsonLines as PluginJsonLines  # noqa: E402
from tests.e2e.e2e_plugin import named  # noqa: E402

Event = dict[str, Any]
results: list[tuple[bool, str]] = []
figures: list[str] = []

NODES = {  # node -> (profile, vendors served through DRA)
    "dra-h100": ("dgx-h100", ["nvidia"]),
    "dra-mig": ("dgx-a100-mig-mixed", ["nvidia"]),
    "dra-amd": ("mi300x-x8-cpx", ["amd"]),
    "dra-mixed": ("mixed-l40s-mi210", ["nvidia", "amd"]),
}
DEVICE_CLASSES = [
    ("gpu.nvidia.com", 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"'),
    ("mig.nvidia.com", 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"'),
    ("gpu.amd.com", 'device.driver == "gpu.amd.com"'),
]


def check(ok: bool, what: str) -> bool:
    results.append((ok, what))
    print(f"  {'PASS' if ok else 'FAIL'}  {what}", flush=True)
    return ok


def figure(text: str) -> None:
    figures.append(text)
    print(f"  figure: {text}", flush=True)


def wait(predicate: Callable[[], Any], timeout: float = 60, step: float = 0.05) -> float | None:
    """Seconds until ``predicate()`` held, or None after ``timeout``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if predicate():
                return time.monotonic() - began
        except (subprocess.CalledProcessError, ValueError, KeyError):
            pass
        time.sleep(step)
    return None


class JsonLines(PluginJsonLines):
    """drakubelet's events (e2e_plugin's reader), looked up by name: None rather than an error when absent."""

    def find(self, name: str, since: int = 0, **fields: Any) -> Event | None:
        return next((e for e in self.since(since) if named(name, **fields)(e)), None)

    def wait(self, name: str, since: int = 0, timeout: float = 60, **fields: Any) -> Event | None:  # type: ignore[override]
        try:
            return super().wait(named(name, **fields), since, timeout)
        except TimeoutError:
            return None


class Cluster:
    def __init__(self, k8s_dra: Path, state: Path) -> None:
        self.k8s_dra, self.state = k8s_dra, state
        self.env = {**os.environ, "DRA_STATE": str(state)}
        self.kubectl_bin = str(k8s_dra.parent / "k8s" / "bin" / "kubectl")

    def up(self) -> None:
        subprocess.run([str(self.k8s_dra / "up.sh")], env=self.env, check=True, stdout=subprocess.DEVNULL)
        values = dict(line.removeprefix("export ").split("=", 1)
                      for line in (self.state / "env").read_text().splitlines()
                      if "=" in line and not line.startswith("#"))
        self.kubeconfig = values.get("KUBECONFIG", str(self.state / "kubeconfig")).strip("'\"")
        self.bin = Path(values.get("DRA_BIN", "/tmp/gpu-labeller-dra-bin").strip("'\""))

    def down(self) -> None:
        subprocess.run([str(self.k8s_dra / "down.sh"), "--wipe"], env=self.env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return subprocess.run([self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args], input=stdin, text=True,
                              capture_output=True, check=check).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def slices(self, node: str) -> list[dict[str, Any]]:
        items = self.json("get", "resourceslices")["items"]
        return [s for s in items if s["spec"].get("nodeName") == node]

    def devices(self, node: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for s in self.slices(node):
            found.setdefault(s["spec"]["driver"], []).extend(d["name"] for d in s["spec"].get("devices", []))
        return found


class Node:
    """One drakubelet and one dra-plugin for ``name``."""

    def __init__(self, cluster: Cluster, name: str, work: Path) -> None:
        self.cluster, self.name = cluster, name
        self.profile, vendors = NODES[name]
        self.dir = work / name
        for sub in ("reg", "plugins", "cdi", "state"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "config.yaml"
        self.config.write_text(json.dumps({"version": "v1", "labeller": {"dra": {"vendors": vendors}}}))
        self.kubelet: subprocess.Popen[str] | None = None
        self.plugin: subprocess.Popen[str] | None = None

    def start_kubelet(self) -> int:
        self.kubelet = subprocess.Popen(
            [str(self.cluster.bin / "drakubelet"), "--node-name", self.name, "--kubeconfig", self.cluster.kubeconfig,
             "--registry-dir", str(self.dir / "reg"), "--plugins-dir", str(self.dir / "plugins"),
             "--state-dir", str(self.dir / "state"), "--prepare-retry", "20s"],
            stdout=subprocess.PIPE, stderr=(self.dir / "drakubelet.err").open("a"), text=True)
        assert self.kubelet.stdout is not None
        self.events = JsonLines(self.kubelet.stdout, self.dir / "drakubelet.jsonl")
        return 0

    def start_plugin(self) -> float:
        self.plugin = subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "dra-plugin", "--simulate", self.profile,
             "--config", str(self.config), "--node-name", self.name, "--kubeconfig", self.cluster.kubeconfig,
             "--registry-dir", str(self.dir / "reg"), "--plugins-dir", str(self.dir / "plugins"),
             "--cdi-spec-dir", str(self.dir / "cdi"), "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(self.dir / "plugin.log").open("a"), text=True)
        return time.monotonic()

    def stop(self, process: subprocess.Popen[str] | None, signum: int = signal.SIGTERM) -> None:
        if process is not None and process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def spec_files(self) -> list[Path]:
        return sorted((self.dir / "cdi").glob("*.json"))

    def checkpoints(self) -> list[Path]:
        return sorted((self.dir / "plugins").glob("*/claims/*.json"))

    def cdi_names(self) -> set[str]:
        """Every fully qualified CDI device name the spec files define."""
        names = set()
        for path in self.spec_files():
            spec = json.loads(path.read_text())
            names.update(f"{spec['kind']}={d['name']}" for d in spec.get("devices", []))
        return names


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
    check(event is not None and event["error"] == "" and len(devices) == 1 and "-mig-" in devices[0]["device"]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s-dra", type=Path,
                        default=Path(os.environ.get("K8S_DRA_DIR", ROOT.parent / "shared" / "k8s-dra")),
                        help="the real DRA components (default: $K8S_DRA_DIR, else shared/k8s-dra beside the checkout)")
    args = parser.parse_args()
    if not (args.k8s_dra / "up.sh").exists():
        print(f"SKIP: no k8s-dra folder at {args.k8s_dra} (give --k8s-dra DIR)")
        return 0
    work = Path(tempfile.mkdtemp(prefix="gld-", dir="/tmp"))
    cluster = Cluster(args.k8s_dra, work / "state")
    nodes: dict[str, Node] = {}
    try:
        cluster.up()
        cluster.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                        "spec": {"selectors": [{"cel": {"expression": cel}}]}} for name, cel in DEVICE_CLASSES])
        for name in NODES:
            nodes[name] = node = Node(cluster, name, work)
            node.start_kubelet()
            check(node.events.wait("kubelet_started", 0, 60) is not None, f"{name}: drakubelet started")
            started = node.start_plugin()
            registered = node.events.wait("plugin_registered", 0, 60)
            want = {"dra-mixed": 2}.get(name, 1)
            published = wait(lambda node=node, want=want: len(cluster.devices(node.name)) == want, 60)
            check(registered is not None and published is not None, f"{name}: registered and published")
            if published is not None:
                figure(f"{name} ({node.profile}): plugin start -> slices published in "
                       f"{time.monotonic() - started:.2f} s, {sum(map(len, cluster.devices(name).values()))} devices")
        scenario_claim_lifecycle(cluster, nodes["dra-h100"])
        scenario_unsatisfiable(cluster, nodes["dra-h100"])
        scenario_mig_amd_mixed(cluster, nodes)
        scenario_faults(cluster, nodes["dra-h100"])
    finally:
        for node in nodes.values():
            node.stop(node.plugin)
            node.stop(node.kubelet)
        cluster.down()
    failed = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed)} checks passed, {len(failed)} failed; logs in {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
