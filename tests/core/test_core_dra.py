"""DRA as the third output of the one model: on every built-in profile, the labels, the device
plugin's resources and the ResourceSlices describe the same devices; a node that serves a vendor
through DRA withholds its extended resources and says so in a label; ``resourceslices`` and
``explain`` on the command line."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from labeller.cli.root import main
from labeller.model.config import MemorySharing, parse_document
from labeller.apps.draplugin import taints
from labeller.host.explain import catalog, find
from labeller.host.machine import Host, NodeOptions, open_host
from labeller.model.labels import KeyDoc
from labeller.model.offer import Offer
from labeller.model.resourceslices import DraDevice, resource_slices, untainted
from labeller.model.sharing import memory_policy
from tests.fakes.apiserver import ApiError, NodeStore, SliceStore
from vendors import RESOURCE_NAMES, VENDORS
from vendors.amd.labels import product_name_value, vram_gib_label
from vendors.nvidia.devices import NvidiaDevice
from vendors.nvidia.dra import profile_label
from vendors.nvidia.facts import MIB
from vendors.nvidia.labels import product_name
from vendors.simulate import builtin_profiles

PROFILES = sorted(builtin_profiles())
NVIDIA, AMD = "gpu.nvidia.com", "gpu.amd.com"


@dataclass
class Derived:
    host: Host
    labels: dict[str, str]
    offer: Offer
    devices: dict[str, list[DraDevice]]  # of every vendor with a DRA driver, served or not
    published: dict[str, list[DraDevice]]  # of the vendors the config serves through DRA


def derive(profile: str, config: dict[str, Any] | None = None) -> Derived:
    """A profile's labels, offer and DRA devices, as the commands derive them."""
    with open_host(NodeOptions(simulate=profile)) as host:
        if config is not None:
            host.config = parse_document(config, RESOURCE_NAMES)
        inventory = host.probe()
        offer = host.offer(inventory)
        return Derived(host, host.labels(inventory, offer).labels, offer,
                       host.dra_devices(inventory, offer, every_vendor=True), host.dra_devices(inventory, offer))


def attribute(device: DraDevice, name: str) -> Any:
    return device.attributes[name].value if name in device.attributes else None


def counted(labels: dict[str, str], prefix: str) -> Counter[str]:
    """``beta.amd.com/gpu.cu-count.38=63`` style labels: value -> count."""
    return Counter({key[len(prefix):]: int(value) for key, value in labels.items() if key.startswith(prefix)})


