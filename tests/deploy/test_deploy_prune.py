"""Uninstalling leaves no label of gpu-labeller's (postDeleteCleanup: the prune Job, a post-delete hook, and the
plain manifests' prune files), and the prune Job's ValidatingAdmissionPolicy (its CEL evaluated as the API server
does, tests.deploy.cel) lets it only remove labels gpu-labeller set. And simulate.profile, for demos and CI: the
simulated node on every component. tests/e2e/e2e_node.py does both on a real node."""

from __future__ import annotations

import copy
from typing import Any

import helm_python
import pytest
import yaml
from kubernetes_validate import utils as kv

from labeller.model.labels import FIELD_MANAGER
from tests.deploy import (
    CHART,
    MANIFESTS,
    MIN_KUBE_VERSION,
    cluster,
    dra_ds,
    find,
    hooks,
    installed,
    labeller_ds,
    notes,
    one,
    plugin_ds,
    render,
)
from tests.deploy.cel import Policy
from tests.deploy.test_deploy_admission_policy import fields_entry, node, relabel, request

Obj = dict[str, Any]
PRUNE = "gpu-labeller-prune"
PRUNE_USER = f"system:serviceaccount:gpu-labeller:{PRUNE}"
RBAC_AND_POLICY = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                   "ValidatingAdmissionPolicyBinding"]


def names(objects: list[Obj]) -> list[str]:
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)


# --- the post-delete hook -------------------------------------------------------------------------

def test_the_defaults_prune_on_uninstall_with_a_post_delete_job_and_its_own_rbac() -> None:
    objects = render(**cluster("1.34.0"))
    assert names(hooks(objects, "post-delete")) == [
        "ClusterRole/gpu-labeller-prune", "ClusterRoleBinding/gpu-labeller-prune", "Job/gpu-labeller-prune",
        "ServiceAccount/gpu-labeller-prune", "ValidatingAdmissionPolicy/gpu-labeller-prune-labels",
        "ValidatingAdmissionPolicyBinding/gpu-labeller-prune-labels"]
    # Everything the Job needs is created before it (a lower weight) and deleted once every hook succeeded; a
    # failed Job stays for `kubectl logs`.
    for obj in hooks(objects, "post-delete"):
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook-weight"] == ("0" if obj["kind"] == "Job" else "-10"), obj["kind"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert not [o for o in installed(objects) if "prune" in o["metadata"]["name"]]


