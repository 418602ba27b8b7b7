"""The ValidatingAdmissionPolicies: when the chart installs them (admissionPolicy.enabled: auto, the default,
wherever the cluster serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy), what NOTES.txt says
without them, and the labeller's Node policy: its shape, and its CEL evaluated on admission requests
(tests.deploy.cel emulates the API server)."""

from __future__ import annotations

import copy
from typing import Any

import helm_python
import pytest

from labeller.model.labels import FIELD_MANAGER, NOT_OWNED_KEYS, NOT_OWNED_PREFIXES, OWNED_KEYS, OWNED_PREFIXES
from tests.deploy import cluster, installed, notes, one, render
from tests.deploy.cel import Policy

Obj = dict[str, Any]
USERNAME = "system:serviceaccount:gpu-labeller:gpu-labeller"
DRA_USERNAME = "system:serviceaccount:gpu-labeller:gpu-labeller-dra-plugin"
PLUGIN_USERNAME = "system:serviceaccount:gpu-labeller:gpu-labeller-device-plugin"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
POLICY_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
LABELLER = [f"{kind}/gpu-labeller-own-node-labels" for kind in KINDS]
DRA = [f"{kind}/gpu-labeller-dra-plugin-own-node-slices" for kind in KINDS]
PODS = [f"{kind}/gpu-labeller-plugin-own-node-pods" for kind in KINDS]
MEMORY_SHARING = {"config": {"nodeLabel": "", "data": {"whole": {"version": "v1"}, "gpushare": {
    "version": "v1", "sharing": {"memory": {"unit": "GiB"}}}}, "default": "whole"}}


def policy_and_binding(values: dict[str, Any] | None = None) -> tuple[Obj, Obj]:
    """The labeller's policy as the chart's defaults install it on a 1.34 cluster."""
    objects = installed(render(values, **cluster("1.34.0")))
    return one(objects, "ValidatingAdmissionPolicy"), one(objects, "ValidatingAdmissionPolicyBinding")


def policies(objects: list[Obj]) -> list[str]:
    """The policies `helm install` creates (the prune Job's is a post-delete hook: test_deploy_prune.py)."""
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in installed(objects) if o["kind"] in KINDS)


# --- admissionPolicy.enabled: auto (the default), true, false -------------------------------------

@pytest.mark.parametrize("kube_version", ["1.30.0", "1.34.0", "1.37.0"])
def test_the_defaults_install_the_policies_wherever_the_cluster_serves_them(kube_version: str) -> None:
    assert policies(render(**cluster(kube_version))) == LABELLER
    assert policies(render(MEMORY_SHARING, **cluster(kube_version))) == sorted(LABELLER + PODS)


def test_the_defaults_install_the_dra_plugins_policy_with_dra() -> None:
    assert policies(render({"dra": {"enabled": True}}, **cluster("1.34.0"))) == sorted(LABELLER + DRA)


@pytest.mark.parametrize("kube_version", ["1.27.0", "1.29.0"])
def test_the_defaults_install_no_policy_where_the_cluster_does_not_serve_it(kube_version: str) -> None:
    assert policies(render(MEMORY_SHARING, **cluster(kube_version))) == []


def test_offline_auto_installs_the_policies_only_when_told_the_api_is_served() -> None:
    # `helm template` knows no cluster: only its own group versions (admissionregistration.k8s.io/v1 is
    # served since 1.16 for webhooks, so the kind is what tells), and what --api-versions adds.
    assert policies(render({"dra": {"enabled": True}})) == []
    assert policies(render({"dra": {"enabled": True}}, api_versions=(POLICY_API,))) == sorted(LABELLER + DRA)


def test_false_installs_no_policy_even_where_the_cluster_serves_it() -> None:
    values = {**MEMORY_SHARING, "dra": {"enabled": True}, "admissionPolicy": {"enabled": False}}
    assert policies(render(values, **cluster("1.34.0"))) == []


