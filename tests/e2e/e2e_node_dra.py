"""End to end: DRA on a real node (shared/k8s-node), its alpha features' gates on and then off. Not a test.

Run as root, as tests/e2e/e2e_node.py (whose node handling it reuses: up.sh, the checks inside the node's network
namespace, down.sh --wipe whatever happened); pytest does not collect ``e2e_*.py``:

    python tests/e2e/e2e_node_dra.py --image localhost/gpu-labeller:0.1.0 [--k8s-node DIR] [--profile dgx-h100]

The node is started twice, each time empty (``down.sh --wipe`` between: a field stored with a gate on would stay).
Each time the chart is installed with Helm (helm-python-sdk) with ``dra.enabled`` and ``dra.vendors: [nvidia]``
(the node's NVIDIA GPUs served through DRA, the device plugin withholding them), the DRA plugin's directories
under the kubelet's root-dir (k8s-node's kubelet runs with ``--root-dir $NODE_STATE/kubelet``) and its CDI specs
and MPS root under the node's state folder; the real kubelet v1.34 has our plugin prepare the claims, containerd
1.6 runs the pods.

Start "gates-on": DRAExtendedResource, DRAConsumableCapacity, DRADeviceTaints and DRAPartitionableDevices on every
component: the API server (also serving ``resource.k8s.io/v1alpha3``: the 1.34 scheduler with DRADeviceTaints
schedules no DRA pod until it can list DeviceTaintRules), the scheduler, the controller-manager (also running the
device-taint-eviction-controller) and the kubelet (``APISERVER_EXTRA_ARGS``, ``SCHEDULER_EXTRA_ARGS``,
``KCM_EXTRA_ARGS``, ``KUBELET_EXTRA_ARGS``).

1. ``simulate.profile`` (dgx-h100): the DRA plugin registers with the real kubelet and publishes the profile's
   GPUs; the Node's allocatable has no ``nvidia.com/gpu``; the chart's DeviceClass gpu.nvidia.com is stored with
   ``extendedResourceName: nvidia.com/gpu``.
2. A pod asking ``nvidia.com/gpu: 1`` (``resources.limits``, as written for the device plugin): the scheduler
   makes and allocates its claim (``pod.status.extendedResourceClaimStatus``), the real kubelet has our plugin
   prepare it (the claim's CDI spec file, defining the CDI device of the allocated GPU), the pod runs. What
   containerd 1.6 makes of the CDI device is reported: it has no CDI support, so the container gets none of the
   spec's edits (``NVIDIA_VISIBLE_DEVICES``, device nodes). Deleting the pod unprepares the claim (spec file
   gone) and the garbage collector deletes it. ``helm uninstall``: the registration socket and slices go.
3. Memory sharing (the default config ``sharing: {memory: {unit: GiB}}``) on 4 Tesla T4 (t4-x4-gpushare, see
   below): each GPU stored ``allowMultipleAllocations`` with a ``memory`` request policy in GiB; two pods whose
   claims ask 8 and 4 GiB of gpu-0 (``capacity.requests.memory``, a CEL selector on its UUID) both run on it, each
   claim with its ``shareID`` and ``consumedCapacity``, each prepared through the real kubelet with a CDI device
   of its own (``<claim UID>-gpu-0-<shareID>``) carrying gpushare's environment (``ALIYUN_COM_GPU_MEM_CONTAINER``
   its GiB); a third asking 4 GiB more stays Pending with the scheduler's reason, 0 over-commits (the claims'
   allocations and the plugin's checkpoint both within the GPU's memory); deleting the first gives the third
   the freed memory, prepared the same way.
4. Health as device taints, same install: gpu-3 dropped from the profile file under a running pod: it stays
   published, tainted ``gpu.nvidia.com/gpu-lost:NoExecute``; the eviction controller deletes the pod and the real
   kubelet unprepares its claim; a new pod asking gpu-3 stays Pending; gpu-3 back in the file: untainted, and the
   Pending pod is scheduled onto it and prepared. ``helm uninstall``.
5. MIG devices made at prepare: the default config ``labeller.dra.dynamicMig: true`` (migStrategy mixed) on
   dgx-a100-mig-dynamic (A100 40GB: GPUs 0-1 whole, 2-3 split by an admin, 4-7 MIG enabled and empty; the
   profile file's simulated NVML keeps its MIG devices in a state file beside it, read here): the plugin publishes
   a counter set for each of GPUs 4-7; NVIDIA's gpu-test4 (four pods, each asking 1g.5gb twice, 2g.10gb and
   3g.20gb of one GPU) runs 4 of 4: two on the admin's GPUs, and for the other two the real kubelet has our plugin
   make their MIG devices on two empty GPUs; each claim's CDI spec names its one GPU; the pods deleted, the MIG
   devices made are destroyed, the admin's left alone. ``helm uninstall``.

Start "gates-off": no gate anywhere (1.34's defaults), the same install as 3-4:

6. The plugin logs one ``reason=feature-gate-off`` line for DRAConsumableCapacity and publishes the GPUs
   exclusive; a claim asking 2 GiB of gpu-0 gets the whole GPU (the API server dropped its capacity request), a
   second asking gpu-0 stays Pending; gpu-3 dropped from the file leaves the slice untainted, with one line for
   DRADeviceTaints; the DeviceClass is stored without ``extendedResourceName`` and a pod asking
   ``nvidia.com/gpu: 1`` stays Pending.

The simulated profile of 3-6 is a file (a copy of the built-in t4-x4-gpushare or dgx-a100-mig-dynamic) that this
script writes and edits, as tests/e2e/e2e_dra_taints.py does. The chart mounts no such file (``simulate.profile``
names a built-in profile): the file lives in the DRA plugin's MPS root (``dra.mpsRoot``, a host directory it mounts
read-write at the same path) and ``dra.extraEnv`` points GPU_LABELLER_SIMULATE at it; the labeller and device
plugin get the built-in profile the same way (``extraEnv``).

Prints each check and the times; exits with 1 when a check fails (2: cannot start), after stopping the node.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e import e2e_node  # noqa: E402
from tests.e2e.e2e_dra import claim_object, claim_pod  # noqa: E402
from tests.e2e.e2e_dra_memory import CAPACITY, GIB, cdi_env, prepared_usage, usage  # noqa: E402
from tests.e2e.e2e_dra_mig import ADMIN_LAYOUT, claim_gpus, dynamic_profile, gpu_test4, layout  # noqa: E402
from tests.e2e.e2e_dra_mig import PROFILE as MIG_PROFILE  # noqa: E402
from tests.e2e.e2e_node import NAMESPACE, RELEASE, Cluster, Start, check, figure, took, wait  # noqa: E402
from tests.plugin.profile_files import write_yaml  # noqa: E402

Obj = dict[str, Any]
NVIDIA = "gpu.nvidia.com"
LOST = (f"{NVIDIA}/gpu-lost", "", "NoExecute")
GATES = ("--feature-gates=DRAExtendedResource=true,DRAConsumableCapacity=true,DRADeviceTaints=true,"
         "DRAPartitionableDevices=true")
GATED = {"APISERVER_EXTRA_ARGS": f"{GATES} --runtime-config=resource.k8s.io/v1alpha3=true",
         "SCHEDULER_EXTRA_ARGS": GATES,
         "KCM_EXTRA_ARGS": f"{GATES} --controllers=device-taint-eviction-controller",  # added to k8s-node's *
         "KUBELET_EXTRA_ARGS": GATES}
POD = "ext-gpu"
SHARED = "t4-x4-gpushare"  # 4 Tesla T4 of 15109 MiB: 14 GiB each to share
MEMORY_CONFIG = {"version": "v1", "sharing": {"memory": {"unit": "GiB"}}}
DYNAMIC_MIG_CONFIG = {"version": "v1", "flags": {"migStrategy": "mixed"}, "labeller": {"dra": {"dynamicMig": True}}}


def values(cluster: Cluster, state: Path) -> Obj:
    """The chart's values: the image, DRA for NVIDIA, the plugin's directories under the node's state."""
    repository, _, tag = cluster.image.rpartition(":")
    kubelet = state / "kubelet"
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "simulate": {"profile": cluster.profile},
            "dra": {"enabled": True, "vendors": ["nvidia"], "pluginsDir": str(kubelet / "plugins"),
                    "registryDir": str(kubelet / "plugins_registry"), "cdiSpecDir": str(state / "dra-cdi"),
                    "mpsRoot": str(state / "dra-mps")}}