@pytest.mark.parametrize("profile", PROFILES)
def test_labels_resources_and_slices_describe_the_same_devices(profile: str) -> None:
    derived = derive(profile)
    host, labels, offer, by_driver = derived.host, derived.labels, derived.offer, derived.devices
    assert derived.published == {}  # the default: DRA serves no vendor
    # devices made at prepare (labeller.dra.dynamicMig) are DRA's alone: the device plugin serves what exists
    by_driver = {driver: [d for d in found if d.make is None] for driver, found in by_driver.items()}
    devices = [d for found in by_driver.values() for d in found]
    served = [*offer.resources, *(h.resource for h in offer.held)]
    physical = {d.physical.health_key: d.physical for r in served for d in r.devices}
    advertised = {d.physical.health_key for r in offer.resources for d in r.devices}  # not held (MPS not ready)

    # count and health: one published device per device the plugin serves, checked by the same health unit
    assert sorted(d.health_key for d in devices) == sorted(physical)
    slices = resource_slices("node", by_driver)
    assert sum(len(s["spec"]["devices"]) for s in slices) == len(devices)
    assert len({d.name for d in devices}) == len(devices), "device names are unique"
    for driver, found in by_driver.items():  # an unhealthy device is tainted, and only it (left out without taints)
        dropped = found[0]
        tainted = taints.published(by_driver, {dropped.health_key: ["XID 79"]}, {})[driver]
        assert [d.name for d in tainted if d.taints] == [dropped.name]
        assert [d.name for d in untainted(tainted)] == [d.name for d in found[1:]]

    nvidia = by_driver.get(NVIDIA, [])
    if nvidia:
        whole = [d for d in nvidia if attribute(d, "type") == "gpu"]
        migs = [d for d in nvidia if attribute(d, "type") == "mig"]
        # partitions: the MIG devices published are the MIG devices served, profile for profile
        assert sorted(attribute(d, "profile") for d in migs) == sorted(
            p.partition for p in physical.values() if p.vendor == "nvidia" and p.partition)
        # MIG devices named as NVIDIA's driver names them, by their profile and GPU instance's profile id and
        # placement start, whose memory slices they publish; two GPU instances of one GPU never share a slice
        occupied: Counter[tuple[Any, str]] = Counter()
        for mig in migs:
            named = re.fullmatch(r"gpu-\d+-mig-([a-z0-9-]+)-\d+-(\d+)", mig.name)
            assert named is not None and named[1] == profile_label(attribute(mig, "profile")), mig.name
            start = int(named[2])
            slices = {name for name in mig.capacity if name.startswith("memorySlice")}
            assert slices and slices == {f"memorySlice{i}" for i in range(start, start + len(slices))}, mig.name
            occupied.update((attribute(mig, "parentUUID"), name) for name in slices)
        assert set(occupied.values()) <= {1}
        # product: the label names the product the devices publish (GFD's sanitised form)
        assert any(labels["nvidia.com/gpu.product"].startswith(product_name(attribute(d, "productName")))
                   for d in nvidia)
        # memory and count, as the labels count what is advertised (held MPS replicas are not)
        memories = {d.capacity["memory"].value // MIB for d in nvidia if "memory" in d.capacity}
        assert int(labels["nvidia.com/gpu.memory"]) in memories
        if host.config.mig_strategy == "single" and migs:
            assert int(labels["nvidia.com/gpu.count"]) == len(migs)
        else:
            assert int(labels["nvidia.com/gpu.count"]) == sum(1 for d in whole if d.health_key in advertised)
            for profile_name, count in Counter(attribute(d, "profile") for d in migs).items():
                device = next(p for p in physical.values()
                              if isinstance(p, NvidiaDevice) and p.partition == profile_name)
                assert device.mig is not None
                prefix = device.mig.resource_name
                assert int(labels[f"{prefix}.count"]) == count
                assert int(labels[f"{prefix}.memory"]) == device.mig.memory_mib

    amd = by_driver.get(AMD, [])
    if amd:
        # count: AMD counts KFD compute nodes, as its slices publish them
        assert sum(counted(labels, "beta.amd.com/gpu.cu-count.").values()) == len(amd)
        assert counted(labels, "beta.amd.com/gpu.cu-count.") == Counter(
            str(d.capacity["computeUnits"].value) for d in amd)
        # memory: the VRAM labels count the devices that publish a memory capacity, and none other
        assert counted(labels, "beta.amd.com/gpu.vram.") == Counter(
            vram_gib_label(d.capacity["memory"].value) for d in amd if "memory" in d.capacity)
        # product
        assert {labels["amd.com/gpu.product-name"]} == {product_name_value(attribute(d, "productName")) for d in amd}
        # partitions: a partition is a partition everywhere, with the mode the labels give
        partitions = [d for d in amd if attribute(d, "type") == "amdgpu-partition"]
        assert len(partitions) == sum(1 for p in physical.values() if p.vendor == "amd" and p.partition)
        profiles = {attribute(d, "partitionProfile") for d in amd} - {None}
        assert profiles == ({labels["amd.com/gpu.compute-memory-partition"]}
                            if "amd.com/gpu.compute-memory-partition" in labels else set())


@pytest.mark.parametrize("profile", PROFILES)
def test_every_builtin_profiles_slices_are_what_the_api_server_accepts(profile: str) -> None:
    """Validated as a v1.34 API server does (tests/fakes/apiserver.py): qualified attribute names,
    at most 32 attributes and capacities per device (a 7-slice MIG device publishes 28), values of
    at most 64 characters."""
    store = SliceStore(NodeStore())
    for published in resource_slices("node", derive(profile).devices):
        store.validate(published)


def test_the_api_server_refuses_what_no_real_one_takes() -> None:
    store = SliceStore(NodeStore())
    (published,) = resource_slices("node", {NVIDIA: derive("dgx-h100").devices[NVIDIA][:1]})
    device = published["spec"]["devices"][0]
    one_too_many = 33 - len(device["attributes"]) - len(device["capacity"])
    for broken, message in (({"x" * 65: {"string": "a"}}, "a C identifier of at most 32 characters"),
                            ({"resource.kubernetes.io/pcieRoot": {"string": "p" * 65}}, "Too long"),
                            ({f"attribute{i}": {"int": i} for i in range(one_too_many)}, "must not exceed 32")):
        spoilt = {**published, "spec": {**published["spec"], "devices": [
            {**device, "attributes": {**device["attributes"], **broken}}]}}
        with pytest.raises(ApiError, match=message):
            store.validate(spoilt)


def shared_gpu(policy: dict[str, Any] | None = None, allow: Any = True, value: str = "16Gi") -> dict[str, Any]:
    """A slice of one device with a memory capacity claims consume (``DRAConsumableCapacity``)."""
    device: dict[str, Any] = {"name": "gpu-0", "capacity": {"memory": {"value": value}}}
    if allow is not None:
        device["allowMultipleAllocations"] = allow
    if policy is not None:
        device["capacity"]["memory"]["requestPolicy"] = policy
    return {"metadata": {"name": "s"}, "spec": {"driver": NVIDIA, "nodeName": "n", "devices": [device],
                                                "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1}}}


def test_the_api_server_keeps_consumable_capacity_only_with_its_gate() -> None:
    """As kube-apiserver v1.34.2 (seen): without DRAConsumableCapacity a create loses the fields, an update
    keeps them only where the stored slice has them; with it they are kept."""
    gates: set[str] = set()
    store = SliceStore(NodeStore(), gates)
    policy = {"default": "16Gi", "validRange": {"min": "1Gi", "max": "16Gi", "step": "1Gi"}}
    created = store.create("", shared_gpu(policy))
    assert created["spec"]["devices"][0] == {"name": "gpu-0", "capacity": {"memory": {"value": "16Gi"}}}
    gates.add("DRAConsumableCapacity")
    kept = store.replace("", "s", shared_gpu(policy))
    assert kept["spec"]["devices"][0]["allowMultipleAllocations"] is True
    gates.clear()  # the gate turned off again: a slice that uses the fields keeps them
    assert store.replace("", "s", shared_gpu(policy))["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]


@pytest.mark.parametrize(("slice_", "message"), [
    (shared_gpu({"default": "1Gi"}, allow=None), "requestPolicy: Forbidden: allowMultipleAllocations must be true"),
    (shared_gpu({"default": "1Gi"}, allow=False), "requestPolicy: Forbidden: allowMultipleAllocations must be true"),
    (shared_gpu({"validRange": {"min": "1Gi"}}), "requestPolicy.default: Required value: required when validRange"),
    (shared_gpu({"default": "1Gi", "validRange": {"max": "2Gi"}}), "validRange.min: Required value"),
    (shared_gpu({"default": "1Gi", "validValues": ["1Gi"], "validRange": {"min": "1Gi"}}),
     'Forbidden: exactly one policy can be specified, cannot specify "validValues" and "validRange"'),
    (shared_gpu({"default": "1Gi", "validRange": {"min": "1Gi", "step": "16Gi"}}),
     'validRange.step: Invalid value: "16Gi": one step'),
    (shared_gpu({"default": "1536Mi", "validRange": {"min": "1Gi", "step": "1Gi"}}),
     'validRange.step: Invalid value: "1536Mi": value is not a multiple of a given step (1Gi) from (1Gi)'),
    (shared_gpu({"default": "3Gi", "validValues": ["2Gi", "1Gi", "32Gi"]}),
     'validValues[1]: Invalid value: "1Gi": values must be sorted in ascending order'),
    (shared_gpu({"default": "1", "validValues": [str(i) for i in range(1, 12)]}),
     "validValues: Too many: 11: must have at most 10 items"),
    (shared_gpu({"default": "1", "validValues": ["1", "1"]}), 'validValues[1]: Duplicate value: "1"'),
    (shared_gpu({"default": "8Gi", "validRange": {"min": "4Gi", "max": "2Gi"}}),
     'validRange.max: Invalid value: "4Gi": min is larger than max: 2Gi'),
    (shared_gpu({"default": "8Gi", "validRange": {"min": "4Gi", "max": "32Gi"}}),
     'validRange.max: Invalid value: "32Gi": max is larger than capacity value: 16Gi'),
])
def test_the_api_server_refuses_a_request_policy_a_real_one_refuses(slice_: dict[str, Any], message: str) -> None:
    """kube-apiserver v1.34.2's answers (DRAConsumableCapacity on), as seen on shared/k8s-dra."""
    store = SliceStore(NodeStore(), {"DRAConsumableCapacity"})
    with pytest.raises(ApiError, match=re.escape(message)) as refused:
        store.create("", slice_)
    assert refused.value.code == 422


def test_the_api_server_cannot_decode_what_is_not_a_bool_or_a_quantity() -> None:
    store = SliceStore(NodeStore(), {"DRAConsumableCapacity"})
    for slice_, message in ((shared_gpu(allow="yes"), "cannot unmarshal string into Go struct field "
                             "Device.spec.devices.allowMultipleAllocations of type bool"),
                            (shared_gpu({"default": "eight"}), "quantities must match the regular expression")):
        with pytest.raises(ApiError, match=re.escape(message)) as refused:
            store.create("", slice_)
        assert refused.value.code == 400
    assert store.create("", shared_gpu({}))  # an empty policy is a policy


def test_a_memory_sharing_nodes_slices_are_what_the_api_server_accepts() -> None:
    """sharing.memory's policies hold the API's rules, in GiB and in MiB, on a GPU of one unit too."""
    store = SliceStore(NodeStore(), {"DRAConsumableCapacity"})
    for unit in ("GiB", "MiB"):  # MiB: one device per GPU in DRA, not one per MiB as for the device plugin
        config = {"version": "v1", "sharing": {"memory": {"unit": unit}}, "labeller": {"dra": {"vendors": ["nvidia"]}}}
        devices = derive("t4-x4-gpushare", config).published
        assert all(d.allow_multiple_allocations for d in devices[NVIDIA])
        for published in resource_slices("node", devices):
            store.validate(published)
    policy = memory_policy(1500 << 20, MemorySharing("GiB"))  # a GPU of one unit: no step
    assert policy.document() == {"default": "1Gi", "validRange": {"min": "1Gi", "max": "1Gi"}}
    store.validate(shared_gpu(policy.document(), value="1500Mi"))


@pytest.mark.parametrize("profile", PROFILES)
def test_explain_covers_every_attribute_a_builtin_profile_publishes(profile: str) -> None:
    derived = derive(profile)
    host, by_driver = derived.host, derived.devices
    for vendor in host.vendors:
        assert vendor.dra is not None
        documented = [KeyDoc(doc.name, "").regex for doc in vendor.dra.attribute_docs]  # "memorySlice<i>": a family
        for device in by_driver.get(vendor.dra.driver, []):
            names = (*device.attributes, *device.capacity)
            assert [n for n in names if not any(doc.fullmatch(n) for doc in documented)] == [], device.name
            for item in (*device.attributes.values(), *device.capacity.values()):
                assert item.backend and item.source


def test_a_node_that_serves_a_vendor_through_dra_withholds_its_resources_and_says_so() -> None:
    config = {"version": "v1", "labeller": {"dra": {"vendors": ["nvidia", "amd"]}}}
    default = derive("mixed-l40s-mi210")
    default_labels, default_offer = default.labels, default.offer
    served = derive("mixed-l40s-mi210", config)
    labels, offer = served.labels, served.offer

    assert offer.resources == () and offer.held == ()  # one owner per GPU: the device plugin serves none
    assert set(offer.withheld) == {r.base for r in default_offer.resources}
    assert all(reason.startswith("served through DRA (") for reason in offer.withheld.values())
    assert labels["nvidia.com/gpu.dra"] == labels["amd.com/gpu.dra"] == "true"
    assert "nvidia.com/gpu.dra" not in default_labels and "amd.com/gpu.dra" not in default_labels
    # the GPUs are still described as they are, and counted as what nvidia.com/gpu advertises: none
    assert labels["nvidia.com/gpu.count"] == "0"
    for key in ("nvidia.com/gpu.product", "nvidia.com/gpu.memory", "amd.com/gpu.product-name", "amd.com/gpu.cu-count",
                "beta.amd.com/gpu.cu-count.104", "amd.com/gpu.vram"):
        assert labels[key] == default_labels[key], key
    assert served.published == served.devices and set(served.published) == {NVIDIA, AMD}


def test_dra_serves_one_vendor_and_the_device_plugin_the_other() -> None:
    derived = derive("mixed-l40s-mi210", {"version": "v1", "labeller": {"dra": {"vendors": ["amd"]}}})
    labels, offer = derived.labels, derived.offer
    assert [r.name for r in offer.resources] == ["nvidia.com/gpu"]
    assert list(offer.withheld) == ["amd.com/gpu"]
    assert list(derived.published) == [AMD]
    assert "nvidia.com/gpu.dra" not in labels and labels["amd.com/gpu.dra"] == "true"
    assert labels["nvidia.com/gpu.count"] == "2"


def test_the_dra_label_is_explained() -> None:
    entry = find("nvidia.com/gpu.dra", catalog(VENDORS))
    assert entry is not None and "labeller.dra.vendors" in entry.doc.when


# --- the command line ---------------------------------------------------------------------------------

def run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["--log-level", "warning", *args], env=env)


def test_resourceslices_under_a_config_without_dra_previews_every_vendor_present_and_says_so() -> None:
    result = run("resourceslices", "--simulate", "mixed-l40s-mi210", env={"NODE_NAME": "n7"})
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.stdout))
    assert sorted(d["spec"]["driver"] for d in documents) == sorted([AMD, "gpu.nvidia.com"])
    assert documents == list(yaml.safe_load_all(run("resourceslices", "--simulate", "mixed-l40s-mi210",
                                                    "--dra-vendors", "all", env={"NODE_NAME": "n7"}).stdout))
    [line] = result.stderr.splitlines()
    assert "this config serves no vendor through DRA (labeller.dra.vendors is empty)" in line
    assert "what every vendor present would publish (--dra-vendors all)" in line


def test_resourceslices_prints_the_served_vendors_slices_as_documents_kubectl_takes(tmp_path: Any) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nlabeller:\n  dra:\n    vendors: [amd]\n")
    result = run("resourceslices", "--simulate", "mixed-l40s-mi210", "--config", str(config), env={"NODE_NAME": "n7"})
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.stdout))
    assert [d["metadata"]["name"] for d in documents] == ["n7-gpu-amd-com-0"]
    assert documents[0]["spec"]["nodeName"] == "n7" and documents[0]["spec"]["driver"] == AMD
    assert [d["name"] for d in documents[0]["spec"]["devices"]] == ["gpu-0-128", "gpu-1-129"]