def test_true_installs_the_policies_offline_as_asked() -> None:
    # helm template and helm lint (no cluster): the user says the cluster serves it
    assert policies(render({"admissionPolicy": {"enabled": True}})) == LABELLER
    assert policies(render({"admissionPolicy": {"enabled": True}}, **cluster("1.30.0"))) == LABELLER


@pytest.mark.parametrize("where", [cluster("1.29.0"), {"kube_version": "1.29.0"}], ids=["install", "template"])
def test_true_fails_the_render_on_a_cluster_without_the_api(where: dict[str, Any]) -> None:
    with pytest.raises(helm_python.errors.HelmRenderError) as error:
        render({"admissionPolicy": {"enabled": True}}, **where)
    assert ("admissionPolicy.enabled is true but this cluster (Kubernetes v1.29.0) does not serve "
            "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes >= 1.30): set "
            "admissionPolicy.enabled to auto or false") in str(error.value)


@pytest.mark.parametrize("value", ["yes", "on", "True", 1])
def test_the_switch_is_auto_true_or_false(value: object) -> None:
    with pytest.raises(helm_python.errors.HelmValuesError, match="admissionPolicy/enabled"):
        render({"admissionPolicy": {"enabled": value}}, **cluster("1.34.0"))


def words(text: str) -> str:
    return " ".join(text.split())


def test_notes_say_what_is_unrestricted_where_the_cluster_does_not_serve_the_policy() -> None:
    text = words(notes({**MEMORY_SHARING, "dra": {"enabled": True}}, **cluster("1.29.0")))
    assert ("WARNING: no ValidatingAdmissionPolicy is installed (admissionPolicy.enabled=auto: this cluster does "
            "not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, Kubernetes < 1.30)") in text
    assert (f"the labeller's ({USERNAME}) may patch every Node: relabel, taint and cordon any node") in text
    assert (f"the DRA plugin's ({DRA_USERNAME}) may create, update and delete every ResourceSlice: publish "
            "devices for any node or for all nodes, delete every node's and every driver's slices") in text
    assert f"the device plugin's ({PLUGIN_USERNAME}) may patch every pod" in text
    assert "docs/security.md" in text


def test_notes_say_what_is_unrestricted_when_the_policy_is_turned_off() -> None:
    text = words(notes({"admissionPolicy": {"enabled": False}}, **cluster("1.34.0")))
    assert "WARNING: no ValidatingAdmissionPolicy is installed (admissionPolicy.enabled=false)." in text
    assert f"the labeller's ({USERNAME}) may patch every Node" in text
    assert "DRA plugin" not in text and "device plugin's" not in text  # neither has write access here


def test_notes_offline_say_how_to_tell_helm_template_the_api_is_served() -> None:
    text = words(notes())
    assert ("admissionPolicy.enabled=auto: rendered without the cluster's API versions; `helm template` needs "
            "--api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy)") in text


def test_notes_name_the_installed_policies_and_warn_of_nothing() -> None:
    text = words(notes({**MEMORY_SHARING, "dra": {"enabled": True}}, **cluster("1.34.0")))
    assert "WARNING" not in text and "may patch every" not in text
    for name in ("gpu-labeller-own-node-labels", "gpu-labeller-dra-plugin-own-node-slices",
                 "gpu-labeller-plugin-own-node-pods"):
        assert f"- {name}: " in text


def test_notes_warn_of_nothing_where_no_token_may_write() -> None:
    # features.d output without events: the labeller has no API access at all
    values = {"labeller": {"output": "features-file"}, "admissionPolicy": {"enabled": False}}
    text = words(notes(values, **cluster("1.34.0")))
    assert "is installed in namespace gpu-labeller" in text and "docs/security.md" in text
    assert "WARNING" not in text and "may patch every" not in text


# --- the labeller's Node policy -------------------------------------------------------------------


