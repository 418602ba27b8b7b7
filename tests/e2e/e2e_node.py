"""End to end: the chart installed with Helm on a real node (shared/k8s-node), and the plain manifests. Not a test.

Run as root (`.ci/node` builds the image and runs this); pytest does not collect ``e2e_*.py``:

    python tests/e2e/e2e_node.py --image localhost/gpu-labeller:0.1.0 [--k8s-node DIR] [--profile dgx-h100]

The node is k8s-node's: containerd, runc and a real kubelet v1.34 under a v1.34 control plane, everything in its
own network namespace (its README). This script starts it (``up.sh``, importing the image from podman storage),
runs its checks inside that namespace (it runs itself again there under ``nsenter --net``: the API server
listens only in there, and so every request of this run stays in there), and stops it with ``down.sh --wipe``,
whatever happened. One node per host: nothing else may use k8s-node meanwhile.

Before anything is installed the Node gets three labels from someone else (``kubectl label``): ``example.com/team``,
the GPU Operator's ``nvidia.com/gpu.deploy.device-plugin``, and ``nvidia.com/gpu.example-foreign`` (under
gpu-labeller's prefix, but not set by it). Every check below also says they are still there.

1. Helm (helm-python-sdk: Helm v4's own install and uninstall, hooks included): the chart with its default values,
   the image (``image.pullPolicy: Never``) and ``simulate.profile``. The labeller pod Running and Ready; the Node's
   labels of gpu-labeller exactly what ``gpu-labeller labels --simulate PROFILE --config-dir`` (the release's
   ConfigMap) prints; the device plugin registered with the real kubelet (its checkpoint lists the profile's
   devices) and the Node's allocatable showing them (``nvidia.com/gpu: 8`` for dgx-h100); a pod asking
   ``nvidia.com/gpu: 1`` runs and gets one of them. ``helm uninstall``: the post-delete hook removes every label
   gpu-labeller set (none is left once the pods are gone either), the release's objects and the hook's are gone,
   the plugin's socket too.
2. The plain manifests (deploy/manifests/gpu-labeller-k8s1.30.yaml, its image, pull policy and the simulated
   profile set as above): labelled as the CLI says; ``kubectl delete -f`` alone leaves the labels (why the prune
   step exists); the documented uninstall (deploy/manifests/prune/gpu-labeller-prune-k8s1.30.yaml applied, its Job
   waited for, deleted) leaves none. The prune Job's ValidatingAdmissionPolicy, asked by the real API server
   (server-side dry runs as the Job's ServiceAccount), refuses it a label gpu-labeller does not own, one it did not
   set, and any label added.

Prints each check and the times; exits with 1 when a check fails (2: cannot start), after stopping the node.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.model.labels import FIELD_MANAGER, owns  # noqa: E402

Obj = dict[str, Any]
CHART = ROOT / "deploy" / "helm" / "gpu-labeller"
MANIFEST = ROOT / "deploy" / "manifests" / "gpu-labeller-k8s1.30.yaml"
PRUNE_MANIFEST = ROOT / "deploy" / "manifests" / "prune" / "gpu-labeller-prune-k8s1.30.yaml"
RELEASE = NAMESPACE = "gpu-labeller"
PRUNE_USER = f"system:serviceaccount:{NAMESPACE}:gpu-labeller-prune"
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")  # fixed in the kubelet
FOREIGN = {"example.com/team": "ml", "nvidia.com/gpu.deploy.device-plugin": "true",
           "nvidia.com/gpu.example-foreign": "kept"}
INSIDE_TIMEOUT_S = 540  # every wait below is bounded; this bounds the whole run inside the namespace
# k8s-node's load-image.sh checks each import with `ctr images ls -q | grep -qxF IMAGE` under pipefail: ctr
# writes one line per write(), so when grep has its match before the last line ctr dies of SIGPIPE and an import
# that worked is called failed ("imported, but containerd does not list ..."): 57 of 400 such checks here, and
# up.sh makes two (the pause image and ours).
UP_ATTEMPTS = 4
WAIT_S = 180  # one condition (a pod Ready, labels written): generous, the CI box is shared and loaded

results: list[tuple[bool, str]] = []


def check(ok: bool, what: str) -> bool:
    results.append((ok, what))
    print(f"  {'PASS' if ok else 'FAIL'}  {what}", flush=True)
    return ok


def figure(text: str) -> None:
    print(f"  figure: {text}", flush=True)


def wait(predicate: Callable[[], Any], timeout: float = WAIT_S, step: float = 0.5) -> float | None:
    """Seconds until ``predicate()`` held, or None after ``timeout``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if predicate():
                return time.monotonic() - began
        except (subprocess.CalledProcessError, ValueError, KeyError, IndexError):
            pass
        time.sleep(step)
    return None


