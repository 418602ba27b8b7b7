"""End to end on the real Kubernetes v1.34 control plane (shared/k8s-dra): the chart's ValidatingAdmissionPolicies,
installed by its defaults, and what each component's stolen token can do with them and without them. Not a test.

Run by hand (pytest does not collect ``e2e_*.py``); the control plane's state directory and ports come from the
environment, as the k8s-dra folder's up.sh takes them, so that several copies run side by side:

    DRA_STATE=/tmp/dra-x DRA_API_PORT=7531 DRA_ETCD_PORT=3531 DRA_ETCD_PEER_PORT=3532 DRA_SCHED_PORT=11531 \\
    DRA_KCM_PORT=11532 python tests/e2e/e2e_policy.py [--k8s-dra DIR] [--keep]

1. The chart is rendered as `helm install` renders it on this cluster: its version and the API versions its
   discovery lists (deploy/render.py, the real Helm engine). With the chart's defaults the labeller's Node policy
   and its binding are rendered; with dra.enabled the DRA plugin's slice policy too; with a memory-sharing config
   the device plugin's pod policy. That render (plus the scheduler extender) is applied.
2. Each component's token is what the kubelet mounts: a ServiceAccount token bound to a pod on node ``dra-h100``
   (TokenRequest with a bound Pod; the API server adds the pod's node as
   ``authentication.kubernetes.io/node-name``). ``dra-amd`` is another node.
3. With the policies: each token does its own work (the real ``gpu-labeller run --once`` labels its Node and
   removes the labels it no longer computes; the real ``gpu-labeller dra-plugin``, registered with drakubelet,
   publishes its Node's slices; the device plugin marks a pod on its node assigned) and is refused the rest.
4. The bindings deleted (the chart with admissionPolicy.enabled=false, or a cluster older than 1.30): the same
   attempts again, to measure what is unrestricted then.

Prints each attempt and its answer, then a table per component; exits with 1 when a check fails. Stops the
control plane with ``down.sh --wipe`` unless --keep.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.deploy import load_render_script  # noqa: E402
from tests.e2e.draplane import Cluster, Node, wait  # noqa: E402
from tests.e2e.e2e_dra import NODES  # noqa: E402

Obj = dict[str, Any]
NAMESPACE = "gpu-labeller"
NODE, OTHER = "dra-h100", "dra-amd"  # node A runs drakubelet and the components; node B is another GPU node
OTHER_DRIVER = "gpu.example.com"
# The chart's defaults plus the parts whose tokens write: the DRA plugin, memory sharing (the device plugin patches
# pods, and follows the config label: it reads Nodes), the scheduler extender.
VALUES: Obj = {
    "createNamespace": True,
    "dra": {"enabled": True},
    "extender": {"enabled": True},
    "config": {"data": {"default": {"version": "v1"},
                        "gpushare": {"version": "v1", "sharing": {"memory": {"unit": "GiB"}}}}},
}
SERVICE_ACCOUNTS = {"labeller": "gpu-labeller", "DRA plugin": "gpu-labeller-dra-plugin",
                    "device plugin": "gpu-labeller-device-plugin", "extender": "gpu-labeller-scheduler-extender"}
POLICIES = ["gpu-labeller-own-node-labels", "gpu-labeller-dra-plugin-own-node-slices",
            "gpu-labeller-plugin-own-node-pods"]

results: list[tuple[bool, str]] = []
table: list[tuple[str, str, str, str]] = []  # component, attempt, with the policies, without


def check(ok: bool, what: str) -> bool:
    results.append((ok, what))
    print(f"  {'PASS' if ok else 'FAIL'}  {what}", flush=True)
    return ok


class Api:
    """Plain HTTPS requests to the API server with one bearer token (a component's stolen token)."""

    def __init__(self, server: str, ca_pem: str, token: str) -> None:
        self.server, self.token = server, token
        self.context = ssl.create_default_context(cadata=ca_pem)

    def call(self, method: str, path: str, body: Obj | None = None,
             content_type: str = "application/json") -> tuple[int, Obj]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            try:
                return error.code, json.loads(error.read() or b"{}")
            except ValueError:
                return error.code, {}


@dataclass
class Attempt:
    component: str
    what: str
    method: str
    path: str
    body: Obj | None = None
    content_type: str = "application/merge-patch+json"
    allowed_anyway: bool = False  # its own work, or a right no policy narrows
    rbac_refused: bool = False  # refused by RBAC either way
    before: Callable[[], None] | None = None  # makes the object it acts on (again)
    act: Callable[[Api], tuple[int, Obj]] | None = None  # several requests rather than one


def answer(status: int, body: Obj) -> str:
    if status < 300:
        return f"allowed ({status})"
    return f"refused ({status}): {body.get('message', '')}"


class Setup:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        entry = config["clusters"][0]["cluster"]
        self.server = entry["server"]
        self.ca_pem = base64.b64decode(entry["certificate-authority-data"]).decode()
        self.ca_data = entry["certificate-authority-data"]

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return self.cluster.kubectl(*args, stdin=stdin, check=check)

    def apply(self, objects: list[Obj]) -> None:
        self.cluster.apply(objects)

    def api_versions(self) -> tuple[str, list[str]]:
        """The cluster's version and API versions as Helm's discovery lists them on `helm install`: every group
        version, and every group version/kind it serves."""
        version = json.loads(self.kubectl("get", "--raw", "/version"))["gitVersion"]
        found: set[str] = set()
        group_versions = json.loads(self.kubectl("get", "--raw", "/api"))["versions"]
        for group in json.loads(self.kubectl("get", "--raw", "/apis"))["groups"]:
            group_versions += [v["groupVersion"] for v in group["versions"]]
        for gv in group_versions:
            path = f"/api/{gv}" if "/" not in gv else f"/apis/{gv}"
            found.add(gv)
            for resource in json.loads(self.kubectl("get", "--raw", path))["resources"]:
                found.add(f"{gv}/{resource['kind']}")
        return version, sorted(found)

    def token(self, service_account: str, pod: str) -> Api:
        token = self.kubectl("create", "token", service_account, "-n", NAMESPACE, "--bound-object-kind", "Pod",
                             "--bound-object-name", pod, "--duration", "2h").strip()
        return Api(self.server, self.ca_pem, token)

    def kubeconfig(self, name: str, api: Api, directory: Path) -> Path:
        path = directory / f"kubeconfig-{name}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "dra", "cluster": {"server": self.server,
                                                     "certificate-authority-data": self.ca_data}}],
            "users": [{"name": name, "user": {"token": api.token}}],
            "contexts": [{"name": name, "context": {"cluster": "dra", "user": name}}]}))
        path.chmod(0o600)
        return path