def test_policy_shape() -> None:
    policy, binding = policy_and_binding()
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes"], "operations": ["CREATE", "UPDATE"]}]
    assert spec["matchConditions"] == [
        {"name": "labeller-service-account", "expression": f"request.userInfo.username == '{USERNAME}'"}]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_username_follows_namespace_and_service_account_overrides() -> None:
    policy, _ = policy_and_binding({"namespaceOverride": "gpus", "labeller": {"serviceAccount": {"name": "lab"}}})
    assert "'system:serviceaccount:gpus:lab'" in policy["spec"]["matchConditions"][0]["expression"]


def test_prefix_lists_match_the_labeller() -> None:
    variables = {v["name"]: v["expression"] for v in policy_and_binding()[0]["spec"]["variables"]}
    assert variables["ownedPrefixes"] == "[" + ",".join(f'"{p}"' for p in OWNED_PREFIXES) + "]"
    assert variables["ownedKeys"] == "[" + ",".join(f'"{k}"' for k in OWNED_KEYS) + "]"
    assert variables["notOwnedPrefixes"] == "[" + ",".join(f'"{p}"' for p in NOT_OWNED_PREFIXES) + "]"
    assert variables["notOwnedKeys"] == "[" + ",".join(f'"{k}"' for k in NOT_OWNED_KEYS) + "]"
    assert f"e.manager == '{FIELD_MANAGER}'" in variables["labellerLabelFields"]


# --- CEL evaluation -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy(policy_and_binding()[0]["spec"])


