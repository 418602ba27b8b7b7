"""Memory sharing in the chart: the device plugin gets pod access only when a named config shares by
memory, and the ValidatingAdmissionPolicy (on by default where the cluster serves it) limits its pod
patches to pods on its own Node and to gpushare's annotations (its CEL evaluated as the API server would)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.deploy import cluster, find, installed, one, plugin_ds, render
from tests.deploy.cel import Policy

Obj = dict[str, Any]
PLUGIN_USER = "system:serviceaccount:gpu-labeller:gpu-labeller-device-plugin"
MEMORY_NAMED = "version: v1\nsharing:\n  memory:\n    unit: GiB\n"
NAMED = {"config": {"default": "whole", "nodeLabel": "",
                    "data": {"whole": {"version": "v1"}, "gpushare": MEMORY_NAMED}}}
POD_RULE = ([""], ["pods"], ["get", "list", "watch", "patch"])


def rules(objects: list[Obj]) -> list[tuple[list[str], list[str], list[str]]]:
    roles = find(objects, "ClusterRole", "gpu-labeller-device-plugin")
    return [(r["apiGroups"], r["resources"], r["verbs"]) for r in roles[0]["rules"]] if roles else []


def test_pod_access_only_when_a_named_config_shares_by_memory() -> None:
    assert rules(render()) == []
    objects = render(NAMED)
    assert rules(objects) == [POD_RULE]  # no label followed: no Node access either
    assert plugin_ds(objects)["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    binding = one(objects, "ClusterRoleBinding", "gpu-labeller-device-plugin")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-labeller-device-plugin",
                                    "namespace": "gpu-labeller"}]
    following = render({"config": {**NAMED["config"], "nodeLabel": "nvidia.com/device-plugin.config"}})
    assert rules(following) == [([""], ["nodes"], ["get", "list", "watch"]), POD_RULE]
    existing = {"config": {"name": "gpu-configs", "create": False, "nodeLabel": ""}}
    assert rules(render(existing)) == []
    assert rules(render({**existing, "devicePlugin": {"memorySharing": {"enabled": True}}})) == [POD_RULE]


def test_the_pod_policy_comes_only_with_memory_sharing_and_the_policy_switch() -> None:
    where = cluster("1.34.0")
    assert find(render({**NAMED, "admissionPolicy": {"enabled": False}}, **where), "ValidatingAdmissionPolicy") == []
    assert [p["metadata"]["name"] for p in find(installed(render(**where)),
                                                 "ValidatingAdmissionPolicy")] == ["gpu-labeller-own-node-labels"]
    objects = render(NAMED, **where)
    policy = one(objects, "ValidatingAdmissionPolicy", "gpu-labeller-plugin-own-node-pods")
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "gpu-labeller-plugin-own-node-pods")
    assert binding["spec"] == {"policyName": "gpu-labeller-plugin-own-node-pods", "validationActions": ["Deny"]}


@pytest.fixture(scope="module")
def policy() -> Policy:
    objects = render(NAMED, **cluster("1.34.0"))
    return Policy(one(objects, "ValidatingAdmissionPolicy", "gpu-labeller-plugin-own-node-pods")["spec"])


def pod(node: str = "gpu-node-1") -> Obj:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "train", "namespace": "ml", "uid": "u1", "resourceVersion": "7",
                         "labels": {"app": "train"},
                         "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "4",
                                         "ALIYUN_COM_GPU_MEM_ASSIGNED": "false", "team": "vision"}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda",
                                                         "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]},
            "status": {"phase": "Pending"}}


def request(operation: str = "UPDATE", node_name: str | None = "gpu-node-1", username: str = PLUGIN_USER) -> Obj:
    user: Obj = {"username": username, "groups": ["system:serviceaccounts"]}
    if node_name:
        user["extra"] = {"authentication.kubernetes.io/node-name": [node_name]}
    return {"operation": operation, "name": "train", "namespace": "ml", "userInfo": user}


def annotate(old: Obj, **annotations: str | None) -> Obj:
    new = copy.deepcopy(old)
    for key, value in annotations.items():
        if value is None:
            del new["metadata"]["annotations"][key]
        else:
            new["metadata"]["annotations"][key] = value
    new["metadata"]["resourceVersion"] = "8"
    return new


def test_marking_a_pod_on_its_own_node_assigned_is_allowed(policy: Policy) -> None:
    old = pod()
    new = annotate(old, ALIYUN_COM_GPU_MEM_ASSIGNED="true", ALIYUN_COM_GPU_MEM_ASSIGN_TIME="1764040000000000000")
    assert policy.admit(request(), new, old) == (True, [])


def test_a_pod_on_another_node_is_denied(policy: Policy) -> None:
    old = pod("gpu-node-2")
    allowed, messages = policy.admit(request(), annotate(old, ALIYUN_COM_GPU_MEM_ASSIGNED="true"), old)
    assert not allowed
    assert messages == ["the gpu-labeller device plugin may change only pods bound to its own Node "
                        "(token node gpu-node-1), not ml/train"]


def test_a_token_without_the_node_claim_is_denied(policy: Policy) -> None:
    old = pod()
    allowed, _ = policy.admit(request(node_name=None), annotate(old, ALIYUN_COM_GPU_MEM_ASSIGNED="true"), old)
    assert not allowed


@pytest.mark.parametrize(("change", "refused"), [
    ({"team": "infra"}, "team"),
    ({"team": None}, "team"),
    ({"hami.io/vgpu-devices-to-allocate": "GPU-1"}, "hami.io/vgpu-devices-to-allocate"),
], ids=["change", "remove", "add"])
def test_other_annotations_are_denied(policy: Policy, change: dict[str, str | None], refused: str) -> None:
    old = pod()
    allowed, messages = policy.admit(request(), annotate(old, ALIYUN_COM_GPU_MEM_ASSIGNED="true", **change), old)
    assert not allowed
    assert messages == [
        f"the gpu-labeller device plugin may change only ALIYUN_COM_GPU_MEM_* annotations; refused: {refused}"]


@pytest.mark.parametrize("edit", ["label", "spec", "finalizer"])
def test_changes_outside_annotations_are_denied(policy: Policy, edit: str) -> None:
    old = pod()
    new = annotate(old, ALIYUN_COM_GPU_MEM_ASSIGNED="true")
    if edit == "label":
        new["metadata"]["labels"]["app"] = "other"
    elif edit == "spec":
        new["spec"]["containers"][0]["image"] = "evil"
    else:
        new["metadata"]["finalizers"] = ["example.com/hold"]
    allowed, messages = policy.admit(request(), new, old)
    assert not allowed
    assert messages == ["the gpu-labeller device plugin may change only ALIYUN_COM_GPU_MEM_* annotations of a pod."]


def test_creating_or_deleting_pods_is_denied_and_others_are_not_matched(policy: Policy) -> None:
    assert not policy.admit(request("CREATE"), pod(), None)[0]
    assert not policy.admit(request("DELETE"), None, pod())[0]
    old = pod("gpu-node-2")
    new = annotate(old, team="infra")
    assert policy.admit(request(node_name=None, username="kubernetes-admin"), new, old) == (True, [])
    extender = "system:serviceaccount:gpu-labeller:gpu-labeller-scheduler-extender"
    assert policy.admit(request(username=extender), new, old) == (True, [])