def pod(name: str, namespace: str, node: str | None, service_account: str = "default", **extra: Any) -> Obj:
    spec: Obj = {"serviceAccountName": service_account, "automountServiceAccountToken": False,
                 "terminationGracePeriodSeconds": 0, "containers": [{"name": "main", "image": "busybox"}], **extra}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                             "labels": {"app": name}}, "spec": spec}


def resource_slice(name: str, driver: str, node: str | None, pool: str, device: str = "gpu-0") -> Obj:
    spec: Obj = {"driver": driver, "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": device}]}
    if node:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def node_labels(setup: Setup, node: str) -> dict[str, str]:
    labels: dict[str, str] = setup.cluster.json("get", "node", node)["metadata"].get("labels") or {}
    return labels


def labeller_once(kubeconfig: Path, profile: str, log: Path) -> int:
    with log.open("a") as err:
        return subprocess.run(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "run", "--once", "--simulate", profile,
             "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--start-jitter", "0"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, timeout=120).returncode


def victims(setup: Setup) -> Callable[[], None]:
    def make() -> None:
        setup.apply([resource_slice("victim-other-node", "gpu.nvidia.com", OTHER, OTHER),
                     resource_slice("victim-other-driver", OTHER_DRIVER, NODE, NODE)])
    return make


def add_device(api: Api) -> tuple[int, Obj]:
    """Get another node's slice and update it with one more device (RBAC grants update, not patch)."""
    status, found = api.call("GET", "/apis/resource.k8s.io/v1/resourceslices/victim-other-node")
    if status != 200:
        return status, found
    found["spec"]["devices"].append({"name": "stolen"})
    return api.call("PUT", "/apis/resource.k8s.io/v1/resourceslices/victim-other-node", found)


