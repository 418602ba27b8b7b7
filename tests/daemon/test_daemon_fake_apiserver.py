"""The fake API server keeps the real semantics (real-kubernetes-behaviour.md), seen through
labeller.cluster.kube and the official client."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest

from labeller.cluster.kube import (
    Conflict,
    Forbidden,
    Gone,
    Kube,
    KubeError,
    NotFound,
    Unavailable,
)
from labeller.model.labels import FIELD_MANAGER
from tests.fakes.apiserver import FakeApiServer, Fault

NODE = "gpu-node-1"
JSON_PATCH = "application/json-patch+json"


def patch(kube: Kube, body: Any, content_type: str) -> dict[str, Any]:
    """A raw PATCH of the node, for checking the fake's semantics of each patch type."""
    return kube._request("patch", "nodes", "PATCH", f"/api/v1/nodes/{NODE}", None, body, content_type)


@pytest.fixture
def kube(api: FakeApiServer, kubeconfig: Path) -> Kube:
    api.create_node(NODE, {"team": "ml"})
    return Kube(str(kubeconfig))


def test_apply_owns_each_label_and_drops_what_it_no_longer_applies(api: FakeApiServer, kube: Kube) -> None:
    kube.apply_node_labels(NODE, {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"})
    answer = kube.apply_node_labels(NODE, {"nvidia.com/gpu.present": "true"})
    assert answer["metadata"]["labels"] == {"team": "ml", "nvidia.com/gpu.present": "true"}
    managers = {entry["manager"] for entry in answer["metadata"]["managedFields"]}
    assert managers == {FIELD_MANAGER, "kubelet"}


def test_apply_does_not_remove_co_owned_or_unmanaged_labels(api: FakeApiServer, kube: Kube) -> None:
    kube.apply_node_labels(NODE, {"nvidia.com/gpu.count": "8"})
    api.apply_as(NODE, "other", {"nvidia.com/gpu.count": "8"})  # co-owned: same value
    api.set_labels(NODE, {"nvidia.com/gpu.family": "hopper"})  # written by an update, never applied by us
    answer = kube.apply_node_labels(NODE, {})
    assert answer["metadata"]["labels"] == {"team": "ml", "nvidia.com/gpu.count": "8",
                                            "nvidia.com/gpu.family": "hopper"}
    answer = kube.remove_node_labels(NODE, ["nvidia.com/gpu.count", "nvidia.com/gpu.family", "absent"])
    assert answer["metadata"]["labels"] == {"team": "ml"}


def test_forced_apply_takes_a_label_from_another_manager(api: FakeApiServer, kube: Kube) -> None:
    api.set_labels(NODE, {"nvidia.com/gpu.product": "theirs"}, manager="kubectl-label")
    kube.apply_node_labels(NODE, {"nvidia.com/gpu.product": "ours"})
    assert api.managers_of(NODE, "nvidia.com/gpu.product") == {(FIELD_MANAGER, "Apply")}
    with pytest.raises(Exception, match="conflict with \"gpu-labeller\""):
        api.apply_as(NODE, "other", {"nvidia.com/gpu.product": "x"}, force=False)


def test_managed_fields_persist_for_a_fresh_client(api: FakeApiServer, kube: Kube, kubeconfig: Path) -> None:
    kube.apply_node_labels(NODE, {"nvidia.com/gpu.count": "8"})
    fresh = Kube(str(kubeconfig))
    assert fresh.apply_node_labels(NODE, {})["metadata"]["labels"] == {"team": "ml"}


def test_merge_patch_with_stale_resource_version_is_409_with_the_real_status(api: FakeApiServer, kube: Kube) -> None:
    stale = api.labels(NODE) and kube.get_node(NODE)["metadata"]["resourceVersion"]
    api.set_labels(NODE, {"x": "1"})
    with pytest.raises(Conflict, match="the object has been modified"):
        patch(kube, {"metadata": {"resourceVersion": stale, "labels": {"y": "1"}}}, "application/merge-patch+json")
    assert "y" not in api.labels(NODE)


def test_json_patch_remove_of_a_missing_label_is_422(api: FakeApiServer, kube: Kube) -> None:
    with pytest.raises(KubeError) as err:
        patch(kube, [{"op": "remove", "path": "/metadata/labels/nvidia.com~1gpu.count"}], JSON_PATCH)
    assert err.value.status == 422
    patch(kube, [{"op": "add", "path": "/metadata/labels/nvidia.com~1gpu.count", "value": "2"}], JSON_PATCH)
    assert api.labels(NODE)["nvidia.com/gpu.count"] == "2"


def test_strategic_merge_null_removes(api: FakeApiServer, kube: Kube) -> None:
    patch(kube, {"metadata": {"labels": {"team": None}}}, "application/strategic-merge-patch+json")
    assert api.labels(NODE) == {}


def test_errors_map_to_small_types(api: FakeApiServer, kube: Kube, kubeconfig: Path) -> None:
    with pytest.raises(NotFound):
        kube.get_node("nope")
    api.forbid("patch")
    with pytest.raises(Forbidden) as forbidden:
        kube.apply_node_labels(NODE, {})
    assert (forbidden.value.verb, forbidden.value.resource) == ("patch", "nodes")
    assert ('User "labeller" cannot patch resource "nodes" in API group "" at the cluster scope'
            in forbidden.value.message)
    api.faults.add(Fault(verb="get", status=503, times=1))
    with pytest.raises(Unavailable):
        kube.get_node(NODE)
    api.faults.add(Fault(verb="get", drop=True, times=2))
    with pytest.raises(Unavailable):
        kube.get_node(NODE)
    api.faults.add(Fault(verb="get", delay_s=1.5, times=1))
    with pytest.raises(Unavailable):  # an answer later than the read timeout
        Kube(str(kubeconfig), request_timeout=(1.0, 1.0)).get_node(NODE)


def test_watch_sees_only_its_node_and_410_after_compaction(api: FakeApiServer, kube: Kube) -> None:
    api.create_node("other-node")
    node, rv = kube.list_node(NODE)
    assert node is not None and node["metadata"]["name"] == NODE
    api.set_labels("other-node", {"a": "1"})
    api.set_labels(NODE, {"b": "1"})
    events = kube.watch_node(NODE, rv, timeout_s=1)
    kind, obj = next(events)
    assert (kind, obj["metadata"]["name"], obj["metadata"]["labels"]["b"]) == ("MODIFIED", NODE, "1")
    events.close()
    api.store.compact()
    with pytest.raises(Gone):
        list(kube.watch_node(NODE, rv, timeout_s=1))
    assert kube.list_node("missing") == (None, kube.list_node(NODE)[1])


def test_node_feature_and_event_round_trip(api: FakeApiServer, kube: Kube) -> None:
    assert kube.get_node_feature("ns", "nf") is None
    body = {"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature", "metadata": {"name": "nf"}, "spec": {}}
    created = kube.create_node_feature("ns", body)
    kube.replace_node_feature("ns", "nf", created)
    with pytest.raises(Conflict):
        kube.replace_node_feature("ns", "nf", created)
    kube.create_event("default",
                      {"metadata": {"name": "e"}, "reason": "X", "involvedObject": {"kind": "Node", "name": NODE}})
    assert api.events()[0]["reason"] == "X"


def test_managed_fields_have_the_real_shape_with_one_entry_per_manager_and_operation(api: FakeApiServer,
                                                                                     kube: Kube) -> None:
    api.set_labels(NODE, {"nvidia.com/gpu.count": "8"}, manager=FIELD_MANAGER)  # an older version's merge patch
    answer = kube.apply_node_labels(NODE, {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"})
    entries = {(e["manager"], e["operation"]): e for e in answer["metadata"]["managedFields"]}
    assert set(entries) == {("kubelet", "Update"), (FIELD_MANAGER, "Update"), (FIELD_MANAGER, "Apply")}
    ours = entries[(FIELD_MANAGER, "Apply")]
    assert ours["apiVersion"] == "v1" and ours["fieldsType"] == "FieldsV1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ours["time"])
    assert ours["fieldsV1"] == {"f:metadata": {"f:labels": {"f:nvidia.com/gpu.count": {},
                                                            "f:nvidia.com/gpu.present": {}}}}
    # leaving a key out of the apply does not remove what our own Update entry still owns
    answer = kube.apply_node_labels(NODE, {"nvidia.com/gpu.present": "true"})
    assert answer["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert api.managers_of(NODE, "nvidia.com/gpu.count") == {(FIELD_MANAGER, "Update")}


def test_an_update_that_changes_a_value_takes_the_key_from_every_applier(api: FakeApiServer, kube: Kube) -> None:
    kube.apply_node_labels(NODE, {"nvidia.com/gpu.count": "8"})
    api.set_labels(NODE, {"nvidia.com/gpu.count": "8"}, manager="kubectl-label")  # same value: a no-op
    assert api.managers_of(NODE, "nvidia.com/gpu.count") == {(FIELD_MANAGER, "Apply")}
    api.set_labels(NODE, {"nvidia.com/gpu.count": "4"}, manager="kubectl-label")
    assert api.managers_of(NODE, "nvidia.com/gpu.count") == {("kubectl-label", "Update")}
    assert kube.apply_node_labels(NODE, {})["metadata"]["labels"]["nvidia.com/gpu.count"] == "4"


def test_the_403_message_names_the_configured_user(api: FakeApiServer, kube: Kube) -> None:
    api.user = "system:serviceaccount:gpu-labeller:gpu-labeller"
    api.forbid("list")
    with pytest.raises(Forbidden) as forbidden:
        kube.list_node(NODE)
    assert forbidden.value.message == (f'nodes "{NODE}" is forbidden: '
                                       'User "system:serviceaccount:gpu-labeller:gpu-labeller" '
                                       'cannot list resource "nodes" in API group "" at the cluster scope')
    assert forbidden.value.identity == "ServiceAccount gpu-labeller/gpu-labeller"
    api.forbid("list")
    with pytest.raises(Forbidden) as forbidden:
        kube.list_node_names()
    assert forbidden.value.message.startswith('nodes is forbidden: User "system:serviceaccount:')


def slice_body(name: str, generation: Any, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.example.com", "nodeName": NODE, "devices": [{"name": "gpu-0", **(
                {"attributes": attributes} if attributes else {})}],
                     "pool": {"name": NODE, "generation": generation, "resourceSliceCount": 1}}}


def test_a_resource_slice_number_outside_int64_is_400_as_on_a_real_server(api: FakeApiServer, kube: Kube) -> None:
    """As kube-apiserver v1.34.2 answers a create or update it cannot decode into the Go type (seen on
    shared/k8s-dra), before any validation: a generation past 2^63-1 can never be written."""
    cannot = 'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: json: cannot unmarshal '
    largest = kube.create_resource_slice(slice_body("s1", 2**63 - 1))
    assert largest["spec"]["pool"]["generation"] == 2**63 - 1
    too_big = {**largest, "spec": {**largest["spec"], "pool": {**largest["spec"]["pool"], "generation": 2**63}}}
    for write in (functools.partial(kube.update_resource_slice, "s1", too_big),
                  functools.partial(kube.create_resource_slice, slice_body("s2", 2**63))):
        with pytest.raises(KubeError) as refused:
            write()
        assert (refused.value.status, refused.value.reason, refused.value.message) == (
            400, "BadRequest", cannot + "number 9223372036854775808 into Go struct field "
                                        "ResourcePool.spec.pool.generation of type int64")
    pool_generation = "Go struct field ResourcePool.spec.pool.generation"
    for body, what in [(slice_body("s3", "1"), f"string into {pool_generation}"),
                       (slice_body("s4", -2**63 - 1), f"number -9223372036854775809 into {pool_generation}"),
                       (slice_body("s5", 1, {"x": {"int": 2**63}}),
                        "number 9223372036854775808 into Go struct field DeviceAttribute.spec.devices.attributes.int")]:
        with pytest.raises(KubeError, match="^400 BadRequest: " + re.escape(cannot + what + " of type int64")):
            kube.create_resource_slice(body)
    with pytest.raises(KubeError) as invalid:  # in range, but not valid: 422
        kube.create_resource_slice(slice_body("s6", -1))
    assert invalid.value.status == 422 and ("spec.pool.generation: Invalid value: -1: must be greater than or equal "
                                            "to zero") in invalid.value.message
    assert kube.create_resource_slice(slice_body("s7", None))["spec"]["pool"]["generation"] == 0  # Go's zero value
    assert sorted(s["metadata"]["name"] for s in api.slices()) == ["s1", "s7"]
    assert api.slices()[0]["spec"]["pool"]["generation"] == 2**63 - 1
