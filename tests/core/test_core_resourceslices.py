"""The ResourceSlices a node publishes (labeller.model.resourceslices), the vendors' DRA devices, and the
config key that says which vendors a node serves through DRA."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from labeller.model.config import Config, ConfigError, parse_config
from labeller.apps.draplugin import taints
from labeller.host.machine import Host
from labeller.model.inventory import Inventory, PciGpu
from labeller.model.offer import Offer, PhysicalDevice
from labeller.model.resourceslices import (MAX_DEVICES_PER_SLICE, Attribute, Capacity, DraDevice, Version, quantity,
                                     resource_slices, semver, untainted)
from tests.builders import nvidia, nvidia_gpu
from vendors import RESOURCE_NAMES
from vendors.amd.dra import devices as amd_devices
from vendors.amd.model import AmdComputeNode, AmdGpu, AmdInventory
from vendors.nvidia.dra import devices as nvidia_devices
from vendors.nvidia.dra import profile_label
from vendors.nvidia.model import MigDevice


def device(name: str, **attributes: Any) -> DraDevice:
    physical = PhysicalDevice(vendor="nvidia", health_key=f"key-{name}", visible_id=name, gpu="0000:01:00.0")
    return DraDevice(name, physical, {k: Attribute(v, "test", "test") for k, v in attributes.items()},
                     {"memory": Capacity(80 << 30, "test", "test")})


@pytest.mark.parametrize(("value", "text"), [(0, "0"), (14, "14"), (1024, "1Ki"), (1536, "1536"),
                                             (85520809984, "81559Mi"), (80 << 30, "80Gi"), (1 << 60, "1Ei")])
def test_capacities_are_canonical_binary_quantities(value: int, text: str) -> None:
    assert quantity(value) == text


@pytest.mark.parametrize(("raw", "version"), [("550.54.15", "550.54.15"), ("550.90", "550.90.0"),
                                              ("535.129.03", "535.129.3"), ("6.8.5.60100", "6.8.5"), ("12", "12.0.0")])
def test_driver_versions_become_semantic_versions(raw: str, version: str) -> None:
    assert semver(raw) == version


@pytest.mark.parametrize("raw", ["", "  ", "550.x", "6.8.5-rc1"])
def test_a_version_that_is_not_numbers_is_left_out(raw: str) -> None:
    assert semver(raw) is None


def test_each_attribute_takes_the_api_form_of_its_type() -> None:
    published = device("gpu-0", productName="H100", numaNode=1, virtual=False, driverVersion=Version("550.54.15"))
    assert published.document() == {
        "name": "gpu-0",
        "attributes": {"driverVersion": {"version": "550.54.15"}, "numaNode": {"int": 1},
                       "productName": {"string": "H100"}, "virtual": {"bool": False}},
        "capacity": {"memory": {"value": "80Gi"}},
    }


def test_one_pool_per_driver_named_after_the_node() -> None:
    slices = resource_slices("node-a", {"gpu.nvidia.com": [device("gpu-0")], "gpu.amd.com": [device("gpu-1-128")]},
                             generation=3)
    assert [(s["metadata"]["name"], s["spec"]["driver"]) for s in slices] == [
        ("node-a-gpu-amd-com-0", "gpu.amd.com"), ("node-a-gpu-nvidia-com-0", "gpu.nvidia.com")]
    for published in slices:
        assert published["apiVersion"] == "resource.k8s.io/v1" and published["kind"] == "ResourceSlice"
        assert published["spec"]["nodeName"] == "node-a"
        assert published["spec"]["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}


def test_a_pool_over_128_devices_is_split_over_slices_that_say_how_many_there_are() -> None:
    many = [device(f"gpu-{i}") for i in range(2 * MAX_DEVICES_PER_SLICE + 1)]
    slices = resource_slices("n", {"gpu.nvidia.com": many})
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 1]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert [s["metadata"]["name"] for s in slices] == ["n-gpu-nvidia-com-0", "n-gpu-nvidia-com-1", "n-gpu-nvidia-com-2"]
    assert [d["name"] for s in slices for d in s["spec"]["devices"]] == [d.name for d in many]


def test_a_driver_without_devices_publishes_no_slice() -> None:
    assert resource_slices("n", {"gpu.nvidia.com": []}) == []


def test_unhealthy_devices_leave_the_slices_by_their_physical_health_key() -> None:
    """Without DRADeviceTaints: the devices tainted for their health key's faults are left out."""
    devices = {"gpu.nvidia.com": [device("gpu-0"), device("gpu-1")]}
    faults = {"key-gpu-1": ["XID 79"]}
    assert [d.name for d in untainted(taints.published(devices, faults, {})["gpu.nvidia.com"])] == ["gpu-0"]
    assert [d.name for d in untainted(taints.published(devices, {}, {})["gpu.nvidia.com"])] == ["gpu-0", "gpu-1"]


