"""The one mechanism for fields behind feature gates (labeller/apps/draplugin/gates.py): what the publisher
reports as dropped (the fields of a write its answer lacks), which gate such a field belongs to, one
line per gate found off, and the fallback every driver's devices are published with from then on."""

from __future__ import annotations

import dataclasses

import structlog

from labeller.apps.draplugin.gates import GATES, Gate, GateFallbacks
from labeller.apps.draplugin.slicecontent import content, dropped, named_fields
from labeller.model.offer import PhysicalDevice
from labeller.model.resourceslices import Capacity, CounterSet, CounterUse, DeviceTaint, DraDevice, RequestPolicy

GIB = 1 << 30


def shared_gpu(name: str = "gpu-0") -> DraDevice:
    policy = RequestPolicy(default=14 * GIB, min=GIB, max=14 * GIB, step=GIB)
    return DraDevice(name, PhysicalDevice(vendor="nvidia", health_key=f"GPU-{name}", visible_id=name, gpu=name),
                     capacity={"memory": Capacity(15 * GIB, "nvml", "test", request_policy=policy)},
                     allow_multiple_allocations=True)


def test_dropped_names_the_fields_a_server_did_not_keep_and_nothing_it_changed() -> None:
    written = content({"devices": [shared_gpu().document(), {"name": "gpu-1", "taints": [{"key": "k"}]}]})
    kept = content({"devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "15Gi"}}},
                                {"name": "gpu-1"}]})
    assert dropped(written, kept) == {"devices[].allowMultipleAllocations", "devices[].capacity.memory.requestPolicy",
                                      "devices[].taints"}
    other = shared_gpu().document()
    other["capacity"]["memory"]["value"] = "16Gi"
    changed = content({"devices": [other, {"name": "gpu-1", "taints": [{"key": "other"}]}]})
    assert dropped(written, changed) == set()  # a value the server changed is not a field it dropped
    assert dropped(written, written) == set()


def test_request_policies_compare_by_value() -> None:
    """A server that writes 16384Mi for 16Gi kept what was written: nothing to write again."""
    ours = {"devices": [{"name": "g", "capacity": {"memory": {"value": "16Gi", "requestPolicy": {
        "default": "16Gi", "validValues": ["1Gi", "16Gi"],
        "validRange": {"min": "1Gi", "max": "16Gi", "step": "1Gi"}}}}}]}
    theirs = {"devices": [{"name": "g", "capacity": {"memory": {"value": "17179869184", "requestPolicy": {
        "default": "16384Mi", "validValues": ["1024Mi", "16384Mi"],
        "validRange": {"min": "1024Mi", "max": "16384Mi", "step": "1048576Ki"}}}}}]}
    assert content(ours) == content(theirs)
    assert content(ours) != content({"devices": [{"name": "g", "capacity": {"memory": {"value": "16Gi"}}}]})


def test_a_gate_is_found_off_once_and_its_fallback_applies_to_every_driver() -> None:
    gates = GateFallbacks()
    devices = {"gpu.nvidia.com": [shared_gpu("gpu-0")], "other.example.com": [shared_gpu("dev-0")]}
    assert gates.apply(devices) == devices and gates.off == ()
    with structlog.testing.capture_logs() as logs:
        assert gates.dropped("gpu.nvidia.com", {"devices[].allowMultipleAllocations"}) is True
        assert gates.dropped("gpu.nvidia.com", {"devices[].capacity.memory.requestPolicy"}) is False  # known off
        assert gates.dropped("gpu.nvidia.com", {"devices[].somethingNew"}) is False
        assert gates.dropped("gpu.nvidia.com", {"devices[].somethingNew"}) is False
    assert [(e["reason"], e.get("gate")) for e in logs] == [("feature-gate-off", "DRAConsumableCapacity"),
                                                            ("fields-dropped", None)]
    assert gates.off == ("DRAConsumableCapacity",)
    for published in gates.apply(devices).values():
        (device,) = published
        assert not device.allow_multiple_allocations and device.capacity["memory"].request_policy is None
        assert "allowMultipleAllocations" not in device.document()


def test_a_gates_fields_are_matched_by_path_with_any_key_for_a_star() -> None:
    gate = Gate("X", ("devices[].capacity.*.requestPolicy", "sharedCounters"), list, "as before")
    assert gate.names("devices[].capacity.memory.requestPolicy")
    assert gate.names("devices[].capacity.memory.requestPolicy.validRange")  # inside one of its fields
    assert gate.names("sharedCounters")
    assert not gate.names("devices[].capacity.memory.value") and not gate.names("devices[].capacity")
    assert {g.name for g in GATES} >= {"DRAConsumableCapacity", "DRADeviceTaints", "DRAPartitionableDevices"}
    assert dataclasses.replace(gate, name="Y").names("sharedCounters")


