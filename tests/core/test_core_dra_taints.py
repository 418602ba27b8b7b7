"""Device taints as the API takes them: every taint the plugin may publish is what a v1.34 API server
with DRADeviceTaints accepts, and the fake API server keeps, refuses, stamps and drops taints as
v1.34.2 was seen to (shared/k8s-dra: the messages below are the real server's, cut where the fake
says less)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from labeller.apps.draplugin.slicecontent import content, dropped
from labeller.apps.draplugin.taints import GONE, published, taints
from labeller.model.resourceslices import resource_slices
from labeller.model.vendor.plugin import Fault
from tests.fakes.apiserver import ApiError, NodeStore, SliceStore
from tests.core.test_core_dra import derive
from vendors import VENDORS

GATE = "DRADeviceTaints"
FAULTS = [Fault("XID 79", Fault.XID, 79), Fault("GPU does not answer NVML", Fault.LOST),
          Fault("cannot register for NVML events", Fault.UNMONITORED), "a reason of no kind", GONE]


def a_slice(devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "node-gpu-nvidia-com-0"}, "spec": {
        "driver": "gpu.nvidia.com", "nodeName": "node", "devices": devices,
        "pool": {"name": "node", "generation": 1, "resourceSliceCount": 1}}}


@pytest.mark.parametrize("profile", ["dgx-a100-mig-mixed", "mi300x-x8-cpx", "mixed-l40s-mi210"])
def test_every_taint_of_every_vendor_is_what_the_api_server_accepts(profile: str) -> None:
    devices = derive(profile).devices
    keys = {v.dra.driver: v.dra.taint_keys for v in VENDORS if v.dra is not None}
    faults = {d.health_key: FAULTS for found in devices.values() for d in found}
    tainted = published(devices, faults, keys)
    store = SliceStore(NodeStore(), {GATE})
    for slice_ in resource_slices("node", tainted):
        store.validate(slice_)
        assert all(len(d["taints"]) == 4 for d in slice_["spec"]["devices"])  # xid, lost, unmonitored, other


def test_each_kind_of_fault_is_the_vendors_key_and_its_effect() -> None:
    nvidia = next(v.dra for v in VENDORS if v.dra is not None and v.dra.driver == "gpu.nvidia.com")
    amd = next(v.dra for v in VENDORS if v.dra is not None and v.dra.driver == "gpu.amd.com")
    assert [t.document() for t in taints(nvidia.driver, nvidia.taint_keys, FAULTS)] == [
        {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoExecute"},
        {"key": "gpu.nvidia.com/unhealthy", "effect": "NoSchedule"},
        {"key": "gpu.nvidia.com/unmonitored", "effect": "NoSchedule"},
        {"key": "gpu.nvidia.com/xid", "effect": "NoSchedule", "value": "79"}]
    assert [t.document() for t in taints(amd.driver, amd.taint_keys, [Fault("KFD node 3 disappeared", Fault.LOST)])
            ] == [{"key": "gpu.amd.com/kfd-node-lost", "effect": "NoExecute"}]
    # two XIDs: the latest one is the value
    assert [t.value for t in taints(nvidia.driver, nvidia.taint_keys, [Fault("XID 48", Fault.XID, 48),
                                                                         Fault("XID 79", Fault.XID, 79)])] == ["79"]


def test_the_fake_api_server_refuses_bad_taints_as_v1_34_does() -> None:
    store = SliceStore(NodeStore(), {GATE})
    for taint_list, message in (
            ([{"key": "a/b", "effect": "None"}], 'effect: Unsupported value: "None": supported values: '
                                                 '"NoExecute", "NoSchedule"'),
            ([{"key": "a/b", "effect": "PreferNoSchedule"}], "Unsupported value"),
            ([{"key": "a/b"}], "taints[0].effect: Required value"),
            ([{"key": "bad key", "effect": "NoSchedule"}], "taints[0].key: Invalid value: 'bad key': name part must"),
            ([{"key": "a/b", "value": "7 9", "effect": "NoSchedule"}], "taints[0].value: Invalid value"),
            ([{"key": f"a/{i}", "effect": "NoSchedule"} for i in range(5)], "taints: Too many: 5: must have at "
                                                                             "most 4 items")):
        with pytest.raises(ApiError, match=re.escape(message)) as refused:
            store.create("", a_slice([{"name": "gpu-0", "taints": taint_list}]))
        assert refused.value.code == 422
    # the same key twice is allowed (v1.34.2 created it)
    store.create("", a_slice([{"name": "gpu-0", "taints": [{"key": "a/b", "effect": "NoSchedule"}] * 2}]))


def test_the_fake_api_server_stamps_taints_and_drops_them_without_the_gate() -> None:
    gated = SliceStore(NodeStore(), {GATE})
    created = gated.create("", a_slice([{"name": "gpu-0", "taints": [{"key": "a/b", "effect": "NoExecute"}]}]))
    assert created["spec"]["devices"][0]["taints"][0]["timeAdded"].endswith("Z")
    given = gated.create("", {**a_slice([{"name": "gpu-0", "taints": [
        {"key": "a/b", "effect": "NoExecute", "timeAdded": "2020-01-01T00:00:00Z"}]}]), "metadata": {"name": "other"}})
    assert given["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2020-01-01T00:00:00Z"  # kept as given

    plain = SliceStore(NodeStore())  # a v1.34 server's default: the gate off
    body = a_slice([{"name": "gpu-0", "taints": [{"key": "a/b", "effect": "NoExecute"}]}])
    assert "taints" not in plain.create("", body)["spec"]["devices"][0]  # dropped, not refused
    # a slice that has taints already (written while the gate was on) keeps them on update: the field is in use
    stored = plain.objects[("", "node-gpu-nvidia-com-0")]
    stored["spec"]["devices"][0]["taints"] = [{"key": "a/b", "effect": "NoExecute",
                                               "timeAdded": "2020-01-01T00:00:00Z"}]
    again = plain.replace("", "node-gpu-nvidia-com-0", copy.deepcopy(body))
    assert again["spec"]["devices"][0]["taints"][0]["key"] == "a/b"


def test_what_the_server_dropped_is_named_and_a_stamp_is_no_difference() -> None:
    written = a_slice([{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
                        "taints": [{"key": "a/b", "effect": "NoExecute"}]}, {"name": "gpu-1"}])["spec"]
    kept = copy.deepcopy(written)
    del kept["devices"][0]["taints"]
    assert dropped(content(written), content(kept)) == {"devices[].taints"}
    assert dropped(content(written), content(copy.deepcopy(written))) == set()
    stamped = copy.deepcopy(written)
    stamped["devices"][0]["taints"][0]["timeAdded"] = "2026-01-01T00:00:00Z"
    assert content(stamped) == content(written)