def delete_all(api: Api) -> tuple[int, Obj]:
    """What `kubectl delete resourceslices --all` does: list them, delete each (RBAC grants no deletecollection)."""
    status, listed = api.call("GET", "/apis/resource.k8s.io/v1/resourceslices")
    if status != 200:
        return status, listed
    answers = {s["metadata"]["name"]: api.call("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/"
                                                         f"{s['metadata']['name']}") for s in listed["items"]}
    refused = sorted(name for name, (code, _) in answers.items() if code >= 300)
    deleted = sorted(name for name in answers if name not in refused)
    message = f"deleted {', '.join(deleted) or 'none'}; refused {', '.join(refused) or 'none'}"
    return (403 if refused else 200), {"message": message}


def attempts(setup: Setup, phase: str) -> list[Attempt]:
    """What each token tries; ``phase`` names the objects it creates, so both phases can create them."""
    slices = "/apis/resource.k8s.io/v1/resourceslices"
    nodes = "/api/v1/nodes"
    make_victims = victims(setup)

    def foreign_label() -> None:
        setup.kubectl("label", "node", NODE, "owner=ml", "--overwrite")

    def pending() -> None:
        setup.apply([pod(f"pending-{phase}", "default", None, schedulerName="nobody")])

    return [
        Attempt("labeller", f"label another Node ({OTHER}) with a gpu-labeller key", "PATCH", f"{nodes}/{OTHER}",
                {"metadata": {"labels": {"nvidia.com/gpu.product": "stolen"}}}),
        Attempt("labeller", "set a label it does not own on its own Node (team)", "PATCH", f"{nodes}/{NODE}",
                {"metadata": {"labels": {"team": f"stolen-{phase}"}}}),
        Attempt("labeller", "remove a label another manager set on its own Node (owner)", "PATCH", f"{nodes}/{NODE}",
                {"metadata": {"labels": {"owner": None}}},
                before=foreign_label),
        Attempt("labeller", f"taint another Node ({OTHER})", "PATCH", f"{nodes}/{OTHER}",
                {"spec": {"taints": [{"key": "stolen", "effect": "NoExecute"}]}}),
        Attempt("labeller", f"taint its own Node ({NODE})", "PATCH", f"{nodes}/{NODE}",
                {"spec": {"taints": [{"key": "stolen", "effect": "NoExecute"}]}}),
        Attempt("labeller", f"cordon another Node ({OTHER}: spec.unschedulable)", "PATCH", f"{nodes}/{OTHER}",
                {"spec": {"unschedulable": True}}),
        Attempt("labeller", "annotate another Node", "PATCH", f"{nodes}/{OTHER}",
                {"metadata": {"annotations": {"stolen": "yes"}}}),
        Attempt("labeller", "delete a Node", "DELETE", f"{nodes}/{OTHER}", rbac_refused=True),
        Attempt("labeller", "read Secrets", "GET", "/api/v1/secrets", rbac_refused=True),

        Attempt("DRA plugin", "create an allNodes ResourceSlice of its driver", "POST", slices,
                resource_slice(f"stolen-all-{phase}", "gpu.nvidia.com", None, f"stolen-{phase}"), "application/json"),
        Attempt("DRA plugin", f"create a ResourceSlice for another Node ({OTHER})", "POST", slices,
                resource_slice(f"stolen-{OTHER}-{phase}", "gpu.nvidia.com", OTHER, OTHER), "application/json"),
        Attempt("DRA plugin", f"create a ResourceSlice of another driver ({OTHER_DRIVER}) on its own Node", "POST",
                slices, resource_slice(f"stolen-driver-{phase}", OTHER_DRIVER, NODE, NODE), "application/json"),
        Attempt("DRA plugin", "add a device to another Node's ResourceSlice (update)", "PUT",
                f"{slices}/victim-other-node", before=make_victims, act=add_device),
        Attempt("DRA plugin", "delete another Node's ResourceSlice", "DELETE", f"{slices}/victim-other-node",
                before=make_victims),
        Attempt("DRA plugin", f"delete another driver's ResourceSlice ({OTHER_DRIVER}) on its own Node", "DELETE",
                f"{slices}/victim-other-driver", before=make_victims),
        Attempt("DRA plugin", "delete every ResourceSlice (`kubectl delete resourceslices --all`)", "DELETE",
                slices, before=make_victims, act=delete_all),
        Attempt("DRA plugin", "read Secrets", "GET", "/api/v1/secrets", rbac_refused=True),

        Attempt("device plugin", "mark a pod on its own Node assigned (ALIYUN_COM_GPU_MEM_ASSIGNED)", "PATCH",
                "/api/v1/namespaces/default/pods/victim-here",
                {"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}}}, allowed_anyway=True),
        Attempt("device plugin", f"annotate a pod on another Node ({OTHER})", "PATCH",
                "/api/v1/namespaces/default/pods/victim-there",
                {"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}}}),
        Attempt("device plugin", "relabel a pod on its own Node", "PATCH",
                "/api/v1/namespaces/default/pods/victim-here", {"metadata": {"labels": {"app": f"stolen-{phase}"}}}),
        Attempt("device plugin", "read every Node (its config label)", "GET", nodes, allowed_anyway=True),
        Attempt("device plugin", "delete a pod", "DELETE", "/api/v1/namespaces/default/pods/victim-there",
                rbac_refused=True),
        Attempt("device plugin", "read Secrets", "GET", "/api/v1/secrets", rbac_refused=True),

        Attempt("extender", f"bind a pending pod to any Node ({OTHER})", "POST",
                f"/api/v1/namespaces/default/pods/pending-{phase}/binding",
                {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": f"pending-{phase}"},
                 "target": {"apiVersion": "v1", "kind": "Node", "name": OTHER}}, "application/json",
                allowed_anyway=True, before=pending),
        Attempt("extender", "relabel any pod", "PATCH", "/api/v1/namespaces/default/pods/victim-there",
                {"metadata": {"labels": {"app": f"extender-{phase}"}}}, allowed_anyway=True),
        Attempt("extender", "read kube-system ConfigMaps", "GET", "/api/v1/namespaces/kube-system/configmaps",
                allowed_anyway=True),
        Attempt("extender", "label a Node", "PATCH", f"{nodes}/{OTHER}", {"metadata": {"labels": {"x": "y"}}},
                rbac_refused=True),
        Attempt("extender", "read Secrets", "GET", "/api/v1/secrets", rbac_refused=True),
    ]


def run_attempts(setup: Setup, tokens: dict[str, Api], phase: str, policies_on: bool) -> dict[str, str]:
    print(f"-- {phase}: the components' tokens {'with' if policies_on else 'without'} the policies", flush=True)
    seen: dict[str, str] = {}
    for attempt in attempts(setup, phase):
        if attempt.before:
            attempt.before()
        api = tokens[attempt.component]
        status, body = attempt.act(api) if attempt.act else api.call(attempt.method, attempt.path, attempt.body,
                                                                      attempt.content_type)
        said = answer(status, body)
        allowed = status < 300
        if attempt.rbac_refused:
            expected = False
        elif attempt.allowed_anyway:
            expected = True
        else:
            expected = not policies_on
        if attempt.act is delete_all:  # allowed: every slice went, the other node's and driver's too
            allowed = status < 300 and not {"victim-other-node", "victim-other-driver"} & {
                s["metadata"]["name"] for s in setup.cluster.json("get", "resourceslices")["items"]}
        check(allowed == expected, f"{attempt.component}: {attempt.what}: {said}")
        seen[f"{attempt.component}\t{attempt.what}"] = "allowed" if allowed else (
            "refused (RBAC)" if status == 403 and "cannot" in body.get("message", "") else "refused")
    return seen


def wait_for_policies(tokens: dict[str, Api], active: bool) -> float | None:
    """Seconds until the API server enforces the policies (or stopped enforcing them): dry-run writes that only
    a policy refuses."""
    probes = [
        (tokens["labeller"], "PATCH", f"/api/v1/nodes/{OTHER}?dryRun=All",
         {"metadata": {"labels": {"nvidia.com/gpu.product": "probe"}}}, "application/merge-patch+json"),
        (tokens["DRA plugin"], "POST", "/apis/resource.k8s.io/v1/resourceslices?dryRun=All",
         resource_slice("probe", "gpu.nvidia.com", OTHER, OTHER), "application/json"),
        (tokens["device plugin"], "PATCH", "/api/v1/namespaces/default/pods/victim-there?dryRun=All",
         {"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_ASSIGNED": "probe"}}}, "application/merge-patch+json"),
    ]

    def enforced() -> bool:
        answers = [api.call(method, path, body, kind) for api, method, path, body, kind in probes]
        refused = [status >= 400 and "ValidatingAdmissionPolicy" in b.get("message", "") for status, b in answers]
        return all(refused) if active else not any(refused)

    return wait(enforced, 60, 0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s-dra", type=Path, default=Path(os.environ.get("K8S_DRA_DIR", "/work/shared/k8s-dra")),
                        help="the k8s-dra folder (default: $K8S_DRA_DIR, else %(default)s)")
    parser.add_argument("--keep", action="store_true", help="leave the control plane running")
    args = parser.parse_args()
    if not (args.k8s_dra / "up.sh").exists():
        print(f"no k8s-dra folder at {args.k8s_dra} (give --k8s-dra DIR or set K8S_DRA_DIR)", file=sys.stderr)
        return 2
    state = Path(os.environ.get("DRA_STATE", "/tmp/gpu-labeller-dra-policy"))
    work = Path(tempfile.mkdtemp(prefix="glp-", dir="/tmp"))
    cluster = Cluster(args.k8s_dra, state)
    node: Node | None = None
    render = load_render_script()
    try:
        cluster.up()
        setup = Setup(cluster)
        version, api_versions = setup.api_versions()
        print(f"1. the chart rendered for this cluster ({version}, {len(api_versions)} API versions and kinds)")
        check(render.POLICY_API in api_versions, f"the cluster serves {render.POLICY_API}")
        # what `helm install` creates: not the post-delete hooks (the prune Job's own policy comes with it then)
        renders = {name: [o for o in (yaml.safe_load(d) for d in render.documents(render.render_chart(
                          values, version, api_versions)))
                          if "helm.sh/hook" not in (o["metadata"].get("annotations") or {})]
                   for name, values in {"defaults": {}, "installed": VALUES}.items()}
        kinds = {name: [f"{o['kind']}/{o['metadata']['name']}" for o in objects
                        if o["kind"].startswith("ValidatingAdmissionPolicy")] for name, objects in renders.items()}
        check(kinds["defaults"] == ["ValidatingAdmissionPolicy/gpu-labeller-own-node-labels",
                                    "ValidatingAdmissionPolicyBinding/gpu-labeller-own-node-labels"],
              f"the chart's defaults render the labeller's policy and binding: {kinds['defaults']}")
        check(sorted(kinds["installed"]) == sorted(f"{k}/{p}" for p in POLICIES for k in
                                                   ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")),
              f"with dra, memory sharing and the extender: {len(kinds['installed'])} policy objects")
        setup.apply(renders["installed"])
        installed = [p["metadata"]["name"] for p in cluster.json("get", "validatingadmissionpolicies")["items"]]
        check(sorted(installed) == sorted(POLICIES), f"installed: {', '.join(sorted(installed))}")

        print("2. tokens bound to pods on " + NODE)
        node = Node(cluster, NODE, work, *NODES[NODE])
        node.start_kubelet()
        check(node.events.wait("kubelet_started", 0, 60) is not None, f"{NODE}: drakubelet started")
        setup.apply([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": OTHER, "labels": {
            "kubernetes.io/hostname": OTHER, "owner": "ml"}}}])
        setup.apply([pod(f"token-{sa}", NAMESPACE, NODE, sa) for sa in SERVICE_ACCOUNTS.values()]
                    + [pod("victim-here", "default", NODE), pod("victim-there", "default", OTHER)])
        tokens = {component: setup.token(sa, f"token-{sa}") for component, sa in SERVICE_ACCOUNTS.items()}
        for component, api in tokens.items():
            status, review = api.call("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                      {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
            extra = review.get("status", {}).get("userInfo", {}).get("extra", {})
            check(extra.get("authentication.kubernetes.io/node-name") == [NODE],
                  f"{component}'s token names its node: {extra.get('authentication.kubernetes.io/node-name')}")
        took = wait_for_policies(tokens, active=True)
        check(took is not None, f"the policies are enforced ({took:.1f} s after the install)" if took is not None
              else "the policies are enforced")

        print("3. with the policies: each component does its own work")
        labeller_kubeconfig = setup.kubeconfig("labeller", tokens["labeller"], work)
        code = labeller_once(labeller_kubeconfig, "dgx-a100-mig-mixed", work / "labeller.base.log")
        labels = node_labels(setup, NODE)
        check(code == 0 and "nvidia.com/mig-1g.5gb.count" in labels,
              f"labeller: `run --once` with its token labels its own Node (exit {code}, "
              f"{sum(k.startswith('nvidia.com/') for k in labels)} nvidia.com labels)")
        code = labeller_once(labeller_kubeconfig, "dgx-h100", work / "labeller.base.log")
        labels = node_labels(setup, NODE)
        check(code == 0 and labels.get("nvidia.com/gpu.product") == "NVIDIA-H100-80GB-HBM3"
              and not [k for k in labels if k.startswith("nvidia.com/mig-")],
              f"labeller: changes its labels and removes those it no longer computes (exit {code})")
        node.plugin_kubeconfig = str(setup.kubeconfig("dra", tokens["DRA plugin"], work))
        started = node.start_plugin()
        published = wait(lambda: cluster.devices(NODE).get("gpu.nvidia.com"), 60)
        check(published is not None, f"DRA plugin: with its token, publishes its Node's slices "
              f"({time.monotonic() - started:.1f} s, {len(cluster.devices(NODE).get('gpu.nvidia.com', []))} devices)")
        own = cluster.slices(NODE)[0]["metadata"]["name"] if published is not None else "none"
        status, body = tokens["DRA plugin"].call("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{own}")
        back = wait(lambda: len(cluster.devices(NODE).get("gpu.nvidia.com", [])) == 8, 30)
        check(status == 200 and back is not None,
              f"DRA plugin: its token deletes its own Node's slice ({answer(status, body)}); republished")

        with_policies = run_attempts(setup, tokens, "policies", policies_on=True)
        again = wait(lambda: len(cluster.devices(NODE).get("gpu.nvidia.com", [])) == 8, 30)
        check(again is not None, "the DRA plugin's own slices are published (again, after the token deleted them)")

        print("4. the bindings deleted (admissionPolicy.enabled=false, or Kubernetes < 1.30)")
        setup.kubectl("delete", "validatingadmissionpolicybindings", *POLICIES)
        took = wait_for_policies(tokens, active=False)
        check(took is not None, "the policies are no longer enforced")
        without = run_attempts(setup, tokens, "unrestricted", policies_on=False)
        for key, allowed in with_policies.items():
            component, what = key.split("\t")
            table.append((component, what, allowed, without[key]))
    finally:
        if node is not None:
            node.stop(node.plugin)
            node.stop(node.kubelet)
        if not args.keep:
            cluster.down()
    print("\n| component | a stolen token tries to | with the policies | without |\n|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    failed = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed)} checks passed, {len(failed)} failed; logs in {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
