"""The DRA plugin's ValidatingAdmissionPolicy: its ServiceAccount may write only ResourceSlices of its own
Node (the token's node-name claim), of gpu-labeller's drivers, in the pool named after that Node. Its
CEL is evaluated on the slices `gpu-labeller resourceslices` prints (tests.deploy.cel emulates the API
server)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from click.testing import CliRunner

from labeller.cli.root import main
from tests.deploy import cluster, find, one, render
from tests.deploy.cel import Policy
from vendors import VENDORS

Obj = dict[str, Any]
NAME = "gpu-labeller-dra-plugin-own-node-slices"
USERNAME = "system:serviceaccount:gpu-labeller:gpu-labeller-dra-plugin"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
DRIVERS = [v.dra.driver for v in VENDORS if v.dra is not None]


def policy_and_binding(values: dict[str, Any] | None = None) -> tuple[Obj, Obj]:
    """The DRA plugin's policy as the chart's defaults with dra.enabled install it on a 1.34 cluster."""
    objects = render({"dra": {"enabled": True}, **(values or {})}, **cluster("1.34.0"))
    return one(objects, "ValidatingAdmissionPolicy", NAME), one(objects, "ValidatingAdmissionPolicyBinding", NAME)


def test_policy_comes_with_dra_and_the_policy_switch_only() -> None:
    off = {"dra": {"enabled": True}, "admissionPolicy": {"enabled": False}}
    assert find(render(off, **cluster("1.34.0")), "ValidatingAdmissionPolicy") == []
    assert find(render(**cluster("1.34.0")), "ValidatingAdmissionPolicy", NAME) == []
    policy, binding = policy_and_binding()
    assert binding["spec"] == {"policyName": NAME, "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    # every version of the API is checked as v1 (matchPolicy Equivalent converts), every write verb
    assert policy["spec"]["matchConstraints"] == {"matchPolicy": "Equivalent", "resourceRules": [
        {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "resources": ["resourceslices"],
         "operations": ["CREATE", "UPDATE", "DELETE"]}]}
    assert policy["spec"]["matchConditions"] == [
        {"name": "dra-plugin-service-account", "expression": f"request.userInfo.username == '{USERNAME}'"}]


def test_username_follows_namespace_and_service_account_overrides() -> None:
    policy, _ = policy_and_binding({"namespaceOverride": "gpus",
                                    "dra": {"enabled": True, "serviceAccount": {"name": "dra"}}})
    assert "'system:serviceaccount:gpus:dra'" in policy["spec"]["matchConditions"][0]["expression"]


def test_drivers_are_the_vendors() -> None:
    variables = {v["name"]: v["expression"] for v in policy_and_binding()[0]["spec"]["variables"]}
    assert json.loads(variables["drivers"]) == DRIVERS == ["gpu.nvidia.com", "gpu.amd.com"]


# --- CEL evaluation -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy(policy_and_binding()[0]["spec"])


def test_every_expression_compiles(policy: Policy) -> None:
    spec = policy.spec
    expressions = [c["expression"] for c in spec["matchConditions"]] + [v["expression"] for v in spec["variables"]]
    for validation in spec["validations"]:
        expressions += [validation["expression"],
                        *([validation["messageExpression"]] if "messageExpression" in validation else [])]
    for expression in expressions:
        policy.program(expression)


def published_slice(node: str = "gpu-node-1", driver: str = "gpu.nvidia.com") -> Obj:
    """A slice as the DRA plugin publishes it for ``node`` (gpu-labeller resourceslices, mixed node)."""
    result = CliRunner().invoke(main, ["resourceslices", "--simulate", "mixed-l40s-mi210", "--dra-vendors", "all",
                                       "--node-name", node, "--format", "json"])
    assert result.exit_code == 0, result.output
    (found,) = [s for s in json.loads(result.stdout)["items"] if s["spec"]["driver"] == driver]
    found["metadata"].update({"uid": "u-1", "resourceVersion": "7"})
    slice_: Obj = found
    return slice_


def request(operation: str, node_name: str | None = "gpu-node-1", username: str = USERNAME) -> Obj:
    user: Obj = {"username": username, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if node_name:
        user["extra"] = {NODE_NAME_CLAIM: [node_name], "authentication.kubernetes.io/node-uid": ["abc"]}
    return {"operation": operation, "userInfo": user}


def republished(old: Obj) -> Obj:
    """The same slice, one device fewer and the pool's generation bumped (an unhealthy GPU left it)."""
    new = copy.deepcopy(old)
    new["spec"]["devices"] = new["spec"]["devices"][1:]
    new["spec"]["pool"]["generation"] += 1
    return new