def test_resourceslices_json_is_a_list_and_the_preview_serves_the_vendors_asked_for() -> None:
    result = run("resourceslices", "--simulate", "mixed-l40s-mi210", "--dra-vendors", "all", "--format", "json",
                 "--node-name", "n1")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["kind"] == "List"
    assert [s["spec"]["driver"] for s in document["items"]] == [AMD, NVIDIA]
    nvidia_only = json.loads(run("resourceslices", "--simulate", "mixed-l40s-mi210", "--dra-vendors", "nvidia",
                                 "--format", "json", "--node-name", "n1").stdout)
    assert [s["spec"]["driver"] for s in nvidia_only["items"]] == [NVIDIA]


def test_resourceslices_refuses_a_vendor_without_a_dra_driver_in_one_line() -> None:
    result = run("resourceslices", "--simulate", "dgx-h100", "--dra-vendors", "intel")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "Error: --dra-vendors: 'intel' is not a vendor with a DRA driver (known: nvidia, amd, or all)"]


def test_explain_says_where_an_attribute_comes_from_and_who_defines_it() -> None:
    result = run("explain", "--simulate", "dgx-h100", "gpu.nvidia.com/productName", "gpu.nvidia.com/memory")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "gpu.nvidia.com/productName (string, gpu.nvidia.com), on 8 devices:"
    assert lines[1] == "  = NVIDIA H100 80GB HBM3: gpu-0, gpu-1, gpu-2, gpu-3, ... (8 devices)"
    assert "    backend:  nvml" in lines
    assert any(line.startswith("    source:   nvmlDeviceGetName(GPU 0 (") for line in lines)
    assert "  upstream: NVIDIA k8s-dra-driver-gpu (gpu.nvidia.com): same name, type and value form" in lines
    assert any(line.startswith("  published: no: labeller.dra.vendors does not name nvidia") for line in lines)
    assert "  = 81559Mi: gpu-0, gpu-1, gpu-2, gpu-3, ... (8 devices)" in lines