def took(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f} s"


# --- inside the node's network namespace ---------------------------------------------------------------------

class Cluster:
    """kubectl as admin, and this checkout's CLI, against k8s-node's API server."""

    def __init__(self, state: Path, node: str, kubectl: str, image: str, profile: str) -> None:
        self.kubeconfig, self.node, self.kubectl_bin = state / "kubeconfig", node, kubectl
        self.image, self.profile = image, profile

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                as_user: str | None = None) -> subprocess.CompletedProcess[str]:
        who = ["--as", as_user] if as_user else []
        return subprocess.run([self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *who, *args], input=stdin,
                              text=True, capture_output=True, check=check, timeout=WAIT_S)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, objects: list[Obj]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def delete(self, objects: list[Obj]) -> float:
        """``kubectl delete -f`` of ``objects``, waiting until they are gone (the Namespace too); its seconds."""
        began = time.monotonic()
        self.kubectl("delete", "--wait=true", "--timeout=180s", "-f", "-",
                     stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
        return time.monotonic() - began

    def node_object(self) -> Obj:
        found: Obj = self.json("get", "node", self.node)
        return found

    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.node_object()["metadata"].get("labels", {})
        return labels

    def ours(self) -> dict[str, str]:
        """The Node's labels under gpu-labeller's keys, but for the ones planted by someone else."""
        return {k: v for k, v in self.labels().items() if owns(k) and k not in FOREIGN}

    def labeller_managed(self) -> list[str]:
        """Label keys the Node's managedFields still list under gpu-labeller's field manager."""
        keys = []
        for entry in self.node_object()["metadata"].get("managedFields", []):
            if entry.get("manager") == FIELD_MANAGER:
                keys += [k.removeprefix("f:") for k in entry.get("fieldsV1", {}).get("f:metadata", {})
                         .get("f:labels", {})]
        return keys

    def pods(self, selector: str) -> list[Obj]:
        items: list[Obj] = self.json("get", "pods", "-n", NAMESPACE, "-l", selector)["items"]
        return items

    def ready(self, component: str) -> bool:
        pods = self.pods(f"app.kubernetes.io/component={component}")
        return len(pods) == 1 and pods[0]["status"].get("phase") == "Running" and any(
            c["type"] == "Ready" and c["status"] == "True" for c in pods[0]["status"].get("conditions", []))

    def cli(self, command: str, configs: dict[str, str]) -> Any:
        """This checkout's ``gpu-labeller COMMAND --simulate PROFILE`` with the named configs as the pods mount them."""
        with tempfile.TemporaryDirectory(prefix="gl-configs-") as folder:
            for name, text in configs.items():
                (Path(folder) / name).write_text(text)
            out = subprocess.run([sys.executable, "-m", "labeller.cli", command, "--simulate", self.profile,
                                  "--config-dir", folder, "--format", "json"], cwd=ROOT, capture_output=True,
                                 text=True, check=True, timeout=WAIT_S).stdout
        return json.loads(out)

    def release_configs(self) -> dict[str, str]:
        data: dict[str, str] = self.json("get", "configmap", "-n", NAMESPACE, "gpu-labeller-config")["data"]
        return data


def plant_foreign_labels(cluster: Cluster) -> None:
    cluster.kubectl("label", "node", cluster.node, "--overwrite", *(f"{k}={v}" for k, v in FOREIGN.items()))
    check({k: cluster.labels().get(k) for k in FOREIGN} == FOREIGN,
          f"someone else's labels on {cluster.node}: {', '.join(FOREIGN)}")


def foreign_labels_kept(cluster: Cluster, when: str) -> None:
    labels = cluster.labels()
    kept = {k: labels.get(k) for k in FOREIGN}
    check(kept == FOREIGN, f"{when}: someone else's labels untouched" + ("" if kept == FOREIGN else f": {kept}"))


def labelled_as_the_cli_says(cluster: Cluster, started: float, what: str) -> None:
    expected = cluster.cli("labels", cluster.release_configs())
    seconds = wait(lambda: cluster.ours() == expected)
    ours = cluster.ours()
    differing = sorted(key for key in set(ours) | set(expected) if ours.get(key) != expected.get(key))
    check(seconds is not None, f"{what}: the Node's {len(ours)} gpu-labeller labels are exactly the "
          f"{len(expected)} of `labels --simulate {cluster.profile}`" + ("" if seconds is not None else
                                                                        f"; these differ: {differing}"))
    figure(f"{what}: labels right {time.monotonic() - started:.1f} s after the install")


def device_plugin_serves(cluster: Cluster) -> list[str]:
    """The plugin registered with the real kubelet, the Node's allocatable; returns the resource's device IDs."""
    (resource,) = [r for r in cluster.cli("resources", cluster.release_configs())["resources"]]
    name, devices = resource["name"], sorted(d["id"] for d in resource["devices"])
    check(wait(lambda: cluster.ready("device-plugin")) is not None, "the device plugin pod Running and Ready")
    checkpoint = DEVICE_PLUGINS / "kubelet_internal_checkpoint"

    def registered() -> bool:
        data = json.loads(checkpoint.read_text())["Data"]["RegisteredDevices"]
        return sorted(data.get(name) or []) == devices
    check(wait(registered) is not None and (DEVICE_PLUGINS / resource["socket"]).is_socket(),
          f"registered with the kubelet: {resource['socket']}, and the kubelet's checkpoint lists the "
          f"{len(devices)} devices of {name} that `resources --simulate {cluster.profile}` lists")
    allocatable = wait(lambda: cluster.node_object()["status"]["allocatable"].get(name) == str(len(devices)))
    check(allocatable is not None, f"the Node's allocatable shows {name}: {len(devices)}")
    return devices


def gpu_pod_runs(cluster: Cluster, name: str, devices: list[str]) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-user", "namespace": "default"},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": "main", "image": cluster.image, "imagePullPolicy": "Never", "command": ["python", "-c",
               "import os; print(os.environ.get('NVIDIA_VISIBLE_DEVICES', ''))"],
               "resources": {"limits": {name: "1"}}}]}}
    cluster.apply([pod])
    done = wait(lambda: cluster.json("get", "pod", "-n", "default", "gpu-user")["status"]["phase"] == "Succeeded")
    given = cluster.kubectl("logs", "-n", "default", "gpu-user", check=False).stdout.strip()
    check(done is not None and given in devices,
          f"a pod asking {name}: 1 ran ({took(done)}) with NVIDIA_VISIBLE_DEVICES={given or '(none)'}, one of them")
    cluster.kubectl("delete", "pod", "-n", "default", "gpu-user", "--wait=true", "--timeout=120s")


