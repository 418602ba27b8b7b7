"""The NVML backend read through the fake pynvml: what it collects, and how it fails."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import structlog

from labeller.inventory import NVIDIA_VENDOR_ID, PciGpu
from tests.nvidia.nvidia_node import (
    A100_40GB_BYTES, A100_80GB_BYTES, H100_BYTES, a100, build, h100, inventory_of, labels_of, section,
)
from vendors import nvidia, pci

H200_BYTES = 143771 * 1024 * 1024  # nvidia-smi on an H200: 143771MiB


@pytest.mark.parametrize(("memory_mib", "total_bytes", "gb"), [
    (4864, A100_40GB_BYTES, 5),  # A100-40GB 1g.5gb: 4.75 GiB
    (9984, A100_40GB_BYTES, 10),  # 2g.10gb: 9.75 GiB
    (20096, A100_40GB_BYTES, 20),  # 3g.20gb and 4g.20gb: 19.62 GiB
    (40448, A100_40GB_BYTES, 40),  # 7g.40gb: 39.50 GiB
    (9728, A100_80GB_BYTES, 10),  # A100-80GB 1g.10gb: 9.50 GiB
    (16384, H200_BYTES, 18),  # H200 1g.18gb: 16.00 GiB
    (33024, H200_BYTES, 35),  # H200 1g.35gb: 32.25 GiB
    (71168, H200_BYTES, 71),  # H200 3g.71gb: 69.50 GiB; 70.5 rounds up as in Go, not to even
])
def test_mig_memory_gb_matches_nvidia_profile_names(memory_mib: int, total_bytes: int, gb: int) -> None:
    assert nvidia.mig_memory_gb(memory_mib, total_bytes) == gb


def test_dgx_like_node_is_fully_described(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, section(h100(repeat=2, numa_node=[0, 1], nvlink_peers="all", pci_device_id=0x2330)))
    assert inventory.nvidia is not None
    assert (inventory.nvidia.driver_version, inventory.nvidia.cuda_driver_version) == ("550.54.15", 12040)
    first, second = inventory.nvidia.gpus
    assert first.name == "NVIDIA H100 80GB HBM3" and first.memory_bytes == H100_BYTES
    assert first.compute_capability == (9, 0)
    assert (first.pci_bus_id, second.pci_bus_id) == ("0000:00:00.0", "0000:01:00.0")
    assert (first.numa_node, second.numa_node) == (0, 1)
    assert first.pci_class == 0x030200 and (first.minor_number, second.minor_number) == (0, 1)
    assert (first.mig_capable, first.mig_enabled, first.mig_devices) == (True, False, ())
    assert first.nvlink_peers == ("0000:01:00.0",) and second.nvlink_peers == ("0000:00:00.0",)
    assert inventory.nvidia.vgpu_present is False
    assert not inventory.partial


def test_nvml_is_shut_down_after_every_probe(tmp_path: Path) -> None:
    root, nvml = build(tmp_path, section(h100()))
    for _ in range(2):
        nvidia.probe(root, pci.scan(root)[0], nvml)
        assert nvml.state.init_count == 0


def test_mig_devices_get_go_nvlib_profile_names(tmp_path: Path) -> None:
    migs = [
        {"profile": "1c.3g.20gb", "uuid": "MIG-c{i}", "memory_mib": 20096, "multiprocessors": 14, "gpu_instance_id": 1},
        {"profile": "2c.3g.20gb", "uuid": "MIG-d{i}", "memory_mib": 20096, "gpu_instance_id": 1, "compute_instance_id": 1},
        {"profile": "1g.5gb+me", "uuid": "MIG-e{i}", "memory_mib": 4864, "engines_jpeg": 1, "engines_ofa": 1},
        {"profile": "1g.5gb", "uuid": "MIG-f{i}", "memory_mib": 4864},
    ]
    inventory = inventory_of(tmp_path, section(a100(mig_mode="enabled", mig_devices=migs)))
    assert inventory.nvidia is not None
    gpu = inventory.nvidia.gpus[0]
    assert gpu.mig_enabled and [m.profile for m in gpu.mig_devices] == ["1c.3g.20gb", "2c.3g.20gb", "1g.5gb+me", "1g.5gb"]
    plus_me = gpu.mig_devices[2]
    assert plus_me.resource_name == "nvidia.com/mig-1g.5gb.me"
    assert (plus_me.memory_mib, plus_me.slices_gi, plus_me.slices_ci, plus_me.engines_jpeg) == (4864, 1, 1, 1)
    first = gpu.mig_devices[0]
    assert (first.slices_gi, first.slices_ci, first.multiprocessors, first.gpu_instance_id) == (3, 1, 14, 1)


def test_nvml_library_missing_leaves_pci_presence_only(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        inventory = inventory_of(tmp_path, section(h100(repeat=2), nvml_error="library_not_found"))
    report = next(r for r in inventory.reports if r.backend == "nvidia")
    assert inventory.nvidia is None and report.status == "unavailable" and inventory.partial
    assert report.detail.startswith("NVML library not found")
    assert "nvidia.com/gpu.present still set from PCI" in report.detail
    assert any(e.get("vendor") == "nvidia" and "NVML library not found" in e.get("reason", "") for e in logs)
    assert labels_of(tmp_path / "again", section(h100(), nvml_error="library_not_found")) == {"nvidia.com/gpu.present": "true"}


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
    gpu = PciGpu("0000:18:00.0", NVIDIA_VENDOR_ID, 0x2330, 0x030200)
    inventory, report = nvidia.probe(tmp_path, (gpu,), None)
    assert inventory is None and report.status == "unavailable"
    assert nvidia.probe(tmp_path, (), None)[1].status == "absent"


def test_one_failing_gpu_is_skipped_and_the_others_kept(tmp_path: Path) -> None:
    gpus = (h100(), h100(uuid="GPU-bad", pci_bus_id="0000:aa:00.0", error="unknown"), h100())
    with structlog.testing.capture_logs() as logs:
        inventory = inventory_of(tmp_path, section(*gpus))
    assert inventory.nvidia is not None and [g.index for g in inventory.nvidia.gpus] == [0, 2]
    report = next(r for r in inventory.reports if r.backend == "nvidia")
    assert report.status == "ok" and report.problems and "GPU 1" in report.problems[0] and inventory.partial
    assert any(e.get("vendor") == "nvidia" and e.get("device") == 1 for e in logs)
    assert labels_of(tmp_path / "labels", section(*gpus))["nvidia.com/gpu.count"] == "2"


def test_probe_never_raises(tmp_path: Path) -> None:
    broken = ModuleType("broken_pynvml")
    inventory, report = nvidia.probe(tmp_path, (), broken)
    assert inventory is None and report.status == "error"


def test_vgpu_capability_in_pci_config_space(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, section(h100(), h100(vgpu=True)))
    assert inventory.nvidia is not None and inventory.nvidia.vgpu_present is True


def test_unreadable_pci_config_means_no_vgpu_and_a_problem(tmp_path: Path) -> None:
    root, nvml = build(tmp_path, section(h100()))
    (root / "sys/bus/pci/devices/0000:00:00.0/config").unlink()
    inventory, report = nvidia.probe(root, pci.scan(root)[0], nvml)
    assert inventory is not None and inventory.vgpu_present is False and "vGPU" in report.problems[0]


def test_has_vgpu_capability_walks_the_list() -> None:
    config = bytearray(256)
    config[0x06], config[0x34] = 0x10, 0x40
    config[0x40:0x42] = bytes([0x05, 0x50])
    config[0x50:0x55] = bytes([0x09, 0x00, 0x14]) + b"VF"
    assert nvidia.has_vgpu_capability(bytes(config))
    config[0x53:0x55] = b"XX"
    assert not nvidia.has_vgpu_capability(bytes(config))
    assert not nvidia.has_vgpu_capability(bytes(config[:64]))  # unprivileged read: header only


def test_fabric_clique(tmp_path: Path) -> None:
    fabric = {"cluster_uuid": "7b968a6d-c8aa-45e1-9e07-e1e51be99c31", "clique_id": 1}
    inventory = inventory_of(tmp_path, section(h100(fabric=fabric)))
    assert inventory.nvidia is not None
    assert inventory.nvidia.gpus[0].clique == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"


def test_a_pynvml_without_the_fabric_api_still_describes_the_gpus(tmp_path: Path) -> None:
    # nvidia-ml-py releases before the GPU fabric API lack c_nvmlGpuFabricInfo_v2_t.
    root, nvml = build(tmp_path, section(h100(repeat=2)))
    del nvml.c_nvmlGpuFabricInfo_v2_t
    inventory, report = nvidia.probe(root, pci.scan(root)[0], nvml)
    assert report.status == "ok" and inventory is not None
    assert [gpu.clique for gpu in inventory.gpus] == [None, None]