# --- the vendors' devices ------------------------------------------------------------------------

def test_nvidia_mig_devices_replace_their_gpu_and_carry_its_attributes() -> None:
    inventory = nvidia(nvidia_gpu(0), nvidia_gpu(1, mig=("1g.5gb", "1g.5gb")))
    found = nvidia_devices(inventory, Offer(), Config())
    # placements unknown: named by their instance ids, and no memory slices
    assert [d.name for d in found] == ["gpu-0", "gpu-1-mig-gi1-ci0", "gpu-1-mig-gi2-ci0"]
    assert not any(name.startswith("memorySlice") for d in found for name in d.capacity)
    whole, mig = found[0], found[1]
    assert whole.attributes["type"].value == "gpu" and mig.attributes["type"].value == "mig"
    assert mig.attributes["parentUUID"].value == "GPU-1" and mig.attributes["profile"].value == "1g.5gb"
    assert mig.attributes["productName"].value == whole.attributes["productName"].value == "NVIDIA A100-SXM4-40GB"
    assert mig.capacity["memory"].value == 4864 << 20 and whole.capacity["memory"].value == 40 << 30
    assert [d.health_key for d in found] == ["GPU-0", "MIG-1-0", "MIG-1-1"]
    assert mig.document()["attributes"]["cudaDriverVersion"] == {"version": "12.4.0"}


def placed(mig: MigDevice, profile_id: int, start: int, size: int, slices: tuple[int, int] = (1, 1)) -> MigDevice:
    return replace(mig, gpu_instance_profile_id=profile_id, placement_start=start, placement_size=size,
                   slices_gi=slices[0], slices_ci=slices[1])


def test_nvidia_mig_devices_are_named_by_their_gpu_instance_profile_and_placement_as_nvidias() -> None:
    gpu = nvidia_gpu(3, mig=("3g.20gb", "1g.5gb"))
    three, one = gpu.mig_devices
    gpu = replace(gpu, mig_devices=(placed(three, 9, 4, 4, (3, 3)), placed(one, 19, 0, 1)))
    (first, second) = nvidia_devices(nvidia(gpu), Offer(), Config())
    # gpu-<minor>-mig-<profile, DNS-label form>-<GI profile id>-<placement start> (NVIDIA's mig.go)
    assert (first.name, second.name) == ("gpu-3-mig-3g20gb-9-4", "gpu-3-mig-1g5gb-19-0")
    slices = {name: c.value for name, c in first.capacity.items() if name.startswith("memorySlice")}
    assert slices == {"memorySlice4": 1, "memorySlice5": 1, "memorySlice6": 1, "memorySlice7": 1}
    assert [name for name in second.capacity if name.startswith("memorySlice")] == ["memorySlice0"]
    assert second.document()["capacity"]["memorySlice0"] == {"value": "1"}
    where = first.capacity["memorySlice4"]
    assert where.backend == "nvml" and where.source == (
        "nvmlGpuInstanceGetInfo(GPU instance 1 of GPU 3 (GPU-3)): profileId 9, placement 4:4")


@pytest.mark.parametrize(("profile", "label"), [("1g.5gb", "1g5gb"), ("7g.80gb", "7g80gb"), ("1g.10gb+me", "1g10gb-me"),
                                              ("1g.12gb-me", "1g12gb-me"), ("1g.24gb+gfx", "1g24gb-gfx"),
                                              ("1g.10gb+me.all", "1g10gb-meall"), ("1c.3g.20gb", "1c3g20gb")])