def nothing_of_ours_left(cluster: Cluster, when: str) -> None:
    ours, managed = cluster.ours(), cluster.labeller_managed()
    check(not ours and not managed, f"{when}: no label of gpu-labeller's left" + (
        "" if not ours and not managed else f": {sorted(ours) or sorted(managed)}"))
    foreign_labels_kept(cluster, when)


def scenario_helm(cluster: Cluster) -> None:
    import helm_python

    print("1. Helm: install, check, uninstall", flush=True)
    repository, _, tag = cluster.image.rpartition(":")
    values = {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
              "simulate": {"profile": cluster.profile}}
    with helm_python.Config(kubeconfig_path=cluster.kubeconfig, namespace=NAMESPACE) as helm:
        began = time.monotonic()
        release = helm.install(str(CHART), RELEASE, values, create_namespace=True, timeout=300)
        figure(f"helm install: {time.monotonic() - began:.1f} s (status {release['status']})")
        check("FOR DEMOS AND CI ONLY" in release["notes"], "NOTES.txt warns that the GPUs are simulated")
        ready = wait(lambda: cluster.ready("labeller"))
        check(ready is not None, f"the labeller pod Running and Ready ({took(ready)} after the install)")
        labelled_as_the_cli_says(cluster, began, "helm")
        foreign_labels_kept(cluster, "installed")
        devices = device_plugin_serves(cluster)
        gpu_pod_runs(cluster, "nvidia.com/gpu", devices)

        began = time.monotonic()
        helm.uninstall(RELEASE, timeout=300)
        figure(f"helm uninstall (the prune hook included): {time.monotonic() - began:.1f} s")
        check(not helm.list(all_states=True), "no release left")
    nothing_of_ours_left(cluster, "right after helm uninstall")
    gone = wait(lambda: not cluster.json("get", "pods", "-n", NAMESPACE)["items"])
    check(gone is not None, f"every pod of the release gone ({took(gone)} after)")
    nothing_of_ours_left(cluster, "once no labeller runs")
    left = cluster.kubectl("get", "all,serviceaccounts,configmaps,jobs,clusterroles,clusterrolebindings,"
                           "validatingadmissionpolicies,validatingadmissionpolicybindings", "-A", "-o", "name",
                           "-l", "app.kubernetes.io/part-of=gpu-labeller").stdout.split()
    check(not left, "no object of the release or of its hook left" + (f": {left}" if left else ""))
    sockets = sorted(p.name for p in DEVICE_PLUGINS.iterdir() if p.is_socket() and p.name != "kubelet.sock")
    check(not sockets, "the plugin's socket is gone" + (f": {sockets}" if sockets else ""))