def test_without_device_taints_every_drivers_tainted_devices_leave_and_the_others_stay() -> None:
    """DRADeviceTaints is one gate of the same mechanism: its fallback is the removal of unhealthy devices."""
    lost = DeviceTaint("gpu.nvidia.com/gpu-lost", "NoExecute")
    devices = {"gpu.nvidia.com": [shared_gpu("gpu-0"), dataclasses.replace(shared_gpu("gpu-1"), taints=(lost,))],
               "gpu.amd.com": [dataclasses.replace(shared_gpu("gpu-2"), taints=(lost,))]}
    gates = GateFallbacks()
    with structlog.testing.capture_logs() as logs:
        assert gates.dropped("gpu.nvidia.com", {"devices[].taints"}) is True
    assert [(e["reason"], e["gate"], e["fields"]) for e in logs] == [
        ("feature-gate-off", "DRADeviceTaints", ["devices[].taints"])]
    assert gates.off == ("DRADeviceTaints",)
    published = gates.apply(devices)
    assert published == {"gpu.nvidia.com": [shared_gpu("gpu-0")], "gpu.amd.com": []}
    assert published["gpu.nvidia.com"][0].allow_multiple_allocations  # the other gate is still on


def partition(name: str, gpu: str = "gpu-4") -> DraDevice:
    """A MIG device made at prepare: it draws on its GPU's counter set."""
    counter_set = CounterSet(f"{gpu}-counter-set", {"memory-slice-0": Capacity(1, "nvml", "test")})
    return DraDevice(name, PhysicalDevice(vendor="nvidia", health_key=f"GPU-{gpu}", visible_id=name, gpu=gpu),
                     consumes=(CounterUse(counter_set, {"memory-slice-0": 1}),), make={"gpu": gpu})


def test_without_partitionable_devices_every_drivers_partitions_made_at_prepare_leave() -> None:
    """DRAPartitionableDevices is one gate of the same mechanism: found off from the counters a write lost,
    its fallback leaves out what draws on counters, and applies before the others' (a GPU kept is unshared
    where DRAConsumableCapacity is off too)."""
    devices = {"gpu.nvidia.com": [shared_gpu("gpu-0"), partition("gpu-4-mig-1g5gb-19-0")],
               "gpu.amd.com": [partition("gpu-0000-05-00-0-cpx-0", "gpu-0000-05-00-0")]}
    gates = GateFallbacks()
    with structlog.testing.capture_logs() as logs:
        assert gates.dropped("gpu.nvidia.com", {"sharedCounters", "devices[].consumesCounters"}) is True
        assert gates.dropped("gpu.amd.com", {"sharedCounters"}) is False  # one server: off for every driver
    assert [(e["reason"], e["gate"], e["fields"]) for e in logs] == [
        ("feature-gate-off", "DRAPartitionableDevices", ["devices[].consumesCounters", "sharedCounters"])]
    assert gates.apply(devices) == {"gpu.nvidia.com": [shared_gpu("gpu-0")], "gpu.amd.com": []}
    gates.dropped("gpu.nvidia.com", {"devices[].allowMultipleAllocations"})
    assert gates.off == ("DRAPartitionableDevices", "DRAConsumableCapacity")
    (gpu,) = gates.apply(devices)["gpu.nvidia.com"]
    assert gpu.name == "gpu-0" and not gpu.allow_multiple_allocations


def test_a_refusal_naming_a_gates_fields_turns_it_off_with_the_servers_message() -> None:
    """A release that takes counter sets only in slices of their own refuses ours (422), naming the field."""
    message = 'ResourceSlice "n-gpu-nvidia-com-1" is invalid: spec: Invalid value: "": only one of `sharedCounters` ' \
              "or `devices` is allowed"
    spec = content({"driver": "gpu.nvidia.com", "sharedCounters": [{"name": "gpu-4-counter-set", "counters": {
        "memory-slice-0": {"value": "1"}}}], "devices": [partition("gpu-4-mig-1g5gb-19-0").document()]})
    named = named_fields(spec, message)
    assert {"sharedCounters", "devices"} <= named and "devices[].consumesCounters" not in named
    gates = GateFallbacks()
    with structlog.testing.capture_logs() as logs:
        other = "spec.pool.name: Required value"  # a refusal that names no gate's field: not a gate's doing
        assert gates.dropped("gpu.nvidia.com", named_fields(spec, other), other) is False
        assert gates.off_for(named) is False
        assert gates.dropped("gpu.nvidia.com", named, message) is True
        assert gates.dropped("gpu.nvidia.com", named, message) is False  # said once
    assert gates.off == ("DRAPartitionableDevices",) and gates.off_for(named)
    (said,) = logs  # no "fields-dropped" line: a refusal drops nothing, and names more than its cause
    assert said["reason"] == "feature-gate-off" and said["gate"] == "DRAPartitionableDevices"
    assert said["fields"] == ["sharedCounters"] and "only one of `sharedCounters`" in said["refused"]
    assert "refuses DRAPartitionableDevices's fields as written" in said["event"]
