"""The NVML backend read through the fake pynvml: what it collects, and how it fails."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import structlog

from labeller.model.config import Config
from labeller.model.inventory import Inventory, PciGpu
from tests.builders import (
    A100_40GB_BYTES,
    A100_80GB_BYTES,
    H100_BYTES,
    a100,
    build,
    h100,
    inventory_of,
    label_set_of,
    labels_of,
    mig_1g5gb,
    nvidia_part,
    pci_scan,
    promptly,
    section,
)
from vendors.nvidia import nvml as backend
from vendors.nvidia.facts import PCI_VENDOR_ID, mig_memory_gb
from vendors.nvidia.model import NvidiaInventory

H200_BYTES = 143771 * 1024 * 1024  # nvidia-smi on an H200: 143771MiB


@pytest.mark.parametrize(("memory_mib", "total_bytes", "gb"), [
    (4864, A100_40GB_BYTES, 5),  # A100-40GB 1g.5gb: 4.75 GiB
    (9984, A100_40GB_BYTES, 10),  # 2g.10gb: 9.75 GiB
    (20096, A100_40GB_BYTES, 20),  # 3g.20gb and 4g.20gb: 19.62 GiB
    (40448, A100_40GB_BYTES, 40),  # 7g.40gb: 39.50 GiB
    (9728, A100_80GB_BYTES, 10),  # A100-80GB 1g.10gb: 9.50 GiB
    (16384, H200_BYTES, 18),  # H200 1g.18gb: 16.00 GiB
    (33024, H200_BYTES, 35),  # H200 1g.35gb in an older listing: 32.25 GiB
    (71168, H200_BYTES, 71),  # H200 3g.71gb in an older listing: 69.50 GiB; 70.5 rounds up as in Go, not to even
    (33280, 150754820096, 35),  # a real H200's NVML, driver 580.159.04: 1g.35gb, 32.50 GiB
    (71424, 150754820096, 71),  # and 3g.71gb, 69.75 GiB (tests/fixtures/nvidia/h200-passthrough/nvml.json)
])
def test_mig_memory_gb_matches_nvidia_profile_names(memory_mib: int, total_bytes: int, gb: int) -> None:
    assert mig_memory_gb(memory_mib, total_bytes) == gb


def test_dgx_like_node_is_fully_described(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path,
                             section(h100(repeat=2, numa_node=[0, 1], nvlink_peers="all", pci_device_id=0x2330)))
    assert inventory.part(NvidiaInventory) is not None
    assert (nvidia_part(inventory).driver_version, nvidia_part(inventory).cuda_driver_version) == ("550.54.15", 12040)
    first, second = nvidia_part(inventory).gpus
    assert first.name == "NVIDIA H100 80GB HBM3" and first.memory_bytes == H100_BYTES
    assert first.compute_capability == (9, 0)
    assert (first.pci_bus_id, second.pci_bus_id) == ("0000:00:00.0", "0000:01:00.0")
    assert (first.numa_node, second.numa_node) == (0, 1)
    assert first.pci_class == 0x030200 and (first.minor_number, second.minor_number) == (0, 1)
    assert (first.mig_capable, first.mig_enabled, first.mig_devices) == (True, False, ())
    assert first.nvlink_peers == ("0000:01:00.0",) and second.nvlink_peers == ("0000:00:00.0",)
    assert nvidia_part(inventory).vgpu_present is False
    assert not inventory.partial


def test_nvml_is_shut_down_after_every_probe(tmp_path: Path) -> None:
    root, nvml = build(tmp_path, section(h100()))
    for _ in range(2):
        backend.probe(root, pci_scan(root)[0], None, nvml)
        assert nvml.state.init_count == 0


def test_mig_devices_get_go_nvlib_profile_names(tmp_path: Path) -> None:
    migs = [
        {"profile": "1c.3g.20gb", "uuid": "MIG-c{i}", "memory_mib": 20096, "multiprocessors": 14, "gpu_instance_id": 1},
        {"profile": "2c.3g.20gb", "uuid": "MIG-d{i}", "memory_mib": 20096, "gpu_instance_id": 1,
         "compute_instance_id": 1},
        {"profile": "1g.5gb+me", "uuid": "MIG-e{i}", "memory_mib": 4864, "engines_jpeg": 1, "engines_ofa": 1},
        {"profile": "1g.5gb", "uuid": "MIG-f{i}", "memory_mib": 4864},
    ]
    inventory = inventory_of(tmp_path, section(a100(mig_mode="enabled", mig_devices=migs)))
    assert inventory.part(NvidiaInventory) is not None
    gpu = nvidia_part(inventory).gpus[0]
    assert gpu.mig_enabled and [m.profile for m in gpu.mig_devices] == ["1c.3g.20gb", "2c.3g.20gb",
                                                                        "1g.5gb+me", "1g.5gb"]
    plus_me = gpu.mig_devices[2]
    assert plus_me.resource_name == "nvidia.com/mig-1g.5gb.me"
    assert (plus_me.memory_mib, plus_me.slices_gi, plus_me.slices_ci, plus_me.engines_jpeg) == (4864, 1, 1, 1)
    first = gpu.mig_devices[0]
    assert (first.slices_gi, first.slices_ci, first.multiprocessors, first.gpu_instance_id) == (3, 1, 14, 1)


def test_mig_devices_carry_their_gpu_instance_profile_id_and_placement(tmp_path: Path) -> None:
    """A 3-2-1-1 A100 as the MIG user guide's example places it (the 3g.20gb fits only on memory
    slices 4-7 beside the others); the probe reads what NVML says of each GPU instance."""
    migs = [
        {"profile": "3g.20gb", "uuid": "MIG-a{i}", "memory_mib": 20096},
        {"profile": "2g.10gb", "uuid": "MIG-b{i}", "memory_mib": 9984},
        {**mig_1g5gb(), "uuid": "MIG-c{i}"},
        {**mig_1g5gb(), "uuid": "MIG-d{i}", "placement_start": 1},
    ]
    inventory = inventory_of(tmp_path, section(a100(mig_mode="enabled", mig_devices=migs)))
    found = [(m.profile, m.gpu_instance_profile_id, m.placement_start, m.placement_size)
             for m in nvidia_part(inventory).gpus[0].mig_devices]
    assert found == [("3g.20gb", 9, 4, 4), ("2g.10gb", 14, 2, 2), ("1g.5gb", 19, 0, 1), ("1g.5gb", 19, 1, 1)]
    assert nvidia_part(inventory).gpus[0].mig_devices[0].memory_slices == range(4, 8)


def test_a_gpu_instance_without_a_placement_leaves_it_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, nvml = build(tmp_path, section(a100(mig_mode="enabled", mig_devices=[mig_1g5gb()])))
    answer = nvml.nvmlGpuInstanceGetInfo

    def without_placement(gpu_instance: Any) -> Any:
        info = answer(gpu_instance)
        info.placement.start = info.placement.size = 0
        return info

    monkeypatch.setattr(nvml, "nvmlGpuInstanceGetInfo", without_placement)
    inventory, report = backend.probe(root, pci_scan(root)[0], None, nvml)
    assert report.problems == () and inventory is not None
    (mig,) = inventory.gpus[0].mig_devices
    assert (mig.profile, mig.gpu_instance_profile_id, mig.placement_start, mig.placement_size) == ("1g.5gb", 19, None,
                                                                                                   None)
    assert mig.memory_slices is None


def test_nvml_library_missing_leaves_pci_presence_only(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        inventory = inventory_of(tmp_path, section(h100(repeat=2), nvml_error="library_not_found"))
    report = next(r for r in inventory.reports if r.backend == "nvidia")
    assert inventory.part(NvidiaInventory) is None and report.status == "unavailable" and inventory.partial
    assert report.detail.startswith("NVML library not found")
    assert "nvidia.com/gpu.present still set from PCI" in report.detail
    # logged once, by discovery, with the backend's report (not also by the NVIDIA backend itself)
    [logged] = [e for e in logs if "NVML library not found" in e.get("reason", "")]
    assert logged["backend"] == "nvidia" and logged["log_level"] == "warning"
    assert labels_of(tmp_path / "again",
                     section(h100(), nvml_error="library_not_found")) == {"nvidia.com/gpu.present": "true"}


def test_driver_not_loaded_is_unavailable_and_unbinds_the_driver(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, section(h100(), nvml_error="driver_not_loaded"))
    report = next(r for r in inventory.reports if r.backend == "nvidia")
    assert report.status == "unavailable" and report.detail.startswith("NVIDIA driver not loaded")
    assert inventory.pci_gpus[0].driver is None


def test_no_nvidia_gpu_and_no_library_is_absent(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, section(nvml_error="library_not_found"))
    report = next(r for r in inventory.reports if r.backend == "nvidia")
    assert report.status == "absent" and not inventory.partial


def test_other_init_failure_is_an_error(tmp_path: Path) -> None:
    report = next(r for r in inventory_of(tmp_path, section(h100(), nvml_error="no_permission")).reports
                  if r.backend == "nvidia")
    assert report.status == "error" and "Insufficient Permissions" in report.detail


def test_real_pynvml_without_libnvidia_ml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_library(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    # The real pynvml, with the driver's library missing as on a node without a driver.
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    gpu = PciGpu("0000:18:00.0", PCI_VENDOR_ID, 0x2330, 0x030200)
    inventory, report = backend.probe(tmp_path, (gpu,), None, None)
    assert inventory is None and report.status == "unavailable"
    assert backend.probe(tmp_path, (), None, None)[1].status == "absent"


def test_one_failing_gpu_is_skipped_and_the_others_kept(tmp_path: Path) -> None:
    gpus = (h100(), h100(uuid="GPU-bad", pci_bus_id="0000:aa:00.0", error="unknown"), h100())
    with structlog.testing.capture_logs() as logs:
        inventory = inventory_of(tmp_path, section(*gpus))
    assert inventory.part(NvidiaInventory) is not None and [g.index for g in nvidia_part(inventory).gpus] == [0, 2]
    report = next(r for r in inventory.reports if r.backend == "nvidia")
    assert report.status == "ok" and report.problems and "GPU 1" in report.problems[0] and inventory.partial
    assert any(e.get("vendor") == "nvidia" and e.get("device") == 1 for e in logs)
    assert labels_of(tmp_path / "labels", section(*gpus))["nvidia.com/gpu.count"] == "2"


def test_probe_never_raises(tmp_path: Path) -> None:
    broken = ModuleType("broken_pynvml")
    inventory, report = backend.probe(tmp_path, (), None, broken)
    assert inventory is None and report.status == "error"


HOST_DRIVER = {"host_driver_version": "550.54.16", "host_driver_branch": "r550_40"}


def test_vgpu_guest_labels_carry_the_host_driver_from_the_capability_record(tmp_path: Path) -> None:
    found = labels_of(tmp_path, section(h100(), h100(vgpu=HOST_DRIVER)))
    assert {k: v for k, v in found.items() if k.startswith("nvidia.com/vgpu.")} == {
        "nvidia.com/vgpu.present": "true",
        "nvidia.com/vgpu.host-driver-version": "550.54.16",
        "nvidia.com/vgpu.host-driver-branch": "r550_40",
    }


def test_a_vgpu_capability_without_a_host_driver_record_still_says_present(tmp_path: Path) -> None:
    found = labels_of(tmp_path, section(h100(vgpu=True)))
    assert found["nvidia.com/vgpu.present"] == "true" and "nvidia.com/vgpu.host-driver-version" not in found


def truncate_config_spaces(root: Path, size: int = 64) -> None:
    """What a reader without CAP_SYS_ADMIN sees: the first 64 bytes of each config space."""
    for config in root.glob("sys/bus/pci/devices/*/config"):
        config.write_bytes(config.read_bytes()[:size])


@pytest.mark.parametrize("vgpu", [False, True])
def test_without_the_full_config_space_nvml_says_whether_a_gpu_is_a_vgpu(tmp_path: Path, vgpu: bool) -> None:
    root, nvml = build(tmp_path, section(h100(vgpu=HOST_DRIVER if vgpu else False), h100()))
    truncate_config_spaces(root)
    (root / "sys/bus/pci/devices/0000:01:00.0/config").unlink()  # unreadable counts the same
    inventory, report = backend.probe(root, pci_scan(root)[0], None, nvml)
    assert inventory is not None and report.problems == ()
    assert inventory.vgpu_present is vgpu and inventory.vgpu_host_driver is None  # the record needs the full space


def test_when_neither_config_space_nor_nvml_can_tell_the_vgpu_labels_are_omitted(tmp_path: Path) -> None:
    root, nvml = build(tmp_path, section(h100(), h100()))
    truncate_config_spaces(root)
    del nvml.nvmlDeviceGetVirtualizationMode  # a pynvml without the call
    inventory, report = backend.probe(root, pci_scan(root)[0], None, nvml)
    assert inventory is not None and inventory.vgpu_present is None and report.problems == ()
    found = label_set_of(Inventory(parts=(inventory,)), Config()).labels
    assert "nvidia.com/vgpu.present" not in found and found["nvidia.com/gpu.count"] == "2"


def test_host_driver_record_walk_rejects_malformed_records() -> None:
    version, branch = b"550.54.16".ljust(10, b"\0"), b"r550_40".ljust(10, b"\0")
    good = b"\x09\x00\x00VF" + bytes([7, 4, 0, 0]) + bytes([0, 22]) + version + branch
    assert backend.host_driver(good) == ("550.54.16", "r550_40")
    assert backend.host_driver(good[:-1]) is None  # record 0 runs past the capability
    assert backend.host_driver(good[:5] + bytes([7, 1]) + good[7:]) is None  # a record shorter than its header
    assert backend.host_driver(good[:5] + bytes([7, 200]) + good[7:]) is None  # a record past the end
    assert backend.host_driver(good[:9] + bytes([0, 21]) + good[11:]) is None  # record 0 too short for both fields
    assert backend.host_driver(good[:9]) is None  # no record 0 at all


def test_vgpu_capability_walks_the_list() -> None:
    config = bytearray(256)
    config[0x06], config[0x34] = 0x10, 0x40
    config[0x40:0x42] = bytes([0x05, 0x50])
    config[0x50:0x55] = bytes([0x09, 0x00, 0x14]) + b"VF"
    assert backend.vgpu_capability(bytes(config)) == bytes(config[0x50:0x64])  # the 20 bytes it says it spans
    config[0x53:0x55] = b"XX"
    assert backend.vgpu_capability(bytes(config)) is None
    assert backend.vgpu_capability(bytes(config[:64])) is None  # unprivileged read: header only


def test_fabric_clique(tmp_path: Path) -> None:
    fabric = {"cluster_uuid": "7b968a6d-c8aa-45e1-9e07-e1e51be99c31", "clique_id": 1}
    inventory = inventory_of(tmp_path, section(h100(fabric=fabric)))
    assert inventory.part(NvidiaInventory) is not None
    assert nvidia_part(inventory).gpus[0].clique == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"


def test_a_pynvml_without_the_fabric_api_still_describes_the_gpus(tmp_path: Path) -> None:
    # nvidia-ml-py releases before the GPU fabric API lack c_nvmlGpuFabricInfo_v2_t.
    root, nvml = build(tmp_path, section(h100(repeat=2)))
    del nvml.c_nvmlGpuFabricInfo_v2_t
    inventory, report = backend.probe(root, pci_scan(root)[0], None, nvml)
    assert report.status == "ok" and inventory is not None
    assert [gpu.clique for gpu in inventory.gpus] == [None, None]


def test_brand_and_addressing_mode_are_read_as_go_nvlib_names_them(tmp_path: Path) -> None:
    """NVIDIA's DRA driver publishes both: brand for every GPU, addressingMode where NVML has it (the
    call came with driver 580; before Turing it is not supported)."""
    gpus = [h100(), a100(name="NVIDIA GeForce RTX 4090", compute_capability=[8, 9]),
            a100(name="Tesla V100-SXM2-32GB", compute_capability=[7, 0])]
    old = nvidia_part(inventory_of(tmp_path / "550", section(*gpus))).gpus
    assert [(g.brand, g.addressing_mode) for g in old] == [("Nvidia", None), ("GeForceRTX", None), ("Nvidia", None)]
    new = nvidia_part(inventory_of(tmp_path / "580", section(*gpus, driver_version="580.65.06"))).gpus
    assert [(g.brand, g.addressing_mode) for g in new] == [("Nvidia", "None"), ("GeForceRTX", "None"),
                                                           ("Nvidia", None)]


def test_a_brand_or_addressing_mode_without_a_name_is_left_out_and_the_gpu_kept(tmp_path: Path) -> None:
    root, nvml = build(tmp_path, section(h100(), driver_version="580.65.06"))
    nvml.nvmlDeviceGetBrand = lambda handle: nvml.NVML_BRAND_NVIDIA_NPU  # a brand go-nvlib has no name for
    nvml.nvmlDeviceGetAddressingMode = lambda handle: 7
    inventory, report = backend.probe(root, pci_scan(root)[0], None, nvml)
    assert report.status == "ok" and report.problems == () and inventory is not None
    assert [(g.brand, g.addressing_mode) for g in inventory.gpus] == [(None, None)]


def test_a_pynvml_without_the_addressing_mode_call_still_describes_the_gpus(tmp_path: Path) -> None:
    root, nvml = build(tmp_path, section(h100(), driver_version="580.65.06"))
    del nvml.nvmlDeviceGetAddressingMode  # nvidia-ml-py before 13.580
    inventory, report = backend.probe(root, pci_scan(root)[0], None, nvml)
    assert report.problems == () and inventory is not None
    assert [(g.brand, g.addressing_mode) for g in inventory.gpus] == [("Nvidia", None)]


def missing_symbol(nvml: ModuleType, name: str, *, only_default_version: bool = False) -> None:
    """Make ``name`` fail as real pynvml does when the driver's libnvidia-ml lacks the symbol."""
    original = getattr(nvml, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        if only_default_version and kwargs.get("version") == 1:
            return original(*args, **kwargs)
        raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    setattr(nvml, name, call)


def test_a_driver_without_mig_still_gets_every_gpu_labelled(tmp_path: Path) -> None:
    # Drivers before R450 have no nvmlDeviceGetMigMode: GFD (go-nvlib) then calls the GPU not MIG-capable.
    root, nvml = build(tmp_path, section(h100(repeat=2)))
    missing_symbol(nvml, "nvmlDeviceGetMigMode")
    inventory, report = backend.probe(root, pci_scan(root)[0], None, nvml)
    assert report.status == "ok" and report.problems == () and inventory is not None
    assert [(gpu.mig_capable, gpu.mig_enabled) for gpu in inventory.gpus] == [(False, False), (False, False)]


def test_mig_profiles_are_read_through_the_v1_calls_on_drivers_without_the_v2_ones(tmp_path: Path) -> None:
    root, nvml = build(tmp_path, section(a100(mig_mode="enabled", mig_devices=[mig_1g5gb(2)])))
    missing_symbol(nvml, "nvmlDeviceGetGpuInstanceProfileInfo", only_default_version=True)
    missing_symbol(nvml, "nvmlGpuInstanceGetComputeInstanceProfileInfo", only_default_version=True)
    inventory, report = backend.probe(root, pci_scan(root)[0], None, nvml)
    assert report.problems == () and inventory is not None
    assert [mig.profile for mig in inventory.gpus[0].mig_devices] == ["1g.5gb", "1g.5gb"]


def test_the_fabric_clique_comes_from_the_first_fabric_call_when_the_versioned_one_is_missing(tmp_path: Path) -> None:
    fabric = {"cluster_uuid": "7b968a6d-c8aa-45e1-9e07-e1e51be99c31", "clique_id": 3}
    root, nvml = build(tmp_path, section(h100(fabric=fabric)))
    missing_symbol(nvml, "nvmlDeviceGetGpuFabricInfoV")
    inventory, _ = backend.probe(root, pci_scan(root)[0], None, nvml)
    assert inventory is not None and inventory.gpus[0].clique == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.3"


# --- a probe that cannot be trusted changes nothing -------------------------------------------------

@pytest.mark.parametrize(("gpu", "why"), [
    (h100(memory_bytes=5 << 40), "memory bytes 5497558138880 is outside 0..4398046511104"),
    (h100(compute_capability=[9, 12]), "compute capability minor 12 is outside 0..9"),
    (h100(compute_capability=[99, 0]), "compute capability major 99 is outside 0..30"),
])
def test_values_beyond_any_real_gpu_leave_that_gpu_out(tmp_path: Path, gpu: dict[str, Any], why: str) -> None:
    inventory = inventory_of(tmp_path, section(h100(), gpu, h100()))
    assert inventory.part(NvidiaInventory) is not None and [g.index for g in nvidia_part(inventory).gpus] == [0, 2]
    report = next(r for r in inventory.reports if r.backend == "nvidia")
    assert report.problems == (f"GPU 1: {why}, beyond any real GPU; GPU left out of the labels",)
    assert inventory.partial  # so the daemon removes nothing on its account
    assert labels_of(tmp_path / "labels", section(h100(), gpu, h100()))["nvidia.com/gpu.count"] == "2"


def test_a_mig_device_larger_than_its_gpu_leaves_the_gpu_out(tmp_path: Path) -> None:
    # on a 40 GB GPU whose model the MIG table does not know, so the simulation takes the entry's word
    huge = {"profile": "7g.85gb", "uuid": "MIG-huge", "memory_mib": 81920}
    unknown_model = a100(name="NVIDIA Z100", mig_mode="enabled", mig_devices=[huge])
    inventory = inventory_of(tmp_path, section(unknown_model, a100()))
    assert inventory.part(NvidiaInventory) is not None and [g.index for g in nvidia_part(inventory).gpus] == [1]
    report = next(r for r in inventory.reports if r.backend == "nvidia")
    assert report.problems == ("GPU 0: MIG device MIG-huge has 81920 MiB, more than its GPU's 40536 MiB, "
                               "beyond any real GPU; GPU left out of the labels",)


@pytest.mark.parametrize("make", ["fifo", "oversized"])
def test_a_config_space_that_cannot_be_trusted_is_reported_and_never_read_whole(tmp_path: Path, make: str) -> None:
    root, nvml = build(tmp_path, section(h100(vgpu=HOST_DRIVER), h100()))
    config = root / "sys/bus/pci/devices/0000:01:00.0/config"
    config.unlink()
    if make == "fifo":
        os.mkfifo(config)
        why = "a FIFO, not a regular file"
    else:
        config.write_bytes(bytes(8192))
        why = "larger than 4096 bytes, more than any real one"
    inventory, report = promptly(lambda: backend.probe(root, pci_scan(root)[0], None, nvml))
    assert inventory is not None and len(inventory.gpus) == 2
    assert report.problems == (f"0000:01:00.0: {config}: {why}",)
    assert inventory.vgpu_present is True  # GPU 0's full config space still says so