def profile_file(state: Path) -> Path:
    """Where the DRA plugin's simulated profile file lives: in its MPS root, a host directory it mounts."""
    return state / "dra-mps" / "simulated" / "node.yaml"


def file_values(cluster: Cluster, state: Path, builtin: str, config: Obj) -> Obj:
    """The values of 3-6: ``config`` as the default config; the labeller and device plugin on the built-in
    profile ``builtin``, the DRA plugin on the profile file (a copy of it) this script writes."""
    out = values(cluster, state)
    out["simulate"] = {"profile": ""}
    out["config"] = {"data": {"default": config}}
    builtin_env = [{"name": "GPU_LABELLER_SIMULATE", "value": builtin}]
    out["labeller"] = {"extraEnv": builtin_env}
    out["devicePlugin"] = {"extraEnv": builtin_env}
    out["dra"]["extraEnv"] = [{"name": "GPU_LABELLER_SIMULATE", "value": str(profile_file(state))}]
    return out


def write_profile(state: Path, document: Obj) -> Obj:
    """``document`` as the DRA plugin's profile file, its simulated NVML's state file (a former run's MIG
    devices) removed; returned."""
    profile_file(state).parent.mkdir(parents=True, exist_ok=True)
    if document.get("nvidia", {}).get("state_file"):
        mig_state(state, document).unlink(missing_ok=True)
    write_yaml(profile_file(state), document)
    return document