def test_a_mig_profile_goes_into_a_device_name_as_nvidias_driver_puts_it(profile: str, label: str) -> None:
    assert profile_label(profile) == label
    gpu = nvidia_gpu(4, mig=(profile,))
    gpu = replace(gpu, mig_devices=(placed(gpu.mig_devices[0], 20, 6, 1),))
    (found,) = nvidia_devices(nvidia(gpu), Offer(), Config())
    assert found.name == f"gpu-4-mig-{label}-20-6"


# The attributes NVIDIA's own test suite expects its driver to publish (tests/bats/test_gpu_basic.bats
# and test_gpu_mig.bats, "inspect device attributes in resource slice").
NVIDIAS_GPU_ATTRIBUTES = {"architecture", "brand", "cudaComputeCapability", "cudaDriverVersion", "driverVersion",
                          "productName", "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot", "type",
                          "uuid", "addressingMode"}
NVIDIAS_MIG_ATTRIBUTES = NVIDIAS_GPU_ATTRIBUTES | {"parentUUID", "profile"}


def test_nvidia_devices_publish_the_attributes_nvidias_driver_does() -> None:
    gpus = (replace(nvidia_gpu(0), brand="Nvidia", addressing_mode="ATS"),
            replace(nvidia_gpu(1, mig=("1g.5gb",)), brand="Nvidia", addressing_mode="ATS"))
    pci = tuple(PciGpu(g.pci_bus_id, 0x10DE, 0x20B0, 0x030200, pcie_root="pci0000:40") for g in gpus)
    whole, mig = nvidia_devices(replace(nvidia(*gpus), pci_gpus=pci), Offer(), Config())
    assert set(whole.attributes) == NVIDIAS_GPU_ATTRIBUTES and set(mig.attributes) == NVIDIAS_MIG_ATTRIBUTES
    assert "pcieBusID" not in whole.attributes  # NVIDIA's until v25.8
    for device in (whole, mig):  # a MIG device carries its GPU's
        attributes = device.document()["attributes"]
        assert attributes["brand"] == {"string": "Nvidia"} and attributes["addressingMode"] == {"string": "ATS"}
        assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:40"}
    assert whole.document()["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": gpus[0].pci_bus_id}
    assert mig.document()["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": gpus[1].pci_bus_id}
    root = whole.attributes["resource.kubernetes.io/pcieRoot"]
    assert (root.backend, root.source) == ("sysfs", f"/sys/bus/pci/devices/{gpus[0].pci_bus_id} -> "
                                                    f"/sys/devices/pci0000:40/.../{gpus[0].pci_bus_id}")


def test_compute_instances_sharing_a_gpu_instance_keep_their_instance_names() -> None:
    """NVIDIA's driver publishes no MIG device smaller than its GPU instance; two of them would share
    the placement's name, so theirs stay by instance ids, without memory slices."""
    gpu = nvidia_gpu(0, mig=("1c.3g.20gb", "2c.3g.20gb"))
    one, two = gpu.mig_devices
    gpu = replace(gpu, mig_devices=(placed(one, 9, 0, 4, (3, 1)),
                                    placed(replace(two, gpu_instance_id=1, compute_instance_id=1), 9, 0, 4, (3, 2))))
    found = nvidia_devices(nvidia(gpu), Offer(), Config())
    assert [d.name for d in found] == ["gpu-0-mig-gi1-ci0", "gpu-0-mig-gi1-ci1"]
    assert not any(name.startswith("memorySlice") for d in found for name in d.capacity)


def test_an_nvidia_value_the_inventory_lacks_is_left_out() -> None:
    gpu = replace(nvidia_gpu(0), memory_bytes=0, compute_capability=None)
    (found,) = nvidia_devices(nvidia(gpu, driver_version="", cuda_driver_version=0), Offer(), Config())
    assert "memory" not in found.capacity
    assert not {"cudaComputeCapability", "architecture", "driverVersion", "cudaDriverVersion", "brand",
                "addressingMode", "resource.kubernetes.io/pcieRoot"} & set(found.attributes)