def test_explain_says_which_placement_a_mig_devices_memory_slices_and_name_come_from() -> None:
    result = run("explain", "--simulate", "dgx-a100-mig-mixed", "gpu.nvidia.com/memorySlice7")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "gpu.nvidia.com/memorySlice7 (capacity, gpu.nvidia.com), on 2 devices:"
    assert lines[1] == "  = 1: gpu-6-mig-3g20gb-9-4, gpu-7-mig-3g20gb-9-4"  # 3g.20gb: profile id 9, slices 4 to 7
    assert "    source:   nvmlGpuInstanceGetInfo(GPU instance 1 of GPU 6 " \
           "(GPU-0c6a7f5e-2b1d-4d3c-8e9f-a1b2c3d4e506)): profileId 9, placement 4:4" in lines
    assert "  upstream: NVIDIA k8s-dra-driver-gpu (gpu.nvidia.com): same name, type and value form; NVIDIA's does " \
           "not publish MIG devices of split GPU instances" in lines


def test_explain_says_why_an_attribute_is_left_out_and_suggests_for_a_typo() -> None:
    result = run("explain", "--simulate", "mi300x-x8-cpx", "--format", "json", "gpu.amd.com/memory",
                 "gpu.amd.com/prodName", "gpu.nvidia.com/uuid")
    assert result.exit_code == 1  # a key that is not ours
    memory, typo, absent = json.loads(result.stdout)
    assert memory["produced"] is False and "none of the 63 gpu.amd.com devices here has it" in memory["why_not"]
    assert typo["known"] is False and typo["suggestion"] == "productName"
    assert absent["why_not"].startswith("no nvidia GPU on this node")