def mig_state(state: Path, document: Obj) -> Path:
    """Where the simulated NVML of the profile file keeps its MIG devices (its ``nvidia.state_file``)."""
    return profile_file(state).parent / document["nvidia"]["state_file"]


def shared_profile(state: Path) -> Obj:
    """The built-in t4-x4-gpushare, written to the profile file; returned as written."""
    from vendors.simulate import load_profile, resolve

    return write_profile(state, load_profile(resolve(SHARED)))


def without_last_gpu(document: Obj) -> Obj:
    """The profile without its last NVIDIA GPU (the others keep their names: gpu-<minor>)."""
    out = yaml.safe_load(yaml.safe_dump(document))
    out["nvidia"]["gpus"] = out["nvidia"]["gpus"][:-1]
    return out


def nvidia_devices(cluster: Cluster) -> dict[str, Obj]:
    """The devices of our node's gpu.nvidia.com slices, by name, as the API server stored them."""
    slices = cluster.json("get", "resourceslices")["items"]
    return {d["name"]: d for s in slices if s["spec"].get("nodeName") == cluster.node and s["spec"]["driver"] == NVIDIA
            for d in s["spec"].get("devices", [])}


def taints(cluster: Cluster, device: str) -> list[tuple[str, str, str]]:
    found = nvidia_devices(cluster).get(device, {})
    return [(t["key"], t.get("value", ""), t["effect"]) for t in found.get("taints", [])]


def uuid_of(cluster: Cluster, device: str) -> str:
    uuid: str = nvidia_devices(cluster)[device]["attributes"]["uuid"]["string"]
    return uuid


def gpu_claim(name: str, uuid: str, gib: int | None = None) -> Obj:
    """A ResourceClaim for the GPU with this UUID; ``gib``: the memory it asks (``capacity.requests``)."""
    claim = claim_object(name, f'device.attributes["{NVIDIA}"].uuid == "{uuid}"')
    if gib is not None:
        claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": f"{gib}Gi"}}
    return claim


def sleeper(cluster: Cluster, pod: Obj) -> Obj:
    """``pod`` running the image (never pulled) until deleted; gone 5 s after a delete at most."""
    pod["spec"]["terminationGracePeriodSeconds"] = 5
    pod["spec"]["containers"][0].update({"image": cluster.image, "imagePullPolicy": "Never",
                                         "command": ["python", "-c", "import time; time.sleep(3600)"]})
    return pod


def claimed_pods(cluster: Cluster, uuid: str, claims: dict[str, int | None]) -> None:
    """For each of ``claims`` (name -> the GiB it asks, None: no capacity request), a claim for the GPU with
    this UUID and a pod of the same name using it; the claims created first (a pod whose claim the scheduler
    has not seen yet waits for the claim's event)."""
    cluster.apply([gpu_claim(name, uuid, gib) for name, gib in claims.items()])
    cluster.apply([sleeper(cluster, claim_pod(name, name)) for name in claims])


def phase(cluster: Cluster, pod: str) -> str:
    found = cluster.json("get", "pods", "-n", "default", "--field-selector", f"metadata.name={pod}")["items"]
    return str(found[0]["status"].get("phase", "")) if found else "gone"


def scheduling_message(cluster: Cluster, pod: str) -> str:
    events = cluster.json("get", "events", "-n", "default", "--field-selector", f"involvedObject.name={pod}")["items"]
    return next((str(e["message"]) for e in events if e.get("reason") == "FailedScheduling"), "")


def pending(cluster: Cluster, pod: str) -> str:
    """The scheduler's reason for leaving ``pod`` unscheduled, once it gave one ("" while it has not, or bound it)."""
    found = cluster.json("get", "pod", "-n", "default", pod)
    return "" if found["spec"].get("nodeName") else scheduling_message(cluster, pod)


def allocation(cluster: Cluster, claim: str) -> list[Obj]:
    """The allocation results of a claim (none while it is not allocated)."""
    status = cluster.json("get", "resourceclaim", "-n", "default", claim).get("status") or {}
    results: list[Obj] = ((status.get("allocation") or {}).get("devices") or {}).get("results", [])
    return results


def spec_files(state: Path, claim_uid: str = "") -> list[Path]:
    """The CDI spec files our plugin wrote (for one claim: its UID in the name)."""
    return sorted((state / "dra-cdi").glob(f"*{claim_uid}*.json"))


def cdi_devices(state: Path, claim_uid: str) -> dict[str, dict[str, str]]:
    """The CDI devices the claim's spec file defines (qualified names), each with the environment it gives."""
    out = {}
    for path in spec_files(state, claim_uid):
        spec = json.loads(path.read_text())
        for device in spec.get("devices", []):
            cdi_id = f"{spec['kind']}={device['name']}"
            out[cdi_id] = cdi_env([path], cdi_id)
    return out


