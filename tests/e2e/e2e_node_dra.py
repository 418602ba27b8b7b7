"""End to end: ``nvidia.com/gpu`` through DRA on a real node (shared/k8s-node) with DRAExtendedResource. Not a test.

Run as root, as tests/e2e/e2e_node.py (whose node handling it reuses: up.sh, the checks inside the node's network
namespace, down.sh --wipe whatever happened); pytest does not collect ``e2e_*.py``:

    python tests/e2e/e2e_node_dra.py --image localhost/gpu-labeller:0.1.0 [--k8s-node DIR] [--profile dgx-h100]

The node starts with the DRAExtendedResource feature gate on every component: the API server, the scheduler and
the controller-manager (``APISERVER_EXTRA_ARGS``, ``SCHEDULER_EXTRA_ARGS``, ``KCM_EXTRA_ARGS``) and the real
kubelet v1.34 (``KUBELET_EXTRA_ARGS``), containerd 1.6 as its runtime. The chart is installed with Helm
(helm-python-sdk) with ``dra.enabled``, ``dra.vendors: [nvidia]`` (the node's NVIDIA GPUs served through DRA, the
device plugin withholding them) and the simulated profile, the DRA plugin's directories under the kubelet's
root-dir (k8s-node's kubelet runs with ``--root-dir $NODE_STATE/kubelet``) and its CDI specs and MPS root under
the node's state folder.

1. The DRA plugin registers with the real kubelet and publishes the profile's GPUs; the Node's allocatable has
   no ``nvidia.com/gpu`` (the device plugin withholds it on a DRA node); the chart's DeviceClass gpu.nvidia.com
   is stored with ``extendedResourceName: nvidia.com/gpu``.
2. A pod asking ``nvidia.com/gpu: 1`` (``resources.limits``, as written for the device plugin): the scheduler
   makes and allocates its claim (``pod.status.extendedResourceClaimStatus``), the real kubelet has our plugin
   prepare it (the claim's CDI spec file, defining the CDI device of the allocated GPU), the pod runs. What
   containerd 1.6 makes of the CDI device is reported: it has no CDI support, so the container gets none of the
   spec's edits (``NVIDIA_VISIBLE_DEVICES``, device nodes). Deleting the pod unprepares the claim (spec file
   gone) and the garbage collector deletes it.
3. ``helm uninstall``: the plugin's registration socket and slices go.

Prints each check and the times; exits with 1 when a check fails (2: cannot start), after stopping the node.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e import e2e_node  # noqa: E402
from tests.e2e.e2e_node import NAMESPACE, RELEASE, Cluster, check, figure, took, wait  # noqa: E402

Obj = dict[str, Any]
GATE = "--feature-gates=DRAExtendedResource=true"
GATED = {"APISERVER_EXTRA_ARGS": GATE, "SCHEDULER_EXTRA_ARGS": GATE, "KCM_EXTRA_ARGS": GATE,
         "KUBELET_EXTRA_ARGS": GATE}
NVIDIA = "gpu.nvidia.com"
POD = "ext-gpu"


def values(cluster: Cluster, state: Path) -> Obj:
    repository, _, tag = cluster.image.rpartition(":")
    kubelet = state / "kubelet"
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "simulate": {"profile": cluster.profile},
            "dra": {"enabled": True, "vendors": ["nvidia"], "pluginsDir": str(kubelet / "plugins"),
                    "registryDir": str(kubelet / "plugins_registry"), "cdiSpecDir": str(state / "dra-cdi"),
                    "mpsRoot": str(state / "dra-mps")}}


def node_devices(cluster: Cluster) -> list[str]:
    slices = cluster.json("get", "resourceslices")["items"]
    return [d["name"] for s in slices if s["spec"].get("nodeName") == cluster.node and s["spec"]["driver"] == NVIDIA
            for d in s["spec"].get("devices", [])]


def gpu_pod(cluster: Cluster) -> Obj:
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

    print("1. the chart with dra.enabled and dra.vendors [nvidia] on a node with DRAExtendedResource", flush=True)
    with helm_python.Config(kubeconfig_path=cluster.kubeconfig, namespace=NAMESPACE) as helm:
        began = time.monotonic()
        release = helm.install(str(e2e_node.CHART), RELEASE, values(cluster, state), create_namespace=True,
                               timeout=300)
        figure(f"helm install: {time.monotonic() - began:.1f} s (status {release['status']})")
        ready = wait(lambda: cluster.ready("dra-plugin"))
        check(ready is not None, f"the DRA plugin pod Running and Ready ({took(ready)} after the install)")
        registration = state / "kubelet" / "plugins_registry" / f"{NVIDIA}-reg.sock"
        published = wait(lambda: len(node_devices(cluster)) == 8)
        check(published is not None and registration.is_socket(),
              f"registered with the real kubelet ({registration.name}) and published {len(node_devices(cluster))} "
              f"GPUs of {NVIDIA} ({took(published)})")
        labelled = wait(lambda: cluster.labels().get("nvidia.com/gpu.dra") == "true")
        allocatable = cluster.node_object()["status"]["allocatable"].get("nvidia.com/gpu")
        check(labelled is not None and allocatable in (None, "0"),
              f"the node says its NVIDIA GPUs are DRA's (nvidia.com/gpu.dra=true); allocatable nvidia.com/gpu: "
              f"{allocatable}")
        spec = cluster.json("get", "deviceclass", NVIDIA)["spec"]
        check(spec.get("extendedResourceName") == "nvidia.com/gpu",
              f"DeviceClass {NVIDIA} stored with extendedResourceName {spec.get('extendedResourceName')}")

        print("2. a pod asking nvidia.com/gpu: 1", flush=True)
        began = time.monotonic()
        cluster.apply([gpu_pod(cluster)])
        running = wait(lambda: cluster.json("get", "pod", "-n", "default", POD)["status"].get("phase") == "Running")
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
        specs = sorted((state / "dra-cdi").glob(f"*{claim['metadata']['uid']}*.json"))
        defined = [f"{s['kind']}={d['name']}" for path in specs for s in [json.loads(path.read_text())]
                   for d in s.get("devices", [])]
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
        cluster.kubectl("delete", "pod", "-n", "default", POD, "--wait=true", "--timeout=120s")
        unprepared = wait(lambda: not list((state / "dra-cdi").glob("*.json")))
        check(unprepared is not None, f"deleted: the claim unprepared, its spec file gone ({took(unprepared)})")
        collected = wait(lambda: not cluster.json("get", "resourceclaims", "-n", "default")["items"])
        check(collected is not None, f"and the garbage collector deleted the claim ({took(collected)})")

        print("3. helm uninstall", flush=True)
        helm.uninstall(RELEASE, timeout=300)
    gone = wait(lambda: not registration.exists() and not node_devices(cluster))
    check(gone is not None, f"the plugin's registration socket and its slices gone ({took(gone)})")


def inside(args: argparse.Namespace) -> int:
    cluster = Cluster(args.state, args.node_name, args.kubectl, args.image, args.profile)
    scenario_extended_resource(cluster, args.state)
    failed = [what for ok, what in e2e_node.results if not ok]
    print(f"{len(e2e_node.results) - len(failed)} checks passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(e2e_node.main(__file__, inside, GATED, __doc__ or ""))