def local(objects: list[Obj], image: str, profile: str | None) -> list[Obj]:
    """The plain manifest's objects as this run installs them: its image, never pulled, and the simulated profile
    (what `simulate.profile` adds to every container of the chart)."""
    out = copy.deepcopy(objects)
    for obj in out:
        if obj["kind"] not in ("DaemonSet", "Job"):
            continue
        for box in obj["spec"]["template"]["spec"]["containers"]:
            box["image"], box["imagePullPolicy"] = image, "Never"
            if profile:
                box.setdefault("env", []).append({"name": "GPU_LABELLER_SIMULATE", "value": profile})
    return out


def refused(cluster: Cluster, change: list[str], words: str) -> bool:
    """A server-side dry run of ``kubectl label`` as the prune Job's ServiceAccount is refused, saying ``words``."""
    answer = cluster.kubectl("label", "node", cluster.node, "--dry-run=server", *change, check=False,
                             as_user=PRUNE_USER)
    return answer.returncode != 0 and words in answer.stderr


def scenario_plain_manifests(cluster: Cluster) -> None:
    print("2. plain manifests: kubectl apply, kubectl delete, the prune Job", flush=True)
    main = local([o for o in yaml.safe_load_all(MANIFEST.read_text()) if o], cluster.image, cluster.profile)
    prune = local([o for o in yaml.safe_load_all(PRUNE_MANIFEST.read_text()) if o], cluster.image, None)
    began = time.monotonic()
    cluster.apply(main)
    ready = wait(lambda: cluster.ready("labeller"))
    check(ready is not None, f"the labeller pod Running and Ready ({took(ready)} after kubectl apply)")
    labelled_as_the_cli_says(cluster, began, "plain manifests")
    removed = cluster.delete(main)
    count = len(cluster.ours())
    check(count > 0, f"kubectl delete -f (namespace and all, {removed:.1f} s) alone leaves the {count} labels")

    began = time.monotonic()
    cluster.apply(prune)
    done = cluster.kubectl("wait", "-n", NAMESPACE, "job/gpu-labeller-prune", "--for=condition=complete",
                           "--timeout=180s", check=False)
    check(done.returncode == 0, f"the prune Job completed ({time.monotonic() - began:.1f} s after kubectl apply)")
    nothing_of_ours_left(cluster, "after the prune Job")
    # The Job is done; its ServiceAccount and policy remain until the file is deleted. Dry runs change nothing.
    attempts = {
        "removing someone else's label": (["example.com/team-"], "may remove only the label keys gpu-labeller owns"),
        "removing a label under gpu-labeller's prefix that it did not set": (
            ["nvidia.com/gpu.example-foreign-"], "may remove only labels gpu-labeller set"),
        "adding a label": (["nvidia.com/gpu.present=true"], "may only remove labels"),
    }
    for what, (change, words) in attempts.items():
        seconds = wait(functools.partial(refused, cluster, change, words), 60, 1.0)
        check(seconds is not None, f"the prune Job's policy refuses its ServiceAccount {what}: '{words}'")
    cluster.delete(prune)
    left = cluster.kubectl("get", "clusterroles,clusterrolebindings,validatingadmissionpolicies,namespaces",
                           "-o", "name", "-l", "app.kubernetes.io/part-of=gpu-labeller").stdout.split()
    check(not left, "kubectl delete -f of the prune file leaves nothing" + (f": {left}" if left else ""))