def test_the_prune_job_removes_only_what_gpu_labeller_set_with_nodes_get_list_patch() -> None:
    objects = render()
    job = one(objects, "Job", PRUNE)
    pod = job["spec"]["template"]["spec"]
    (box,) = pod["containers"]
    assert box["args"] == ["cleanup", "--all-nodes"]  # never --include-foreign
    assert one(objects, "ClusterRole", PRUNE)["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]
    binding = one(objects, "ClusterRoleBinding", PRUNE)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PRUNE, "namespace": "gpu-labeller"}]
    assert binding["roleRef"]["name"] == PRUNE and pod["serviceAccountName"] == PRUNE
    assert pod["restartPolicy"] == "Never" and job["spec"]["activeDeadlineSeconds"] <= 300  # Helm waits 5 min
    # as the labeller: non-root, nothing writable, no capability; the chart's image and tolerations
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert box["securityContext"]["readOnlyRootFilesystem"] is True
    assert box["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert box["securityContext"]["allowPrivilegeEscalation"] is False
    labeller = labeller_ds(objects)["spec"]["template"]["spec"]
    assert box["image"] == labeller["containers"][0]["image"]
    assert pod["tolerations"] == labeller["tolerations"] and pod["nodeSelector"] == labeller["nodeSelector"]


@pytest.mark.parametrize("values", [{"postDeleteCleanup": False}, {"labeller": {"output": "features-file"}},
                                    {"labeller": {"output": "nodefeature"}}],
                         ids=["off", "features-file", "nodefeature"])
def test_no_prune_when_turned_off_or_when_the_labeller_writes_no_node_labels(values: Obj) -> None:
    objects = render({**values, "createNamespace": True}, **cluster("1.34.0"))
    assert hooks(objects, "post-delete") == []
    assert "helm.sh/resource-policy" not in (one(objects, "Namespace")["metadata"].get("annotations") or {})
    assert "helm uninstall" not in notes(values, **cluster("1.34.0"))


def test_no_prune_policy_where_the_cluster_serves_none() -> None:
    assert [o["kind"] for o in hooks(render(**cluster("1.29.0")), "post-delete")] == [
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"]


def test_a_namespace_the_chart_renders_outlives_helm_uninstall_for_the_prune_job() -> None:
    # Helm deletes the release's objects, the Namespace among them, before the post-delete hook: a namespace
    # being deleted admits no new Job, so the uninstall would fail and leave every label.
    namespace = one(render({"createNamespace": True}), "Namespace")
    assert namespace["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_notes_say_that_uninstall_removes_the_labels() -> None:
    assert "`helm uninstall` removes the labels gpu-labeller set from every Node" in notes()


# --- the prune Job's policy -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy(one(render(**cluster("1.34.0")), "ValidatingAdmissionPolicy", f"{PRUNE}-labels")["spec"])


def prune_request(operation: str = "UPDATE") -> Obj:
    return request(operation, node_name=None, username=PRUNE_USER)


def test_the_policy_is_bound_and_fails_closed() -> None:
    objects = render(**cluster("1.34.0"))
    assert one(objects, "ValidatingAdmissionPolicyBinding", f"{PRUNE}-labels")["spec"] == {
        "policyName": f"{PRUNE}-labels", "validationActions": ["Deny"]}
    spec = one(objects, "ValidatingAdmissionPolicy", f"{PRUNE}-labels")["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConditions"] == [{"name": "prune-service-account",
                                        "expression": f"request.userInfo.username == '{PRUNE_USER}'"}]


@pytest.mark.parametrize("entries", [
    [fields_entry(FIELD_MANAGER, "Apply", "nvidia.com/gpu.count")],
    [fields_entry(FIELD_MANAGER, "Update", "nvidia.com/gpu.count")],  # an older version's merge patch
], ids=["applied", "updated"])
def test_removing_labels_gpu_labeller_set_on_any_node_is_allowed(policy: Policy, entries: list[Obj]) -> None:
    for name in ("gpu-node-1", "gpu-node-2"):  # every Node: the Job runs on one, cleans all
        old = node(name, managed_fields=entries)
        assert policy.admit(prune_request(), relabel(old, remove=("nvidia.com/gpu.count",)), old) == (True, [])


def test_releasing_a_label_changes_no_label_and_is_allowed(policy: Policy) -> None:
    old = node()
    assert policy.admit(prune_request(), relabel(old), old) == (True, [])


@pytest.mark.parametrize(("change", "refused"), [
    ({"remove": ("team",)}, "may remove only the label keys gpu-labeller owns; refused: team"),
    ({"remove": ("nvidia.com/gpu.deploy.device-plugin",)},
     "may remove only the label keys gpu-labeller owns; refused: nvidia.com/gpu.deploy.device-plugin"),
    ({"set_": {"nvidia.com/gpu.count": "2"}}, "may only remove labels; refused: nvidia.com/gpu.count"),
    ({"set_": {"nvidia.com/gpu.present": "true"}}, "may only remove labels; refused: nvidia.com/gpu.present"),
], ids=["foreign", "gpu-operator", "change", "add"])
def test_anything_but_removing_gpu_labellers_labels_is_refused(policy: Policy, change: Obj, refused: str) -> None:
    old = node()
    allowed, messages = policy.admit(prune_request(), relabel(old, **change), old)
    assert not allowed and f"the gpu-labeller prune Job {refused}" in messages


def test_a_label_under_gpu_labellers_prefix_that_it_did_not_set_is_refused(policy: Policy) -> None:
    old = node(managed_fields=[fields_entry("kubectl-label", "Update", "nvidia.com/gpu.count")])
    allowed, messages = policy.admit(prune_request(), relabel(old, remove=("nvidia.com/gpu.count",)), old)
    assert not allowed and messages == [
        "the gpu-labeller prune Job may remove only labels gpu-labeller set (managedFields manager gpu-labeller); "
        "refused: nvidia.com/gpu.count"]


@pytest.mark.parametrize("edit", ["taint", "unschedulable", "annotation"])
def test_changes_outside_labels_are_refused(policy: Policy, edit: str) -> None:
    old = node()
    new = relabel(old, remove=("nvidia.com/gpu.count",))
    if edit == "taint":
        new["spec"]["taints"] = []
    elif edit == "unschedulable":
        new["spec"]["unschedulable"] = True
    else:
        new["metadata"]["annotations"]["x"] = "y"
    allowed, messages = policy.admit(prune_request(), new, old)
    assert not allowed and messages == ["the gpu-labeller prune Job may change only labels of a Node."]


def test_creating_a_node_is_refused_and_other_users_are_not_matched(policy: Policy) -> None:
    allowed, messages = policy.admit(prune_request("CREATE"), node(), None)
    assert not allowed and "may not create Nodes." in messages[0]
    old = node()
    new = relabel(old, {"team": "infra"})
    assert policy.admit(request(node_name=None, username="kubernetes-admin"), new, old) == (True, [])


# --- the plain manifests' prune files -------------------------------------------------------------

@pytest.mark.parametrize(("name", "policy_kinds"), [
    ("prune/gpu-labeller-prune.yaml", []),
    ("prune/gpu-labeller-prune-k8s1.30.yaml", ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"])])
def test_the_prune_files_hold_the_namespace_the_job_and_what_it_needs(name: str, policy_kinds: list[str]) -> None:
    objects = [o for o in yaml.safe_load_all((MANIFESTS / name).read_text()) if o]
    # `kubectl apply -f` creates them in this order: the Job last, once its account, RBAC and policy exist
    assert [o["kind"] for o in objects] == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                            *policy_kinds, "Job"]
    assert one(objects, "Job")["spec"]["template"]["spec"]["containers"][0]["args"] == ["cleanup", "--all-nodes"]


@pytest.mark.parametrize(("name", "kube_version"), [("prune/gpu-labeller-prune.yaml", MIN_KUBE_VERSION),
                                                    ("prune/gpu-labeller-prune-k8s1.30.yaml", "1.30.0")])
def test_the_prune_files_are_valid_on_the_oldest_kubernetes_they_are_for(name: str, kube_version: str) -> None:
    for obj in yaml.safe_load_all((MANIFESTS / name).read_text()):
        if obj:
            kv.validate(obj, kube_version, strict=True)


def test_the_main_files_carry_no_prune_job() -> None:
    # `kubectl apply -f deploy/manifests/` (not recursive) must never run it: the labeller would put every label back
    for path in MANIFESTS.glob("*.yaml"):
        objects = [o for o in yaml.safe_load_all(path.read_text()) if o]
        assert not find(objects, "Job") and not [o for o in objects if "prune" in o["metadata"]["name"]], path.name


# --- simulate.profile -----------------------------------------------------------------------------

SIMULATED = {"simulate": {"profile": "dgx-h100"}, "dra": {"enabled": True},
             "config": {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu",
                                                                              "replicas": 2}]}}}}


def env(box: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in box.get("env", [])}


def test_the_simulated_profile_reaches_every_component_that_probes_the_node() -> None:
    objects = render(SIMULATED, **cluster("1.34.0"))
    boxes = {box["name"]: box for ds in (labeller_ds(objects), plugin_ds(objects), dra_ds(objects))
             for box in ds["spec"]["template"]["spec"]["containers"]}
    assert sorted(boxes) == ["device-plugin", "dra-plugin", "labeller", "mps-control-daemon"]
    for name, box in boxes.items():
        assert env(box)["GPU_LABELLER_SIMULATE"] == "dgx-h100", name
    assert "FOR DEMOS AND CI ONLY: simulate.profile=dgx-h100" in notes(SIMULATED, **cluster("1.34.0"))


def test_no_simulation_by_default() -> None:
    objects = render({k: v for k, v in SIMULATED.items() if k != "simulate"}, **cluster("1.34.0"))
    for ds in find(objects, "DaemonSet"):
        for box in ds["spec"]["template"]["spec"]["containers"]:
            assert "GPU_LABELLER_SIMULATE" not in env(box)
    assert "FOR DEMOS" not in notes()


def test_every_built_in_profile_name_is_one_the_schema_takes() -> None:
    from vendors.simulate import builtin_profiles

    assert builtin_profiles()
    for name in builtin_profiles():
        render({"simulate": {"profile": name}})


def refuses(values: Obj) -> str:
    chart = helm_python.Chart.load(CHART)
    try:
        with pytest.raises(helm_python.HelmError) as error:
            chart.render(values, name="gpu-labeller", namespace="gpu-labeller")
    finally:
        chart.close()
    return str(error.value)


@pytest.mark.parametrize("profile", ["DGX-H100", "../etc/passwd", "/profiles/x.yaml", "dgx h100", "-x"])
def test_the_schema_takes_only_a_profile_name(profile: str) -> None:
    assert "at '/simulate/profile'" in refuses({"simulate": {"profile": profile}})


def test_simulate_profile_and_the_same_variable_in_extra_env_are_refused() -> None:
    values = copy.deepcopy(SIMULATED)
    values["devicePlugin"] = {"extraEnv": [{"name": "GPU_LABELLER_SIMULATE", "value": "mi210-x8"}]}
    assert "simulate.profile and devicePlugin.extraEnv both set GPU_LABELLER_SIMULATE" in refuses(values)