def amd_gpu(nodes: int, *, card: int | None = 0, vram: int | None = 64 << 30, numa: int | None = 0,
            compute: str | None = None) -> AmdGpu:
    compute_nodes = tuple(AmdComputeNode(kfd_node=1 + i, gpu_id=None, render_minor=128 + i,
                                         card=None if card is None else card + i, simd_count=152, simd_per_cu=4,
                                         vram_bytes=vram, gfx_target_version=90402, location_id=0x500 + i, domain=0,
                                         numa_node=numa) for i in range(nodes))
    return AmdGpu(bdf="0000:05:00.0", device_id=0x74A1, revision=0, product_name="AMD Instinct MI300X (OAM)",
                  family="AI", nodes=compute_nodes, compute_partition=compute,
                  memory_partition="nps4" if compute else None, numa_node=numa)


def amd(gpu: AmdGpu, version: str = "6.8.5.60100") -> Inventory:
    return Inventory(parts=(AmdInventory(driver_version=version, driver_src_version="", gpus=(gpu,)),))


def test_amd_partitions_share_their_gpus_bus_id_and_root_complex_and_carry_their_profile() -> None:
    pci = PciGpu("0000:05:00.0", 0x1002, 0x74A1, 0x120000, pcie_root="pci0000:00")
    found = amd_devices(replace(amd(amd_gpu(2, compute="cpx")), pci_gpus=(pci,)), Offer(), Config())
    assert [d.name for d in found] == ["gpu-0-128", "gpu-1-129"]
    for published in found:
        attributes = published.document()["attributes"]
        assert attributes["type"] == {"string": "amdgpu-partition"}
        assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:05:00.0"}
        assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
        assert attributes["partitionProfile"] == {"string": "cpx_nps4"}
        assert attributes["deviceID"] == {"string": "0x74a1"}
        assert attributes["productName"] == {"string": "AMD_Instinct_MI300X_OAM"}
        assert attributes["driverVersion"] == {"version": "6.8.5"}
        assert attributes["numaNode"] == {"int": 0}
        assert published.document()["capacity"] == {"computeUnits": {"value": "38"}, "memory": {"value": "64Gi"},
                                                    "simdUnits": {"value": "152"}}


def test_an_amd_value_the_inventory_lacks_is_left_out_never_made_up() -> None:
    (found,) = amd_devices(amd(amd_gpu(1, card=None, vram=None, numa=None), version=""), Offer(), Config())
    assert found.name == "gpu-render128"
    assert found.attributes["type"].value == "amdgpu"
    assert "memory" not in found.capacity
    assert not {"numaNode", "driverVersion", "driverVersionFull", "partitionProfile",
                "resource.kubernetes.io/pcieRoot"} & set(found.attributes)


# --- which vendors DRA serves -----------------------------------------------------------------------

def test_dra_serves_no_vendor_by_default() -> None:
    config = parse_config({}, RESOURCE_NAMES)
    assert config.dra_vendors == ()
    inventory = nvidia(nvidia_gpu(0))
    assert Host(host_root=Path("/"), config=config).dra_devices(inventory, Offer()) == {}


def test_the_vendors_dra_serves_come_from_the_labeller_section() -> None:
    config = parse_config({"labeller": {"dra": {"vendors": ["nvidia", "amd"]}}}, RESOURCE_NAMES)
    assert config.dra_vendors == ("nvidia", "amd")
    inventory = nvidia(nvidia_gpu(0))
    found = Host(host_root=Path("/"), config=config).dra_devices(inventory, Offer())
    assert list(found) == ["gpu.nvidia.com"]  # no AMD GPU here: no AMD driver
    assert [d.name for d in found["gpu.nvidia.com"]] == ["gpu-0"]


@pytest.mark.parametrize(("vendors", "message"), [
    ("nvidia", "labeller.dra.vendors: must be a list of vendors (known: nvidia, amd), got 'nvidia'"),
    (["intel"], "labeller.dra.vendors[0]: 'intel' is not a vendor with a DRA driver (known: nvidia, amd)"),
    (["amd", "amd"], "labeller.dra.vendors[1]: amd is listed twice"),
])
def test_a_bad_vendor_list_is_one_line_naming_the_key(vendors: Any, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config({"labeller": {"dra": {"vendors": vendors}}}, RESOURCE_NAMES)
    assert str(error.value) == message


def test_an_unknown_key_under_dra_is_named() -> None:
    with pytest.raises(ConfigError, match=r"^labeller\.dra\.vendor: unknown key \(known here: dynamicMig, vendors\)$"):
        parse_config({"labeller": {"dra": {"vendor": ["nvidia"]}}}, RESOURCE_NAMES)