def checkpoints(state: Path) -> list[Path]:
    """The records of the claims our plugin prepared (its checkpoint, under the kubelet's plugins directory)."""
    return sorted((state / "kubelet" / "plugins" / NVIDIA / "claims").glob("*.json"))


def gib(used: dict[str, Fraction]) -> str:
    return ", ".join(f"{gpu} {float(value) / GIB:.0f} GiB" for gpu, value in sorted(used.items())) or "none"


def plugin_log(cluster: Cluster) -> list[Obj]:
    """The DRA plugin pod's log lines (JSON in the cluster)."""
    (pod,) = cluster.pods("app.kubernetes.io/component=dra-plugin")
    text = cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"]).stdout
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def gate_off_lines(cluster: Cluster) -> list[tuple[str, list[str]]]:
    """(gate, fields) of each ``reason=feature-gate-off`` line of the DRA plugin."""
    return [(e.get("gate", ""), e.get("fields", [])) for e in plugin_log(cluster)
            if e.get("reason") == "feature-gate-off"]


def installed(helm: Any, cluster: Cluster, release_values: Obj, devices: int | None) -> None:
    """``helm install``, then the DRA plugin Ready and registered with the real kubelet, ``devices`` published
    (None: some)."""
    began = time.monotonic()
    release = helm.install(str(e2e_node.CHART), RELEASE, release_values, create_namespace=True, timeout=300)
    figure(f"helm install: {time.monotonic() - began:.1f} s (status {release['status']})")
    ready = wait(lambda: cluster.ready("dra-plugin"))
    check(ready is not None, f"the DRA plugin pod Running and Ready ({took(ready)} after the install)")
    registration = Path(release_values["dra"]["registryDir"]) / f"{NVIDIA}-reg.sock"
    published = wait(lambda: len(nvidia_devices(cluster)) == devices if devices else nvidia_devices(cluster))
    check(published is not None and registration.is_socket(),
          f"registered with the real kubelet ({registration.name}) and published {len(nvidia_devices(cluster))} "
          f"devices of {NVIDIA} ({took(published)})")


def uninstalled(helm: Any, cluster: Cluster, release_values: Obj) -> None:
    helm.uninstall(RELEASE, timeout=300)
    registration = Path(release_values["dra"]["registryDir"]) / f"{NVIDIA}-reg.sock"
    gone = wait(lambda: not registration.exists() and not nvidia_devices(cluster))
    check(gone is not None, f"helm uninstall: the plugin's registration socket and its slices gone ({took(gone)})")


def delete_pods(cluster: Cluster, *names: str) -> None:
    cluster.kubectl("delete", "pod", "-n", "default", *names, "--wait=true", "--timeout=120s")


# --- gates on ----------------------------------------------------------------------------------------------

