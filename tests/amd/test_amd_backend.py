"""The AMD sysfs backend on real captures and on broken or missing files."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from labeller.model.config import Config
from labeller.model.inventory import BackendReport
from tests.builders import (
    FIRMWARE_INFO,
    PATIENCE_S,
    MI210,
    MI300X_CPX,
    RX7900XTX,
    TOPOLOGY,
    VEGA10,
    add_pci_device,
    amd_labels_of,
    amd_pci,
    amd_probe_of,
    copy_capture,
    discover_node,
    empty_node,
    label_set_of,
    promptly,
)
from vendors.amd import facts, ids
from vendors.amd import probe as backend
from vendors.amd.simulate import no_enrichment
from vendors.simulate import simulated_node


def test_mi300x_cpx_capture_groups_63_partitions_into_8_gpus() -> None:
    inventory, report = backend.probe(MI300X_CPX, (), enricher=no_enrichment)
    assert inventory is not None and report.status == "ok" and report.problems == ()
    assert [len(g.nodes) for g in inventory.gpus] == [8, 8, 8, 8, 8, 8, 8, 7]
    assert [g.bdf for g in inventory.gpus] == [
        "0000:05:00.0", "0000:27:00.0", "0000:47:00.0", "0000:65:00.0",
        "0000:85:00.0", "0000:a7:00.0", "0000:c7:00.0", "0000:e5:00.0",
    ]
    first = inventory.gpus[0]
    assert (first.device_id, first.family, first.product_name) == (0x74A1, "AI", "AMD Instinct MI300X")
    assert {n.simd_count for g in inventory.gpus for n in g.nodes} == {152}
    assert [n.render_minor for n in first.nodes] == list(range(128, 136))
    assert first.unique_id == "16404946649897475633"


def test_missing_partition_is_a_note_not_a_probe_failure() -> None:
    inventory, report = backend.probe(MI300X_CPX, (), enricher=no_enrichment)
    assert inventory is not None
    last = inventory.gpus[-1]
    assert (len(last.nodes), last.expected_partitions) == (7, 8)
    assert report.status == "ok" and report.problems == ()
    assert "0000:e5:00.0: 7 of 8 partitions" in report.detail


def test_mi210_capture_records_xgmi_and_pcie_links() -> None:
    inventory, report = backend.probe(MI210, (), enricher=no_enrichment)
    assert inventory is not None and report.status == "ok"
    assert len(inventory.gpus) == 8 and all(len(g.nodes) == 1 for g in inventory.gpus)
    by_node = {g.nodes[0].kfd_node: g.nodes[0] for g in inventory.gpus}
    assert (3, 11) in by_node[2].links and (0, 2) in by_node[2].links  # XGMI to node 3, PCIe to CPU node 0
    assert (6, 2) in by_node[2].links  # p2p_links too
    gpu = inventory.gpus[0]
    assert (gpu.device_id, gpu.family, gpu.expected_partitions) == (0x740F, "AI", None)
    assert gpu.nodes[0].simd_count // gpu.nodes[0].simd_per_cu == 104
    assert gpu.nodes[0].vram_bytes is None  # no mem_banks in this capture


def test_rx7900xtx_capture() -> None:
    inventory, _ = backend.probe(RX7900XTX, (), enricher=no_enrichment)
    assert inventory is not None
    (gpu,) = inventory.gpus
    assert (gpu.device_id, gpu.family, gpu.nodes[0].simd_per_cu) == (0x744C, "GC_11_0_0", 2)
    assert gpu.product_name is None  # 744C names differ by revision and the capture has none


def test_vega10_old_kernel_without_gfx_target_version() -> None:
    inventory, _ = backend.probe(VEGA10, (), enricher=no_enrichment)
    assert inventory is not None
    assert [g.family for g in inventory.gpus] == ["AI", "AI"]  # from the device id table
    assert [g.nodes[0].vram_bytes for g in inventory.gpus] == [17163091968] * 2
    assert inventory.gpus[0].nodes[0].gpu_id == 13261


def test_topology_is_found_under_devices_virtual(tmp_path: Path) -> None:
    root = tmp_path / "host"
    shutil.copytree(MI210 / "sys/class/kfd/kfd/topology", root / "sys/devices/virtual/kfd/kfd/topology")
    inventory, report = amd_probe_of(root)
    assert inventory is not None and len(inventory.gpus) == 8 and report.status == "ok"


def test_no_amd_anywhere_is_absent(tmp_path: Path) -> None:
    assert backend.probe(tmp_path, (), enricher=no_enrichment) == (None, BackendReport(
        "amd", "absent", "no AMD GPU on the PCI bus and no KFD topology"))


def test_amd_on_pci_without_driver_is_unavailable(tmp_path: Path) -> None:
    inventory, report = backend.probe(tmp_path, (amd_pci("0000:05:00.0", driver=None),), enricher=no_enrichment)
    assert inventory is None and report.status == "unavailable"
    assert "amdgpu module is not loaded" in report.detail


def test_amd_on_pci_with_module_but_no_kfd_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)
    _, report = backend.probe(tmp_path, (amd_pci("0000:05:00.0"),), enricher=no_enrichment)
    assert report.status == "unavailable" and "KFD topology is missing" in report.detail


def test_unreadable_properties_skips_only_that_partition(tmp_path: Path) -> None:
    root = copy_capture(MI210, tmp_path)
    properties = root / TOPOLOGY / "4/properties"
    properties.unlink()
    properties.mkdir()  # reading a directory fails even as root
    inventory, report = amd_probe_of(root)
    assert inventory is not None and len(inventory.gpus) == 7
    assert report.status == "ok" and report.problems == (f"KFD node 4: {properties}: a directory, not a regular file",)


def test_garbage_properties_is_a_problem(tmp_path: Path) -> None:
    root = copy_capture(MI210, tmp_path)
    (root / TOPOLOGY / "5/properties").write_text("\x00\x01 garbage\nsimd_count lots\n")
    inventory, report = amd_probe_of(root)
    assert inventory is not None and len(inventory.gpus) == 7
    assert report.problems == ("KFD node 5: properties has no recognisable content",)


def test_gpu_node_missing_required_keys_is_a_problem(tmp_path: Path) -> None:
    root = copy_capture(RX7900XTX, tmp_path)
    path = root / TOPOLOGY / "1/properties"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                            if not line.startswith("simd_per_cu")))
    inventory, report = amd_probe_of(root)
    assert inventory is None and report.status == "error"
    assert report.problems == ("KFD node 1: properties lacks simd_per_cu",)


def test_gpu_on_pci_but_missing_from_kfd_is_a_problem(tmp_path: Path) -> None:
    pci_gpus = (amd_pci("0000:05:00.0"), amd_pci("0000:f0:00.0"), amd_pci("0000:f1:00.0", driver="vfio-pci"))
    inventory, report = backend.probe(MI300X_CPX, pci_gpus, enricher=no_enrichment)
    assert inventory is not None
    assert report.problems == ("0000:f0:00.0: AMD GPU on the PCI bus but not in the KFD topology",)


def test_drm_module_and_partition_files_are_read(tmp_path: Path) -> None:
    root = copy_capture(RX7900XTX, tmp_path)
    device = root / "sys/class/drm/card1/device"
    (device / "drm/renderD128").mkdir(parents=True)
    for name, text in {"device": "0x744c", "revision": "0xc8", "vendor": "0x1002", "numa_node": "1",
                       "product_name": "Board FRU Name"}.items():
        (device / name).write_text(text + "\n")
    (root / "sys/module/amdgpu").mkdir(parents=True)
    (root / "sys/module/amdgpu/version").write_text("6.12.12\n")
    (root / "sys/module/amdgpu/srcversion").write_text("FD3182C7C6782667C6A4F68\n")
    part = root / "sys/module/amdgpu/drivers/pci:amdgpu/0000:86:00.0"
    part.mkdir(parents=True)
    (part / "current_compute_partition").write_text("SPX\n")
    (part / "current_memory_partition").write_text("NPS1\n")
    (part / "available_compute_partition").write_text("SPX, CPX\n")
    debugfs = root / "sys/kernel/debug/dri/1"
    debugfs.mkdir(parents=True)
    shutil.copy(FIRMWARE_INFO, debugfs / "amdgpu_firmware_info")
    inventory, _ = amd_probe_of(root, firmware=True)
    assert inventory is not None
    (gpu,) = inventory.gpus
    assert (inventory.driver_version, inventory.driver_src_version) == ("6.12.12", "FD3182C7C6782667C6A4F68")
    assert (gpu.revision, gpu.product_name, gpu.numa_node, gpu.nodes[0].card) == (0xC8, "Board FRU Name", 1, 1)
    assert (gpu.compute_partition, gpu.memory_partition) == ("spx", "nps1")
    assert (gpu.compute_partitioning_supported, gpu.memory_partitioning_supported) == (True, False)
    assert gpu.expected_partitions == 1
    assert ("MEC", 33, 0x160) in gpu.firmware and len(gpu.firmware) == 10


def test_empty_product_name_falls_back_to_amdgpu_ids(tmp_path: Path) -> None:
    root = copy_capture(RX7900XTX, tmp_path)
    device = root / "sys/class/drm/card0/device"
    (device / "drm/renderD128").mkdir(parents=True)
    (device / "revision").write_text("0xc8\n")
    (device / "product_name").write_text("\n")  # consumer cards have an empty FRU name
    inventory, _ = amd_probe_of(root)
    assert inventory is not None and inventory.gpus[0].product_name == "AMD Radeon RX 7900 XTX"


def test_host_amdgpu_ids_wins_over_the_shipped_copy(tmp_path: Path) -> None:
    root = copy_capture(MI210, tmp_path)
    ids = root / "usr/share/libdrm/amdgpu.ids"
    ids.parent.mkdir(parents=True)
    ids.write_text("1.0.0\n740F,\t00,\tHost Table MI210\n")  # amd_pci says revision 0
    inventory, _ = backend.probe(root, (amd_pci("0000:03:00.0", 0x740F),), enricher=no_enrichment)
    assert inventory is not None and inventory.gpus[0].product_name == "Host Table MI210"


@pytest.mark.parametrize(("gfx", "device_id", "family"), [
    (90010, 0x740F, "AI"), (90402, 0x74A1, "AI"), (90000, 0x6860, "AI"), (90500, 0x75A0, "AI"),
    (90002, 0x15DD, "RV"), (90012, 0x1638, "RV"), (100300, 0x73BF, "NV"), (100100, 0x731F, "NV"),
    (100303, 0x163F, "VGH"), (100305, 0x1681, "YC"), (100306, 0x164E, "GC_10_3_6"), (100307, 0x1506, "GC_10_3_7"),
    (110000, 0x744C, "GC_11_0_0"), (110002, 0x7480, "GC_11_0_0"), (110003, 0x15BF, "GC_11_0_1"),
    (110501, 0x150E, "GC_11_5_0"), (120001, 0x7550, "GC_12_0_0"), (80001, 0x9874, "CZ"), (80003, 0x67DF, "VI"),
    (70001, 0x67B0, "CI"), (70003, 0x9830, "KV"), (None, 0x6860, "AI"), (None, 0x1234, None), (130000, 0x1, None),
])
def test_family_from_gfx_target_version(gfx: int | None, device_id: int, family: str | None) -> None:
    assert ids.family_of(gfx, device_id) == family


def test_pci_address_from_location_id() -> None:
    assert facts.pci_address(0, 58630) == "0000:e5:00.6"
    assert facts.pci_address(0x12, 0x2708 | 3) == "0012:27:01.3"
    assert facts.physical_function("0000:e5:00.6") == "0000:e5:00.0"


def test_marketing_name_without_revision_needs_a_unique_name() -> None:
    assert ids.marketing_name(Path("/nonexistent"), 0x74A1, None) == "AMD Instinct MI300X"
    assert ids.marketing_name(Path("/nonexistent"), 0x744C, None) is None
    assert ids.marketing_name(Path("/nonexistent"), 0x744C, 0xCC) == "AMD Radeon RX 7900 XT"


def test_enrichment_fills_missing_name_and_vram() -> None:
    def enrich(host_root: Path) -> list[backend.EnrichedGpu]:
        return [backend.EnrichedGpu(128, None, "Enriched Name", 25 * 2**30),
                backend.EnrichedGpu(None, "0000:27:00.0", "By Slot", None)]

    inventory, report = backend.probe(RX7900XTX, (), enricher=enrich)
    assert inventory is not None and report.status == "ok"
    assert inventory.gpus[0].product_name == "Enriched Name"
    assert inventory.gpus[0].nodes[0].vram_bytes == 25 * 2**30


def test_enrichment_never_overrides_sysfs() -> None:
    inventory, _ = backend.probe(MI210, (), enricher=lambda root: [backend.EnrichedGpu(128, None, "Other", 1)])
    assert inventory is not None
    assert {g.product_name for g in inventory.gpus} == {"AMD Instinct MI210"}


@pytest.mark.parametrize("error", [OSError(13, "Permission denied"), RuntimeError("GPU id 0 not found"), KeyError("x")])
def test_failing_enrichment_keeps_the_sysfs_result(error: Exception) -> None:
    def enrich(host_root: Path) -> list[backend.EnrichedGpu]:
        raise error

    inventory, report = backend.probe(RX7900XTX, (), enricher=enrich)
    assert inventory is not None and len(inventory.gpus) == 1
    assert report.status == "ok" and report.problems == () and "enrichment skipped" in report.detail


def test_pyamdgpuinfo_enricher_skips_without_real_dri_devices(tmp_path: Path) -> None:
    assert backend.pyamdgpuinfo_enricher(tmp_path) == []  # no dev/dri
    (tmp_path / "dev/dri").mkdir(parents=True)
    (tmp_path / "dev/dri/renderD128").write_text("")  # a regular file would segfault pyamdgpuinfo
    assert backend.pyamdgpuinfo_enricher(tmp_path) == []


def test_probe_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise ValueError("bug")

    monkeypatch.setattr(backend, "_group_nodes", broken)
    inventory, report = backend.probe(MI210, (), enricher=no_enrichment)
    assert inventory is None and report.status == "error" and "ValueError: bug" in report.detail


def test_parse_firmware_info_keeps_amds_blocks() -> None:
    firmware = backend.parse_firmware_info(FIRMWARE_INFO.read_text())
    assert [block for block, _, _ in firmware] == list(backend.FIRMWARE_BLOCKS)
    assert ("SDMA0", 40, 0x197) in firmware


def test_the_smc_line_of_current_kernels_carries_a_program_number() -> None:
    text = "SMC feature version: 0, program: 0, firmware version: 0x001c2800 (28.40.0)\n"
    assert backend.parse_firmware_info(text) == (("SMC", 0, 0x001C2800),)


def test_a_gpu_newer_than_the_hosts_amdgpu_ids_is_named_from_the_shipped_copy(tmp_path: Path) -> None:
    root = copy_capture(MI210, tmp_path)
    ids = root / "usr/share/libdrm/amdgpu.ids"
    ids.parent.mkdir(parents=True)
    ids.write_text("1.0.0\n6860,\t00,\tAn Older GPU\n")  # an old libdrm without the MI210
    mi210 = replace(amd_pci("0000:03:00.0", 0x740F), revision=0x02)
    inventory, _ = backend.probe(root, (mi210,), enricher=no_enrichment)
    assert inventory is not None and inventory.gpus[0].product_name == "AMD Instinct MI210"


def test_pci_files_come_from_the_gpus_own_card_when_partition_0_is_missing(tmp_path: Path) -> None:
    profile = tmp_path / "cpx.yaml"
    profile.write_text(
        "amd:\n  driver_version: 6.8.5\n  gpus:\n"
        "    - {device_id: 0x74a1, product_name: AMD Instinct MI300X OAM, repeat: 2, compute_partition: cpx,\n"
        "       partitions: 8, memory_partition: nps1, simd_count: 1216, simd_per_cu: 4,\n"
        "       vram_bytes: 206141652992, gfx_target_version: 90402}\n")
    with simulated_node(str(profile)) as node:
        topology = node.host_root / TOPOLOGY
        second_gpu_partition_0 = sorted(
            (p for p in topology.iterdir() if "location_id" in (p / "properties").read_text()
             and int((p / "properties").read_text().split("location_id ")[1].split()[0]) & 0x7 == 0),
            key=lambda p: int(p.name))[1]
        shutil.rmtree(second_gpu_partition_0)  # the driver did not expose partition 0 of GPU 2
        found = amd_labels_of(node.host_root)
    assert found["amd.com/gpu.product-name"] == "AMD_Instinct_MI300X_OAM"
    assert found["beta.amd.com/gpu.device-id.74a1"] == "2"


# --- a probe that cannot be trusted changes nothing -------------------------------------------------

def set_property(properties: Path, key: str, value: int) -> None:
    lines = [line for line in properties.read_text().splitlines() if not line.startswith(f"{key} ")]
    properties.write_text("\n".join([*lines, f"{key} {value}"]) + "\n")


@pytest.mark.parametrize(("key", "value", "why"), [
    ("simd_count", -416, "simd_count -416 is outside 1..4096"),
    ("simd_count", 5000, "simd_count 5000 is outside 1..4096"),
    ("simd_per_cu", 0, "simd_per_cu 0 is outside 1..16"),
    ("simd_per_cu", 64, "simd_per_cu 64 is outside 1..16"),
    ("device_id", 0x1740F, "device_id 95247 is outside 1..65535"),
    ("device_id", -1, "device_id -1 is outside 1..65535"),
    ("gfx_target_version", -90010, "gfx_target_version -90010 is outside 0..999999"),
])
def test_values_beyond_any_real_gpu_make_that_gpu_a_problem_not_a_label(tmp_path: Path, key: str, value: int,
                                                                         why: str) -> None:
    root = copy_capture(MI210, tmp_path)
    set_property(root / TOPOLOGY / "2/properties", key, value)  # the GPU at 0000:63:00.0
    inventory, report = amd_probe_of(root)
    assert inventory is not None and len(inventory.gpus) == 7 and "0000:63:00.0" not in {g.bdf for g in inventory.gpus}
    assert report.problems == (f"KFD node 2 (0000:63:00.0): {why}, beyond any real GPU; GPU left out of the labels",)
    labels = amd_labels_of(root)
    assert labels["beta.amd.com/gpu.simd-count.416"] == "7" and labels["amd.com/gpu.simd-count"] == "416"
    for kind, kept in (("simd-count", "416"), ("cu-count", "104"), ("device-id", "740f")):  # the bad value nowhere
        assert [label for label in labels if label.startswith(f"beta.amd.com/gpu.{kind}.")] == [
            f"beta.amd.com/gpu.{kind}.{kept}"]


def test_a_cu_count_beyond_any_real_gpu_is_a_problem(tmp_path: Path) -> None:
    root = copy_capture(MI210, tmp_path)
    set_property(root / TOPOLOGY / "2/properties", "simd_count", 4096)
    set_property(root / TOPOLOGY / "2/properties", "simd_per_cu", 1)
    _, report = amd_probe_of(root)
    assert "CU count (simd_count / simd_per_cu) 4096 is outside 1..1024" in report.problems[0]


def test_vram_beyond_4_tib_is_a_problem(tmp_path: Path) -> None:
    profile = tmp_path / "two.yaml"
    profile.write_text("amd:\n  gpus:\n    - {device_id: 0x6860, gfx_target_version: 90000, simd_count: 256, "
                       "vram_bytes: 17163091968, repeat: 2}\n")
    with simulated_node(str(profile)) as node:
        set_property(node.host_root / TOPOLOGY / "1/mem_banks/0/properties", "size_in_bytes", 5 << 40)
        inventory, report = amd_probe_of(node.host_root)
        labels = amd_labels_of(node.host_root)
    assert inventory is not None and [g.bdf for g in inventory.gpus] == ["0000:25:00.0"]
    assert report.problems == ("KFD node 1 (0000:05:00.0): mem_banks/0 size_in_bytes 5497558138880 is outside "
                               "0..4398046511104, beyond any real GPU; GPU left out of the labels",)
    assert [key for key in labels if key.startswith("beta.amd.com/gpu.vram.")] == ["beta.amd.com/gpu.vram.16G"]


@pytest.mark.parametrize(("key", "value", "why"), [
    ("location_id", 0x10000, "location_id 65536 is outside 0..65535"),
    ("location_id", -256, "location_id -256 is outside 0..65535"),
    ("domain", -1, "domain -1 is outside 0..4294967295"),
])
def test_an_address_out_of_range_is_a_problem_for_a_node_we_cannot_place(tmp_path: Path, key: str, value: int,
                                                                         why: str) -> None:
    root = copy_capture(MI210, tmp_path)
    set_property(root / TOPOLOGY / "2/properties", key, value)
    inventory, report = backend.probe(root, (amd_pci("0000:63:00.0", 0x740F),), enricher=no_enrichment)
    assert inventory is not None and len(inventory.gpus) == 7
    assert report.problems == (f"KFD node 2: {why}",
                               "0000:63:00.0: AMD GPU on the PCI bus but not in the KFD topology")


def test_one_bad_partition_leaves_out_its_whole_gpu(tmp_path: Path) -> None:
    root = copy_capture(MI300X_CPX, tmp_path)
    set_property(root / TOPOLOGY / "3/properties", "simd_per_cu", 0)  # partition 1 of the GPU at 0000:05:00.0
    inventory, report = amd_probe_of(root)
    assert inventory is not None and "0000:05:00.0" not in {g.bdf for g in inventory.gpus}
    assert len(inventory.gpus) == 7 and report.problems[0].startswith("KFD node 3 (0000:05:00.0): simd_per_cu 0")
    labels = amd_labels_of(root)
    assert labels["beta.amd.com/gpu.device-id.74a1"] == "7" and labels["beta.amd.com/gpu.cu-count.38"] == "55"


def test_a_fifo_for_kfd_properties_is_reported_promptly(tmp_path: Path) -> None:
    root = copy_capture(MI210, tmp_path)
    properties = root / TOPOLOGY / "3/properties"
    properties.unlink()
    os.mkfifo(properties)
    inventory, report = promptly(lambda: amd_probe_of(root))
    assert inventory is not None and len(inventory.gpus) == 7
    assert report.problems == (f"KFD node 3: {properties}: a FIFO, not a regular file",)


def test_an_oversized_card_file_leaves_out_that_gpu(tmp_path: Path) -> None:
    profile = tmp_path / "two.yaml"
    profile.write_text("amd:\n  gpus:\n    - {device_id: 0x740f, revision: 2, gfx_target_version: 90010, "
                       "simd_count: 416, vram_bytes: 68702699520, repeat: 2}\n")
    with simulated_node(str(profile)) as node:
        product_name = node.host_root / "sys/class/drm/card0/device/product_name"
        product_name.write_text("MI210 " * 20000)
        inventory, report = promptly(lambda: amd_probe_of(node.host_root))
    assert inventory is not None and [g.bdf for g in inventory.gpus] == ["0000:25:00.0"]
    assert report.problems == (f"0000:05:00.0: {product_name}: larger than 65536 bytes, more than any real one; "
                               "GPU left out of the labels",)


def test_a_fifo_for_the_module_version_fails_the_backend_not_the_probe(tmp_path: Path) -> None:
    root = copy_capture(MI210, tmp_path)
    (root / "sys/module/amdgpu").mkdir(parents=True)
    os.mkfifo(root / "sys/module/amdgpu/version")
    inventory, report = promptly(lambda: amd_probe_of(root))
    assert inventory is None and report.status == "error"
    assert report.detail == f"AMD probe failed: {root / 'sys/module/amdgpu/version'}: a FIFO, not a regular file"


# --- family without gfx_target_version ------------------------------------------------------------

def amdgpu_ids_device_ids() -> list[int]:
    text = (Path(ids.__file__).parents[1] / "data/amdgpu.ids").read_text()
    return sorted({int(line.split(",")[0], 16) for line in text.splitlines() if re.match(r"[0-9A-F]{4},", line)})


def test_every_device_id_in_amds_table_has_a_family() -> None:
    device_ids = amdgpu_ids_device_ids()
    assert len(device_ids) > 200  # the whole table, not a stub
    assert [f"{device_id:04X}" for device_id in device_ids if ids.family_by_device_id(device_id) is None] == []


@pytest.mark.parametrize(("device_id", "family"), [
    (0x6798, "SI"), (0x684C, "SI"), (0x6640, "CI"), (0x67B0, "CI"), (0x1309, "KV"), (0x9830, "KV"), (0x9850, "KV"),
    (0x6939, "VI"), (0x7300, "VI"), (0x67DF, "VI"), (0x6FDF, "VI"), (0x694C, "VI"), (0x9874, "CZ"), (0x98E4, "CZ"),
    (0x687F, "AI"), (0x66AF, "AI"), (0x738C, "AI"), (0x740F, "AI"), (0x74A1, "AI"), (0x75A3, "AI"),
    (0x15DD, "RV"), (0x1636, "RV"), (0x731F, "NV"), (0x7362, "NV"), (0x73BF, "NV"), (0x73DF, "NV"), (0x73FF, "NV"),
    (0x743F, "NV"), (0x163F, "VGH"), (0x1681, "YC"), (0x164E, "GC_10_3_6"), (0x1506, "GC_10_3_7"),
    (0x744C, "GC_11_0_0"), (0x747E, "GC_11_0_0"), (0x7480, "GC_11_0_0"), (0x15BF, "GC_11_0_1"), (0x1900, "GC_11_0_1"),
    (0x150E, "GC_11_5_0"), (0x1586, "GC_11_5_0"), (0x7550, "GC_12_0_0"), (0x7590, "GC_12_0_0"),
    (0x6700, None), (0x0000, None),
])
def test_family_from_the_device_id(device_id: int, family: str | None) -> None:
    assert ids.family_of(None, device_id) == family


def test_an_old_kernel_navi21_gets_its_family_from_the_device_id(tmp_path: Path) -> None:
    root = copy_capture(RX7900XTX, tmp_path)
    properties = root / TOPOLOGY / "1/properties"
    properties.write_text("".join(line + "\n" for line in properties.read_text().splitlines()
                                  if not line.startswith("gfx_target_version")))
    set_property(properties, "device_id", 0x73BF)
    assert amd_labels_of(root)["amd.com/gpu.family"] == "NV"


# --- AMD GPUs without KFD -------------------------------------------------------------------------

def no_kfd_node(root: Path, version: str | None = "6.12.12") -> Path:
    """Two AMD GPUs bound to amdgpu (one with an XCP partition card), no KFD topology."""
    empty_node(root)
    module = root / "sys/module/amdgpu"
    (module / "drivers").mkdir(parents=True)
    if version:
        (module / "version").write_text(version + "\n")
    for card, (bdf, device, revision, name) in enumerate([("0000:03:00.0", 0x740F, 0x02, ""),
                                                          ("0000:83:00.0", 0x740F, 0x02, "AMD Instinct MI210")]):
        add_pci_device(root, bdf, 0x1002, device, 0x038000, revision=revision, driver="amdgpu")
        files = root / f"sys/class/drm/card{card}/device"
        (files / f"drm/renderD{128 + card}").mkdir(parents=True)
        for file, text in {"vendor": "0x1002", "device": f"0x{device:04x}", "revision": f"0x{revision:02x}",
                           "product_name": name, "uevent": f"DRIVER=amdgpu\nPCI_SLOT_NAME={bdf}"}.items():
            (files / file).write_text(text + "\n")
    (root / "sys/class/drm/card2/device/drm/renderD130").mkdir(parents=True)  # a partition card: no PCI files
    return root


def test_without_kfd_the_drm_cards_still_give_device_family_product_and_driver(tmp_path: Path) -> None:
    root = no_kfd_node(tmp_path)
    inventory, report = amd_probe_of(root)
    assert report.status == "unavailable" and "KFD topology is missing" in report.detail
    assert inventory is not None and [(g.bdf, g.family, g.nodes) for g in inventory.gpus] == [
        ("0000:03:00.0", "AI", ()), ("0000:83:00.0", "AI", ())]
    labels = label_set_of(discover_node(root), Config()).labels
    assert {k: v for k, v in labels.items() if k.startswith("amd.com/")} == {
        "amd.com/gpu.present": "true", "amd.com/gpu.device-id": "740f", "amd.com/gpu.family": "AI",
        "amd.com/gpu.product-name": "AMD_Instinct_MI210",  # FRU name of one, amdgpu.ids for the other
        "amd.com/gpu.driver-version": "6.12.12", "amd.com/gpu.driver-src-version": "",
        "amd.com/gpu.compute-partitioning-supported": "false", "amd.com/gpu.memory-partitioning-supported": "false",
    }
    assert labels["beta.amd.com/gpu.device-id.740f"] == "2" and labels["beta.amd.com/gpu.family.AI"] == "2"
    assert not any(kind in key for key in labels for kind in ("cu-count", "simd-count", "vram"))
    assert discover_node(root).partial  # KFD may still be initialising: nothing is removed


def test_cli_labels_a_node_without_kfd_from_its_drm_cards(tmp_path: Path) -> None:
    root = no_kfd_node(tmp_path)
    result = subprocess.run([sys.executable, "-m", "labeller.cli", "labels", "--host-root", str(root)],
                            capture_output=True, text=True, timeout=PATIENCE_S)
    assert result.returncode == 0, result.stderr
    lines = set(result.stdout.splitlines())
    assert {"amd.com/gpu.device-id=740f", "amd.com/gpu.family=AI", "amd.com/gpu.product-name=AMD_Instinct_MI210",
            "amd.com/gpu.driver-version=6.12.12", "beta.amd.com/gpu.family.AI=2"} <= lines