def test_explain_says_an_old_nvidia_name_was_renamed_and_where_the_pcie_root_comes_from() -> None:
    result = run("explain", "--simulate", "mixed-l40s-mi210", "--format", "json", "gpu.nvidia.com/pcieBusID",
                 "resource.kubernetes.io/pcieRoot")
    assert result.exit_code == 0, result.output
    renamed, *roots = json.loads(result.stdout)
    assert renamed["produced"] is False and renamed["known"] is True
    assert renamed["why_not"] == ("no longer published: renamed to resource.kubernetes.io/pciBusID, which a claim "
                                  "should read instead")
    assert {r["driver"]: [v["value"] for v in r["values"]] for r in roots} == {
        AMD: ["pci0000:00", "pci0000:20"], NVIDIA: ["pci0000:40", "pci0000:c0"]}
    nvidia_root = next(r for r in roots if r["driver"] == NVIDIA)["values"][0]
    assert (nvidia_root["backend"], nvidia_root["source"]) == (
        "sysfs", "/sys/bus/pci/devices/0000:4a:00.0 -> /sys/devices/pci0000:40/.../0000:4a:00.0")


def test_explain_of_a_driver_lists_every_attribute_its_devices_publish() -> None:
    result = run("explain", "--simulate", "mi300x-x8-spx", "--format", "json", "gpu.amd.com")
    assert result.exit_code == 0, result.output
    keys = [item["key"] for item in json.loads(result.stdout)]
    assert {"gpu.amd.com/partitionProfile", "gpu.amd.com/memory", "resource.kubernetes.io/pciBusID"} <= set(keys)