def extended_pod(cluster: Cluster) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": [{
                "name": "main", "image": cluster.image, "imagePullPolicy": "Never",
                "command": ["python", "-c", "import time; time.sleep(3600)"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def in_container(cluster: Cluster, code: str) -> str:
    return cluster.kubectl("exec", "-n", "default", POD, "--", "python", "-c", code, check=False).stdout.strip()


def container_spec(state: Path) -> Obj:
    """The OCI spec containerd made for the pod's container (``ctr containers info``)."""
    ctr = ["ctr", "--address", str(state / "containerd" / "containerd.sock"), "-n", "k8s.io", "containers"]
    ids = subprocess.run([*ctr, "ls", "-q", f'labels."io.kubernetes.pod.name"=={POD},'  # one filter: both hold
                          'labels."io.kubernetes.container.name"==main'], capture_output=True, text=True,
                         check=False).stdout.split()
    if len(ids) != 1:
        return {}
    info = subprocess.run([*ctr, "info", ids[0]], capture_output=True, text=True, check=False).stdout
    spec: Obj = json.loads(info).get("Spec", {}) if info.strip() else {}
    return spec


def scenario_extended_resource(cluster: Cluster, state: Path) -> None:
    import helm_python

    print(f"1. the chart with dra.enabled and dra.vendors [nvidia] ({cluster.profile})", flush=True)
    release_values = values(cluster, state)
    with helm_python.Config(kubeconfig_path=cluster.kubeconfig, namespace=NAMESPACE) as helm:
        installed(helm, cluster, release_values, 8)
        labelled = wait(lambda: cluster.labels().get("nvidia.com/gpu.dra") == "true")
        allocatable = cluster.node_object()["status"]["allocatable"].get("nvidia.com/gpu")
        check(labelled is not None and allocatable in (None, "0"),
              f"the node says its NVIDIA GPUs are DRA's (nvidia.com/gpu.dra=true); allocatable nvidia.com/gpu: "
              f"{allocatable}")
        spec = cluster.json("get", "deviceclass", NVIDIA)["spec"]
        check(spec.get("extendedResourceName") == "nvidia.com/gpu",
              f"DeviceClass {NVIDIA} stored with extendedResourceName {spec.get('extendedResourceName')}")

        print("2. a pod asking nvidia.com/gpu: 1", flush=True)
        cluster.apply([extended_pod(cluster)])
        running = wait(lambda: phase(cluster, POD) == "Running")
        status = cluster.json("get", "pod", "-n", "default", POD)["status"]
        claim_status = status.get("extendedResourceClaimStatus") or {}
        check(running is not None and bool(claim_status.get("resourceClaimName")),
              f"Running ({took(running)} after it was created); pod.status.extendedResourceClaimStatus = "
              f"{json.dumps(claim_status)}")
        if not claim_status.get("resourceClaimName"):
            print(f"  pod status: {json.dumps(status)[:1500]}", flush=True)
            return
        claim = cluster.json("get", "resourceclaim", "-n", "default", claim_status["resourceClaimName"])
        results = claim["status"]["allocation"]["devices"]["results"]
        check([(r["driver"], r["pool"]) for r in results] == [(NVIDIA, cluster.node)],
              f"its claim {claim['metadata']['name']} allocated {[r['device'] for r in results]} of our pool")
        specs = spec_files(state, claim["metadata"]["uid"])
        defined = list(cdi_devices(state, claim["metadata"]["uid"]))
        wanted = [(s.get("containerEdits", {}).get("env", []),
                   [n["path"] for d in s.get("devices", []) for n in d["containerEdits"].get("deviceNodes", [])])
                  for s in (json.loads(path.read_text()) for path in specs)]
        check(len(specs) == 1 and len(defined) == 1 and results[0]["device"] in defined[0],
              f"the real kubelet had our plugin prepare it: {specs[0].name if specs else 'no spec file'} defines "
              f"{defined}")
        given = in_container(cluster, "import os, glob; print(os.environ.get('NVIDIA_VISIBLE_DEVICES', '-'), "
                                      "sorted(glob.glob('/dev/nvidia*')))")
        check(given == "- []", f"containerd 1.6 (no CDI support) ran the container without the CDI device's edits: "
              f"NVIDIA_VISIBLE_DEVICES and /dev/nvidia* in it: {given!r}; the spec's (env, device nodes): {wanted}")
        oci = container_spec(state)
        passed = {k: v for k, v in (oci.get("annotations") or {}).items() if "cdi" in k.lower()}
        env = [e for e in (oci.get("process") or {}).get("env", []) if e.startswith("NVIDIA_VISIBLE_DEVICES")]
        figure("the container's OCI spec (ctr containers info): " + (
            f"CDI annotations {passed}, NVIDIA_VISIBLE_DEVICES {env}: the kubelet passes CDI devices only in the "
            "CRI field CDIDevices, which containerd 1.6 does not read" if oci else "not found"))
        delete_pods(cluster, POD)
        unprepared = wait(lambda: not spec_files(state, claim["metadata"]["uid"]))
        check(unprepared is not None, f"deleted: the claim unprepared, its spec file gone ({took(unprepared)})")
        collected = wait(lambda: not cluster.json("get", "resourceclaims", "-n", "default")["items"])
        check(collected is not None, f"and the garbage collector deleted the claim ({took(collected)})")
        uninstalled(helm, cluster, release_values)


def shares_prepared(cluster: Cluster, state: Path, claims: dict[str, int], gpu: str) -> None:
    """Each claim (name -> GiB) allocated a share of ``gpu`` and prepared with a CDI device of that share
    carrying gpushare's environment."""
    seen, wrong = set(), []
    for name, size in claims.items():
        results = allocation(cluster, name)
        share = results[0].get("shareID", "") if len(results) == 1 else ""
        consumed = (results[0].get("consumedCapacity") or {}).get("memory") if results else None
        uid = cluster.json("get", "resourceclaim", "-n", "default", name)["metadata"]["uid"]
        devices = cdi_devices(state, uid)
        told = next(iter(devices.values()), {})
        expected = f"k8s.gpu-labeller.io/gpu={uid}-{gpu}-{share}"
        seen.add(share)
        if not share or consumed != f"{size}Gi" or list(devices) != [expected] or told.get(
                "ALIYUN_COM_GPU_MEM_CONTAINER") != str(size) or told.get("ALIYUN_COM_GPU_MEM_DEV") != "14":
            wrong.append(f"{name}: {[(r['device'], r.get('shareID'), r.get('consumedCapacity')) for r in results]} "
                         f"CDI {list(devices)} env {told}")
    sizes = " and ".join(f"{g} GiB" for g in claims.values())
    check(not wrong and len(seen) == len(claims),
          f"{', '.join(claims)}: each a share of {gpu} (its shareID, {sizes} consumed), "
          f"prepared through the real kubelet with a CDI device of its own "
          f"(<claim UID>-{gpu}-<shareID>) giving ALIYUN_COM_GPU_MEM_CONTAINER its GiB and _DEV 14"
          + (f": {'; '.join(wrong)}" if wrong else ""))


def within_memory(cluster: Cluster, state: Path, when: str) -> None:
    allocated, prepared = usage(cluster), prepared_usage(checkpoints(state))
    over = [gpu for used in (allocated, prepared) for gpu, value in used.items() if value > CAPACITY]
    check(not over, f"{when}: 0 over-commits: allocated {gib(allocated)}, prepared {gib(prepared)} "
          f"(a T4 holds {CAPACITY / GIB:.2f} GiB)")


def scenario_memory_sharing(cluster: Cluster, state: Path) -> None:
    print(f"3. memory sharing (sharing.memory in GiB) on {SHARED}: shares of one GPU", flush=True)
    with_share = {"default": "14Gi", "validRange": {"max": "14Gi", "min": "1Gi", "step": "1Gi"}}
    devices = nvidia_devices(cluster)
    policies = [d.get("capacity", {}).get("memory", {}).get("requestPolicy") for d in devices.values()]
    check(len(devices) == 4 and all(d.get("allowMultipleAllocations") is True for d in devices.values())
          and policies == [with_share] * 4,
          f"each of the 4 GPUs stored allowMultipleAllocations, memory consumed in GiB: {policies[:1]}")
    uuid = uuid_of(cluster, "gpu-0")
    began = time.monotonic()
    for name, size in (("share-a", 8), ("share-b", 4)):  # one after the other: see docs/dra.md on 1.34.2
        claimed_pods(cluster, uuid, {name: size})
        running = wait(lambda name=name: phase(cluster, name) == "Running")
        check(running is not None, f"{name} asking {size} GiB of gpu-0 Running ({took(running)} after creation)"
              + ("" if running is not None else f": {pending(cluster, name)!r}"))
    shares_prepared(cluster, state, {"share-a": 8, "share-b": 4}, "gpu-0")
    figure(f"two shares of gpu-0 prepared and Running {time.monotonic() - began:.1f} s after the first was created")

    claimed_pods(cluster, uuid, {"share-c": 4})
    reason = wait(lambda: pending(cluster, "share-c"), 60)
    check(reason is not None and not allocation(cluster, "share-c"),
          f"a third asking 4 GiB more of gpu-0 (2 left) stays Pending: {pending(cluster, 'share-c')!r}")
    within_memory(cluster, state, "with 12 GiB of gpu-0 held")
    began = time.monotonic()
    delete_pods(cluster, "share-a")
    moved = wait(lambda: phase(cluster, "share-c") == "Running")
    check(moved is not None, f"share-a deleted: the Pending pod gets the freed memory, Running ({took(moved)})")
    claims = {"share-b": 4, "share-c": 4}
    shares_prepared(cluster, state, claims, "gpu-0")
    within_memory(cluster, state, "after the move")
    figure(f"8 GiB freed -> the waiting pod Running in {time.monotonic() - began:.1f} s")
    uids = [cluster.json("get", "resourceclaim", "-n", "default", name)["metadata"]["uid"] for name in claims]
    delete_pods(cluster, "share-b", "share-c")
    check(wait(lambda: not any(spec_files(state, uid) for uid in uids) and not checkpoints(state)) is not None,
          "the pods deleted: every share unprepared (spec files and checkpoint records gone)")


def scenario_taints(cluster: Cluster, state: Path, profile: Obj) -> None:
    print("4. a GPU gone from the probe under a running pod: tainted NoExecute, evicted, untainted on return",
          flush=True)
    uuid = uuid_of(cluster, "gpu-3")
    claimed_pods(cluster, uuid, {"taint-run": None})
    running = wait(lambda: phase(cluster, "taint-run") == "Running")
    uid = cluster.json("get", "resourceclaim", "-n", "default", "taint-run")["metadata"]["uid"]
    check(running is not None and bool(cdi_devices(state, uid)), "a pod on gpu-3 Running, its claim prepared")
    attributes = nvidia_devices(cluster)["gpu-3"].get("attributes")
    began = time.monotonic()
    write_yaml(profile_file(state), without_last_gpu(profile))
    tainted = wait(lambda: taints(cluster, "gpu-3") == [LOST], 60)
    check(tainted is not None and nvidia_devices(cluster).get("gpu-3", {}).get("attributes") == attributes,
          f"gpu-3 dropped from the profile: still published as it was, tainted {':'.join(LOST[::2])} "
          f"({took(tainted)}): {taints(cluster, 'gpu-3')}")
    evicted = wait(lambda: phase(cluster, "taint-run") == "gone" and not cdi_devices(state, uid), 120)
    check(evicted is not None, f"the eviction controller deleted the pod, the real kubelet unprepared its claim "
          f"({took(evicted)} after the taint)")
    figure(f"GPU gone -> pod evicted and unprepared in {time.monotonic() - began:.1f} s")
    claimed_pods(cluster, uuid, {"taint-new": None})
    reason = wait(lambda: pending(cluster, "taint-new"), 60)
    check(reason is not None and not allocation(cluster, "taint-new"),
          f"a new pod asking gpu-3 stays Pending: {pending(cluster, 'taint-new')!r}")
    write_yaml(profile_file(state), profile)
    untainted = wait(lambda: "gpu-3" in nvidia_devices(cluster) and not taints(cluster, "gpu-3"), 60)
    check(untainted is not None, f"gpu-3 back in the profile: published untainted ({took(untainted)})")
    running = wait(lambda: phase(cluster, "taint-new") == "Running")
    new_uid = cluster.json("get", "resourceclaim", "-n", "default", "taint-new")["metadata"]["uid"]
    check(running is not None and [r["device"] for r in allocation(cluster, "taint-new")] == ["gpu-3"]
          and bool(cdi_devices(state, new_uid)),
          f"the Pending pod scheduled onto gpu-3 and prepared through the real kubelet ({took(running)})")
    delete_pods(cluster, "taint-new")
    check(wait(lambda: not spec_files(state, new_uid)) is not None, "deleted: unprepared")


def scenario_shared_node(cluster: Cluster, state: Path) -> None:
    import helm_python

    profile = shared_profile(state)
    release_values = file_values(cluster, state, SHARED, MEMORY_CONFIG)
    with helm_python.Config(kubeconfig_path=cluster.kubeconfig, namespace=NAMESPACE) as helm:
        installed(helm, cluster, release_values, 4)
        scenario_memory_sharing(cluster, state)
        scenario_taints(cluster, state, profile)
        said = gate_off_lines(cluster)
        check(not said, f"the plugin found no gate off: {said}")
        uninstalled(helm, cluster, release_values)


def scenario_dynamic_mig(cluster: Cluster, state: Path) -> None:
    import helm_python

    print(f"5. MIG devices made at prepare (labeller.dra.dynamicMig) on {MIG_PROFILE}: NVIDIA's gpu-test4",
          flush=True)
    profile = write_profile(state, dynamic_profile())
    made = mig_state(state, profile)
    release_values = file_values(cluster, state, MIG_PROFILE, DYNAMIC_MIG_CONFIG)
    with helm_python.Config(kubeconfig_path=cluster.kubeconfig, namespace=NAMESPACE) as helm:
        installed(helm, cluster, release_values, None)
        counted = wait(lambda: len([s for s in cluster.json("get", "resourceslices")["items"]
                                    if s["spec"].get("nodeName") == cluster.node
                                    and s["spec"].get("sharedCounters")]) == 4, 60)
        check(counted is not None, f"a counter set for each of the 4 empty MIG GPUs stored by the API server "
              f"({took(counted)})")
        began = time.monotonic()
        gpu_test4(cluster, {"image": cluster.image, "imagePullPolicy": "Never",
                            "command": ["python", "-c", "import time; time.sleep(3600)"]})
        pods = [f"test4-{n}" for n in range(4)]
        running = wait(lambda: all(phase(cluster, p) == "Running" for p in pods), 240)
        check(running is not None, f"4 of 4 gpu-test4 pods (1g.5gb twice, 2g.10gb, 3g.20gb of one GPU each) Running "
              f"({took(running)} after creation)" + ("" if running is not None else
                                                    f": {[(p, pending(cluster, p)) for p in pods]}"))
        figure(f"gpu-test4: 4 pods of 4 containers Running {time.monotonic() - began:.1f} s after creation")
        uids = [c["metadata"]["uid"] for c in cluster.json("get", "resourceclaims", "-n", "default")["items"]
                if c["metadata"]["name"].startswith("test4-")]
        per_claim = sorted(sorted(g) for g in claim_gpus([path for uid in uids for path in spec_files(state, uid)]))
        # The scheduler may give a pod the admin's MIG devices of GPU 2 or 3 (their layout is what a pod asks)
        # or counters of an empty GPU; whichever it picks, a pod on an empty GPU has its devices made.
        admin = [gpu for gpu in (2, 3) if [f"/dev/nvidia{gpu}"] in per_claim]
        layouts = {gpu: layout(made, gpu) for gpu in range(4, 8)}
        split = [gpu for gpu, devices in layouts.items() if devices]
        check(len(split) == 4 - len(admin) and all(
                  sorted(p for p, _ in layouts[g]) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"] for g in split),
              f"the real kubelet had our plugin make the MIG devices of {len(split)} pods at prepare, on GPUs "
              f"{split} (the admin's of GPUs {admin} went to the other {len(admin)}): {[layouts[g] for g in split]}")
        check(per_claim == sorted([f"/dev/nvidia{g}"] for g in (*admin, *split)),
              f"each of the 4 claims prepared, its CDI spec naming its one GPU: {per_claim}")
        check(layout(made, 2) == layout(made, 3) == ADMIN_LAYOUT, "the admin's MIG devices of GPUs 2-3 as they were")
        delete_pods(cluster, *pods)
        gone = wait(lambda: not any(spec_files(state, uid) for uid in uids)
                    and all(layout(made, gpu) == [] for gpu in range(4, 8)), 60)
        check(gone is not None and layout(made, 2) == layout(made, 3) == ADMIN_LAYOUT,
              f"the pods deleted: the 4 claims unprepared, the MIG devices made destroyed, the admin's left alone "
              f"({took(gone)})")
        uninstalled(helm, cluster, release_values)


def gates_on(args: argparse.Namespace) -> int:
    cluster = Cluster(args.state, args.node_name, args.kubectl, args.image, args.profile)
    scenario_extended_resource(cluster, args.state)
    scenario_shared_node(cluster, args.state)
    scenario_dynamic_mig(cluster, args.state)
    return verdict()


# --- gates off ---------------------------------------------------------------------------------------------

def scenario_gates_off(cluster: Cluster, state: Path) -> None:
    import helm_python

    print(f"6. the gates off: the same install ({SHARED}, sharing.memory) as before these features", flush=True)
    profile = shared_profile(state)
    release_values = file_values(cluster, state, SHARED, MEMORY_CONFIG)
    with helm_python.Config(kubeconfig_path=cluster.kubeconfig, namespace=NAMESPACE) as helm:
        installed(helm, cluster, release_values, 4)
        said = wait(lambda: gate_off_lines(cluster), 30)
        devices = nvidia_devices(cluster)
        check(said is not None and [gate for gate, _ in gate_off_lines(cluster)] == ["DRAConsumableCapacity"],
              f"the plugin says once that the API server dropped DRAConsumableCapacity's fields: "
              f"{gate_off_lines(cluster)}")
        check(len(devices) == 4 and not any("allowMultipleAllocations" in d or "requestPolicy" in d["capacity"]
                                            ["memory"] for d in devices.values()),
              "the 4 GPUs published as before memory sharing in DRA (each to one claim)")
        uuid = uuid_of(cluster, "gpu-0")
        claimed_pods(cluster, uuid, {"off-a": 2})
        running = wait(lambda: phase(cluster, "off-a") == "Running")
        results = allocation(cluster, "off-a")
        check(running is not None and [r["device"] for r in results] == ["gpu-0"]
              and not any("shareID" in r or "consumedCapacity" in r for r in results),
              f"a claim asking 2 GiB of gpu-0 gets the whole GPU (no share): {results}")
        claimed_pods(cluster, uuid, {"off-b": 2})
        reason = wait(lambda: pending(cluster, "off-b"), 60)
        check(reason is not None, f"a second asking gpu-0 stays Pending: {pending(cluster, 'off-b')!r}")
        delete_pods(cluster, "off-a", "off-b")

        write_yaml(profile_file(state), without_last_gpu(profile))
        left = wait(lambda: "gpu-3" not in nvidia_devices(cluster), 60)
        check(left is not None and not [d for d in nvidia_devices(cluster).values() if "taints" in d],
              f"gpu-3 dropped from the profile leaves the slice, no device tainted ({took(left)})")
        said = wait(lambda: len(gate_off_lines(cluster)) == 2, 30)
        check(said is not None and gate_off_lines(cluster)[1:] == [("DRADeviceTaints", ["devices[].taints"])],
              f"and the plugin says once that the API server dropped the taints: {gate_off_lines(cluster)[1:]}")
        stored = cluster.json("get", "deviceclass", NVIDIA)["spec"]
        cluster.apply([extended_pod(cluster)])
        reason = wait(lambda: pending(cluster, POD), 60)
        check("extendedResourceName" not in stored and reason is not None,
              f"DeviceClass {NVIDIA} stored without extendedResourceName; a pod asking nvidia.com/gpu: 1 stays "
              f"Pending: {pending(cluster, POD)!r}")
        delete_pods(cluster, POD)
        uninstalled(helm, cluster, release_values)


def gates_off(args: argparse.Namespace) -> int:
    cluster = Cluster(args.state, args.node_name, args.kubectl, args.image, args.profile)
    scenario_gates_off(cluster, args.state)
    return verdict()


def verdict() -> int:
    failed = [what for ok, what in e2e_node.results if not ok]
    print(f"{len(e2e_node.results) - len(failed)} checks passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


STARTS = (Start("gates-on", GATED, gates_on), Start("gates-off", {}, gates_off))

if __name__ == "__main__":
    sys.exit(e2e_node.main(__file__, STARTS, __doc__ or ""))