def inside(args: argparse.Namespace) -> int:
    cluster = Cluster(args.state, args.node_name, args.kubectl, args.image, args.profile)
    plant_foreign_labels(cluster)
    scenario_helm(cluster)
    scenario_plain_manifests(cluster)
    failed = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed)} checks passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


# --- on the host: start the node, run the checks inside it, stop it ------------------------------------------

def node_env(state: Path) -> dict[str, str]:
    """up.sh's env file: the namespace, node name and kubectl it chose."""
    values = {}
    for line in (state / "env").read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line.removeprefix("export ").partition("=")
            values[key] = value.strip("'\"")
    return values


def stop(signum: int, frame: object) -> None:
    sys.exit(1)


@dataclass(frozen=True)
class Start:
    """One start of the node: ``env`` for up.sh (feature gates: ``APISERVER_EXTRA_ARGS``, ...,
    ``KUBELET_EXTRA_ARGS``) and the ``checks`` run inside it (an exit code)."""

    name: str
    env: dict[str, str]
    checks: Callable[[argparse.Namespace], int]


def main(script: str = __file__, starts: Sequence[Start] = (Start("chart", {}, inside),),
         doc: str = __doc__ or "") -> int:
    """For each of ``starts`` in turn: start k8s-node with its env, run ``script --inside`` in its network
    namespace (its checks there), stop the node with ``down.sh --wipe`` whatever happened (the next start
    is on an empty node: a field the API server stored with a gate on would stay once it is off).
    tests/e2e/e2e_node_dra.py reuses it with its own starts. Exit 0 when every start passed, 1 when a check
    failed, 2 when the node or its checks cannot start."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--image", required=True, help="the image in podman storage, e.g. localhost/gpu-labeller:0.1.0")
    parser.add_argument("--k8s-node", type=Path, default=Path(os.environ.get("K8S_NODE_DIR", "/work/shared/k8s-node")),
                        help="the k8s-node folder (default: $K8S_NODE_DIR, else %(default)s)")
    parser.add_argument("--profile", default="dgx-h100", help="simulate.profile (default: %(default)s)")
    parser.add_argument("--only", choices=[s.name for s in starts], default=None,
                        help="run only this start of the node" if len(starts) > 1 else argparse.SUPPRESS)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", help=argparse.SUPPRESS)
    parser.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--node-name", help=argparse.SUPPRESS)
    parser.add_argument("--kubectl", help=argparse.SUPPRESS)
    args = parser.parse_args()
    name = Path(script).stem
    if args.inside:
        return next(s for s in starts if s.name == args.start).checks(args)
    if os.geteuid() != 0:
        print(f"{name}: needs root (k8s-node's up.sh: a network namespace, containerd, a kubelet)", file=sys.stderr)
        return 2
    if not (args.k8s_node / "up.sh").is_file():
        print(f"{name}: no k8s-node folder at {args.k8s_node} (give --k8s-node DIR)", file=sys.stderr)
        return 2
    if subprocess.run(["podman", "image", "exists", args.image], check=False).returncode != 0:
        print(f"{name}: {args.image} is not in podman storage (build it: .ci/image build)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, stop)  # stop the node on the way out, as on Ctrl-C
    began = time.monotonic()
    statuses = []
    for start in [s for s in starts if args.only in (None, s.name)]:
        statuses.append(run_start(args, script, start))
        if statuses[-1] == 2:
            break
    status = max(statuses)
    print(f"{name}: {'passed' if status == 0 else 'FAILED'} in {time.monotonic() - began:.1f} s "
          f"({len(statuses)} start{'s' if len(statuses) > 1 else ''}: up.sh, checks, down.sh --wipe)", flush=True)
    return status


def keep_logs(state: Path, prefix: str) -> Path:
    """A copy of the node's logs in a new folder (the next start writes over them)."""
    kept = Path(tempfile.mkdtemp(prefix=prefix))
    for log in [*state.glob("*.log"), *state.glob("cp/*.log")]:
        shutil.copy2(log, kept / (f"cp-{log.name}" if log.parent.name == "cp" else log.name))
    return kept