@pytest.mark.parametrize("driver", DRIVERS)
def test_its_own_nodes_slices_of_its_drivers_are_allowed(policy: Policy, driver: str) -> None:
    own = published_slice(driver=driver)
    assert policy.admit(request("CREATE"), own, None) == (True, [])
    assert policy.admit(request("UPDATE"), republished(own), own) == (True, [])
    assert policy.admit(request("DELETE"), None, own) == (True, [])  # a stale slice replaced at start


OTHER_NODE = "may write only ResourceSlices of its own Node (token node gpu-node-1), not one of gpu-node-2"


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_another_nodes_slice_is_refused(policy: Policy, operation: str) -> None:
    other = published_slice("gpu-node-2")
    new, old = {"CREATE": (other, None), "UPDATE": (republished(other), other), "DELETE": (None, other)}[operation]
    allowed, messages = policy.admit(request(operation), new, old)
    assert not allowed and any(OTHER_NODE in m for m in messages), messages


@pytest.mark.parametrize("operation", ["CREATE", "DELETE"])
def test_another_drivers_slice_on_its_own_node_is_refused(policy: Policy, operation: str) -> None:
    foreign = published_slice()
    foreign["spec"]["driver"] = "dra.example.com"
    new, old = (foreign, None) if operation == "CREATE" else (None, foreign)
    allowed, messages = policy.admit(request(operation), new, old)
    assert not allowed
    assert messages == [("the gpu-labeller DRA plugin may write only ResourceSlices of its drivers "
                         "(gpu.nvidia.com, gpu.amd.com), not of dra.example.com")]


def test_a_pool_not_named_after_its_node_is_refused(policy: Policy) -> None:
    """Another node's pool name would mix into that node's pool for the scheduler."""
    slice_ = published_slice()
    slice_["spec"]["pool"]["name"] = "gpu-node-2"
    allowed, messages = policy.admit(request("CREATE"), slice_, None)
    assert not allowed and messages == [
        "the gpu-labeller DRA plugin publishes one pool per driver named after its Node (gpu-node-1), not gpu-node-2"]


def test_a_slice_for_all_nodes_is_refused(policy: Policy) -> None:
    slice_ = published_slice()
    del slice_["spec"]["nodeName"]
    slice_["spec"]["allNodes"] = True
    allowed, messages = policy.admit(request("CREATE"), slice_, None)
    assert not allowed and any("not one without spec.nodeName" in m for m in messages)


def test_taking_over_another_nodes_slice_is_refused(policy: Policy) -> None:
    """An update that makes someone else's slice look like its own."""
    other = published_slice("gpu-node-2")
    taken = copy.deepcopy(other)
    taken["spec"].update({"nodeName": "gpu-node-1", "pool": {**other["spec"]["pool"], "name": "gpu-node-1"}})
    allowed, messages = policy.admit(request("UPDATE"), taken, other)
    assert not allowed
    assert messages == ["the gpu-labeller DRA plugin may not take over a ResourceSlice of another Node or driver."]


def test_a_token_without_its_node_is_refused(policy: Policy) -> None:
    allowed, messages = policy.admit(request("CREATE", node_name=None), published_slice(), None)
    assert not allowed and "token names no Node" in messages[0]


def test_other_users_are_not_matched(policy: Policy) -> None:
    other = published_slice("gpu-node-2")
    for username in ("system:node:gpu-node-2", "kubernetes-admin",
                     "system:serviceaccount:nvidia-dra-driver-gpu:nvidia-dra-driver-gpu-service-account-kubeletplugin"):
        assert policy.admit(request("DELETE", node_name=None, username=username), None, other) == (True, [])