def fields_entry(manager: str, operation: str, *keys: str, subresource: str | None = None) -> Obj:
    """A managedFields entry as a real API server stores it."""
    entry: Obj = {"manager": manager, "operation": operation, "apiVersion": "v1", "time": "2026-11-23T10:00:00Z",
                  "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in keys}}}}
    if subresource:
        entry["subresource"] = subresource
    return entry


def node(name: str = "gpu-node-1", managed_fields: list[Obj] | None = None, **labels: str) -> Obj:
    if managed_fields is None:
        managed_fields = [fields_entry("kubelet", "Update", "kubernetes.io/hostname"),
                          fields_entry("kubectl-label", "Update", "team", "nvidia.com/gpu.deploy.device-plugin"),
                          fields_entry(FIELD_MANAGER, "Apply", "nvidia.com/gpu.count")]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "100", "labels": {
            "kubernetes.io/hostname": name, "team": "ml", "nvidia.com/gpu.count": "1",
            "nvidia.com/gpu.deploy.device-plugin": "true", **labels},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"}, "managedFields": managed_fields},
        "spec": {"podCIDR": "10.0.1.0/24", "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {"capacity": {"cpu": "8"}},
    }


def request(operation: str = "UPDATE", node_name: str | None = "gpu-node-1", username: str = USERNAME) -> Obj:
    extra = {NODE_NAME_CLAIM: [node_name], "authentication.kubernetes.io/node-uid": ["abc"]} if node_name else {}
    user: Obj = {"username": username, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if extra:
        user["extra"] = extra
    return {"operation": operation, "name": "gpu-node-1", "userInfo": user}


def relabel(old: Obj, set_: dict[str, str] | None = None, remove: tuple[str, ...] = ()) -> Obj:
    new = copy.deepcopy(old)
    new["metadata"]["labels"].update(set_ or {})
    for key in remove:
        del new["metadata"]["labels"][key]
    new["metadata"]["resourceVersion"] = "101"
    new["metadata"]["managedFields"] = [{"manager": "gpu-labeller", "operation": "Apply"}]
    return new


def test_every_expression_compiles(policy: Policy) -> None:
    spec = policy.spec
    expressions = [c["expression"] for c in spec["matchConditions"]] + [v["expression"] for v in spec["variables"]]
    for validation in spec["validations"]:
        expressions += [validation["expression"],
                        *([validation["messageExpression"]] if "messageExpression" in validation else [])]
    for expression in expressions:
        policy.program(expression)


@pytest.mark.parametrize("change", [
    {"set_": {"nvidia.com/gpu.count": "2"}},
    {"set_": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/cuda.driver.major": "550"}},
    {"set_": {"amd.com/gpu.family": "AI", "beta.amd.com/gpu.device-id.74a1": "8"}},
    {"set_": {"nvidia.com/mig.capable": "true", "nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/gfd.timestamp": "1"}},
    {"remove": ("nvidia.com/gpu.count",)},
    {"set_": {"nvidia.com/device-plugin.config.state": "failed", "nvidia.com/device-plugin.config.applied": "ts4"}},
    {"set_": {"gpushare": "true", "nvidia.com/gpu.sharing-strategy": "memory"}},
    {},  # nothing but managedFields/resourceVersion
], ids=["change", "add-nvidia", "add-amd", "add-mig", "remove", "config-state", "gpushare", "no-op"])
def test_own_node_and_owned_labels_are_allowed(policy: Policy, change: dict[str, Any]) -> None:
    old = node()
    allowed, messages = policy.admit(request(), relabel(old, **change), old)
    assert allowed, messages


def test_node_without_labels_can_get_its_first_labels(policy: Policy) -> None:
    old = node()
    del old["metadata"]["labels"]
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"nvidia.com/gpu.present": "true"}
    assert policy.admit(request(), new, old) == (True, [])


def test_another_node_is_denied(policy: Policy) -> None:
    old = node("gpu-node-2")
    allowed, messages = policy.admit(request(node_name="gpu-node-1"), relabel(old, {"nvidia.com/gpu.count": "2"}), old)
    assert not allowed
    assert "only its own Node" in messages[0] and "gpu-node-2" in messages[0]


def test_token_without_node_claim_is_denied(policy: Policy) -> None:
    old = node()
    allowed, _ = policy.admit(request(node_name=None), relabel(old, {"nvidia.com/gpu.count": "2"}), old)
    assert not allowed


@pytest.mark.parametrize(("change", "refused"), [
    ({"set_": {"team": "infra"}}, "team"),
    ({"set_": {"node-role.kubernetes.io/gpu": ""}}, "node-role.kubernetes.io/gpu"),
    ({"remove": ("team",)}, "team"),
    ({"set_": {"nvidia.com/gpu.deploy.device-plugin": "false"}}, "nvidia.com/gpu.deploy.device-plugin"),
    ({"set_": {"nvidia.com/gpu.workload.config": "vm-passthrough"}}, "nvidia.com/gpu.workload.config"),
    ({"set_": {"nvidia.com/mig.config": "all-1g.10gb"}}, "nvidia.com/mig.config"),
    ({"set_": {"nvidia.com/device-plugin.config": "x"}}, "nvidia.com/device-plugin.config"),
    ({"set_": {"gpushare.example.com/x": "y"}}, "gpushare.example.com/x"),  # an owned key is not a prefix
], ids=["change-foreign", "add-foreign", "remove-foreign", "gpu-operator-deploy", "workload-config", "mig-config",
        "plugin-config", "gpushare-prefix"])
def test_foreign_labels_are_denied(policy: Policy, change: dict[str, Any], refused: str) -> None:
    old = node()
    new = (relabel(old, **{"set_": {"nvidia.com/gpu.count": "2"}, **change}) if "set_" in change
           else relabel(old, **change))
    allowed, messages = policy.admit(request(), new, old)
    assert not allowed
    assert messages[0] == f"gpu-labeller may change only the label keys it owns; refused: {refused}"


def test_gpu_operator_keys_under_our_prefixes_are_denied(policy: Policy) -> None:
    old = node()
    for key in ("nvidia.com/vgpu.config", "nvidia.com/vgpu.config.state", "nvidia.com/mig.config.state"):
        allowed, messages = policy.admit(request(), relabel(old, {key: "x"}), old)
        assert not allowed and messages == [f"gpu-labeller may change only the label keys it owns; refused: {key}"]


REMOVAL_REFUSED = "gpu-labeller may remove only labels it set (managedFields manager gpu-labeller); refused: "


@pytest.mark.parametrize("entries", [
    [fields_entry(FIELD_MANAGER, "Apply", "nvidia.com/gpu.count")],
    [fields_entry(FIELD_MANAGER, "Update", "nvidia.com/gpu.count")],  # an older version's merge patch
    [fields_entry("kubectl-label", "Update", "team"),
     fields_entry(FIELD_MANAGER, "Apply", "nvidia.com/gpu.count", "x")],
], ids=["applied", "updated", "among-others"])
def test_removing_a_label_gpu_labeller_set_is_allowed(policy: Policy, entries: list[Obj]) -> None:
    old = node(managed_fields=entries)
    assert policy.admit(request(), relabel(old, remove=("nvidia.com/gpu.count",)), old) == (True, [])


@pytest.mark.parametrize("entries", [
    [fields_entry("kubectl-label", "Update", "nvidia.com/gpu.count")],
    [fields_entry(FIELD_MANAGER, "Update", "nvidia.com/gpu.count", subresource="status")],
    [fields_entry("gpu-feature-discovery", "Apply", "nvidia.com/gpu.count"),
     {"manager": FIELD_MANAGER, "operation": "Apply"}],
    [],
], ids=["someone-else", "subresource", "other-applier", "no-managed-fields"])
def test_removing_a_label_gpu_labeller_did_not_set_is_denied(policy: Policy, entries: list[Obj]) -> None:
    old = node(managed_fields=entries)
    allowed, messages = policy.admit(request(), relabel(old, remove=("nvidia.com/gpu.count",)), old)
    assert not allowed and messages == [REMOVAL_REFUSED + "nvidia.com/gpu.count"]


def test_taking_over_a_label_another_manager_set_is_allowed(policy: Policy) -> None:
    """Adoption: gpu-labeller's forced apply changes a computed key that someone else set."""
    old = node(managed_fields=[fields_entry("kubectl-label", "Update", "nvidia.com/gpu.count")])
    assert policy.admit(request(), relabel(old, {"nvidia.com/gpu.count": "8"}), old) == (True, [])


def test_a_node_without_managed_fields_allows_adding(policy: Policy) -> None:
    old = node()
    del old["metadata"]["managedFields"]
    assert policy.admit(request(), relabel(old, {"nvidia.com/gpu.present": "true"}), old) == (True, [])
    allowed, messages = policy.admit(request(), relabel(old, remove=("nvidia.com/gpu.count",)), old)
    assert not allowed and messages == [REMOVAL_REFUSED + "nvidia.com/gpu.count"]


@pytest.mark.parametrize("edit", ["taint", "unschedulable", "annotation", "finalizer", "owner"])
def test_changes_outside_labels_are_denied(policy: Policy, edit: str) -> None:
    old = node()
    new = relabel(old, {"nvidia.com/gpu.count": "2"})
    if edit == "taint":
        new["spec"]["taints"] = []
    elif edit == "unschedulable":
        new["spec"]["unschedulable"] = True
    elif edit == "annotation":
        new["metadata"]["annotations"]["x"] = "y"
    elif edit == "finalizer":
        new["metadata"]["finalizers"] = ["example.com/hold"]
    else:
        new["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "1"}]
    allowed, messages = policy.admit(request(), new, old)
    assert not allowed
    assert messages == ["gpu-labeller may change only labels of its Node."]


def test_creating_a_node_is_denied(policy: Policy) -> None:
    allowed, messages = policy.admit(request("CREATE"), node(), None)
    assert not allowed and "may not create Nodes." in messages[0]


def test_other_users_are_not_matched(policy: Policy) -> None:
    old = node("gpu-node-2")
    new = relabel(old, {"team": "infra"})
    assert policy.admit(request(node_name=None, username="kubernetes-admin"), new, old) == (True, [])
    other_sa = "system:serviceaccount:gpu-operator:gpu-operator"
    assert policy.admit(request(username=other_sa), new, old) == (True, [])