def run_start(args: argparse.Namespace, script: str, start: Start) -> int:
    """One start of the node: up.sh with the start's env, its checks inside, down.sh --wipe; the exit code."""
    name = Path(script).stem
    state = Path(os.environ.get("NODE_STATE", "/tmp/gpu-labeller-node"))
    began = time.monotonic()
    child: subprocess.Popen[str] | None = None
    status = 1
    try:
        gates = " ".join(f"{k}={v!r}" for k, v in start.env.items()) or "no extra settings"
        print(f"== {start.name}: k8s-node up ({args.k8s_node}; {gates}), importing {args.image}", flush=True)
        for attempt in range(1, UP_ATTEMPTS + 1):
            up = subprocess.run([str(args.k8s_node / "up.sh")], env={**os.environ, **start.env, "IMAGES": args.image},
                                capture_output=True, text=True, timeout=600, check=False)
            if up.returncode == 0:
                break
            said = (up.stdout + up.stderr).strip().splitlines()[-8:]
            again = "; once more (up.sh is idempotent)" if attempt < UP_ATTEMPTS else ""
            print(f"{name}: up.sh failed (exit {up.returncode}){again}:", *said, sep="\n  ", file=sys.stderr)
        else:
            return 2
        figure(f"up.sh with the image import: {time.monotonic() - began:.1f} s")
        env = node_env(state)
        child = subprocess.Popen(
            ["nsenter", f"--net={env['NODE_NSPATH']}", sys.executable, script, "--inside", "--start", start.name,
             "--image", args.image, "--profile", args.profile, "--state", str(state), "--node-name",
             env["NODE_NAME"], "--kubectl", env["NODE_KUBECTL"]], text=True)
        status = child.wait(INSIDE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"{name}: the checks of {start.name} did not finish within {INSIDE_TIMEOUT_S} s", file=sys.stderr)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        down = subprocess.run([str(args.k8s_node / "down.sh"), "--wipe"], capture_output=True, text=True,
                              timeout=300, check=False)
        if down.returncode != 0:
            print(f"{name}: down.sh --wipe failed: {down.stderr.strip()}", file=sys.stderr)
            status = status or 1
        if status != 0:
            kept = keep_logs(state, f"{name}-{start.name}-")
            print(f"{name}: the logs of {start.name} (kubelet, containerd, control plane) kept in {kept}",
                  file=sys.stderr)
    print(f"== {start.name}: {'passed' if status == 0 else 'FAILED'} in {time.monotonic() - began:.1f} s "
          "(up.sh, checks, down.sh --wipe)", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
