"""AMD profiles: generated and captured sysfs trees, read back by the real backend and CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labeller.model.config import Config
from tests.builders import MI210, PATIENCE_S, amd_labels_of, amd_probe_of, pci_scan, promptly
from tests.core.cli import in_process
from vendors.amd import simulate as amd_sim
from vendors.simulate import builtin_profiles, load_profile, resolve, simulated_node

MI300X = {
    "device_id": 0x74A1, "product_name": "AMD Instinct MI300X OAM", "gfx_target_version": 90402,
    "simd_count": 1216, "simd_per_cu": 4, "vram_bytes": 206141652992,
}


def build_inline(tmp_path: Path, *gpus: dict[str, Any], **section: Any) -> Path:
    root = tmp_path / "root"
    amd_sim.build({"gpus": list(gpus), **section}, root, tmp_path)
    return root


def test_inline_cpx_goes_through_the_backend(tmp_path: Path) -> None:
    root = build_inline(tmp_path, {**MI300X, "compute_partition": "cpx", "memory_partition": "nps1", "partitions": 8,
                                   "xgmi": True, "repeat": 2}, driver_version="6.16.13")
    inventory, report = amd_probe_of(root)
    assert inventory is not None and report.status == "ok" and report.problems == ()
    assert [len(g.nodes) for g in inventory.gpus] == [8, 8]
    first = inventory.gpus[0]
    assert (first.compute_partition, first.memory_partition, first.expected_partitions) == ("cpx", "nps1", 8)
    assert [n.card for n in first.nodes] == list(range(8)) and first.nodes[0].numa_node == 0
    assert (inventory.gpus[1].nodes[0].kfd_node, 11) in first.nodes[0].links
    labels = amd_labels_of(root)
    assert labels["amd.com/gpu.cu-count"] == "38" and labels["beta.amd.com/gpu.cu-count.38"] == "16"
    assert labels["amd.com/gpu.vram"] == "24G" and labels["beta.amd.com/gpu.device-id.74a1"] == "2"
    assert labels["amd.com/gpu.compute-memory-partition"] == "cpx_nps1"
    assert labels["amd.com/gpu.driver-version"] == "6.16.13"


def test_inline_writes_pci_devices_the_pci_scan_reads(tmp_path: Path) -> None:
    root = build_inline(tmp_path, {**MI300X, "numa_node": 1, "revision": "0x01"})
    gpus, _ = pci_scan(root)
    assert [(g.bdf, g.device_id, g.revision, g.numa_node) for g in gpus] == [("0000:05:00.0", 0x74A1, 1, 1)]


def test_inline_heterogeneous_node(tmp_path: Path) -> None:
    mi210 = {"device_id": 0x740F, "revision": 2, "gfx_target_version": 90010, "simd_count": 416,
             "vram_bytes": 68702699520, "repeat": 2}
    labels = amd_labels_of(build_inline(tmp_path, {**MI300X, "repeat": 2}, mi210))
    assert labels["amd.com/gpu.product-name.AMD_Instinct_MI300X_OAM"] == "2"
    assert labels["amd.com/gpu.product-name.AMD_Instinct_MI210"] == "2"  # from amdgpu.ids (empty FRU name)
    assert labels["amd.com/gpu.cu-count.104"] == "2" and "amd.com/gpu.cu-count" not in labels


def test_captured_tree_next_to_the_profile(tmp_path: Path) -> None:
    shutil.copytree(MI210, tmp_path / "my-capture")
    root = tmp_path / "root"
    amd_sim.build({"sysfs": "my-capture", "revision": 2}, root, tmp_path)
    assert amd_labels_of(root)["amd.com/gpu.product-name"] == "AMD_Instinct_MI210"
    gpus, report = pci_scan(root)
    assert len(gpus) == 8 and report.detail == "8 GPU(s) among 9 PCI device(s)"  # and the host bridge


@pytest.mark.parametrize(("section", "message"), [
    ([], "amd: must be a mapping"),
    ({"gpus": [MI300X], "sysfs": "x"}, "amd: give exactly one of sysfs"),
    ({}, "amd: give exactly one of sysfs"),
    ({"gpu": []}, "amd.gpu: unknown key"),
    ({"gpus": []}, "amd.gpus: must be a non-empty list"),
    ({"gpus": [{**MI300X, "simd_count": 0}]}, "amd.gpus[0].simd_count: must be a positive integer"),
    ({"gpus": [{**MI300X, "simd_count": "many"}]}, "amd.gpus[0].simd_count: must be an integer"),
    ({"gpus": [{k: v for k, v in MI300X.items() if k != "vram_bytes"}]}, "amd.gpus[0].vram_bytes: required integer"),
    ({"gpus": [MI300X, {**MI300X, "colour": 1}]}, "amd.gpus[1].colour: unknown key"),
    ({"gpus": [{**MI300X, "compute_partition": "xpx"}]}, "amd.gpus[0].compute_partition: must be one of"),
    ({"gpus": [{**MI300X, "compute_partition": "cpx"}]}, "amd.gpus[0].partitions: required when"),
    ({"gpus": [{**MI300X, "partitions": 3}]}, "amd.gpus[0].simd_count: 1216 does not divide"),
    ({"gpus": [{**MI300X, "partitions": 16}]}, "amd.gpus[0].partitions: at most 8"),
    ({"gpus": [{**MI300X, "xgmi": "yes"}]}, "amd.gpus[0].xgmi: must be true or false"),
    ({"gpus": [{**MI300X, "repeat": 65}]}, "amd.gpus: at most 64 GPUs"),
    ({"gpus": [MI300X], "revision": 1}, "amd.revision: only for sysfs trees"),
    ({"gpus": [MI300X], "driver_version": 6.8}, "amd.driver_version: must be a string"),
    ({"sysfs": "no-such-tree"}, "amd.sysfs: 'no-such-tree' is neither"),
])
def test_bad_sections_name_the_key(tmp_path: Path, section: Any, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("]", r"\]")) as info:
        amd_sim.build(section, tmp_path / "root", tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["mi300x-x8-spx", "mi210-x8", "mi300x-x8-cpx", "rx7900xtx", "mi25-firmware"])
def test_builtin_profiles_load_and_label(name: str) -> None:
    assert name in builtin_profiles()
    assert set(load_profile(resolve(name))) <= {"name", "description", "config", "machine", "amd"}
    with simulated_node(name) as sim:
        labels = amd_labels_of(sim.host_root, Config())
    assert labels["amd.com/gpu.present"] == "true" and "amd.com/gpu.device-id" in labels


def test_mi300x_spx_profile_gives_the_real_label_set() -> None:
    with simulated_node("mi300x-x8-spx") as sim:
        labels = amd_labels_of(sim.host_root)
        inventory, _ = amd_probe_of(sim.host_root)
    expected = {"cu-count": "304", "simd-count": "1216", "vram": "192G", "device-id": "74a1", "family": "AI",
                "product-name": "AMD_Instinct_MI300X_OAM", "driver-version": "6.8.5",
                "compute-memory-partition": "spx_nps1"}
    assert {k: labels[f"amd.com/gpu.{k}"] for k in expected} == expected
    assert inventory is not None and {g.numa_node for g in inventory.gpus} == {0, 1}
    assert all(len([t for _, t in g.nodes[0].links if t == 11]) == 7 for g in inventory.gpus)


def test_cli_labels_simulate_mi300x_cpx_end_to_end() -> None:
    result = subprocess.run([sys.executable, "-m", "labeller.cli", "labels", "--simulate", "mi300x-x8-cpx"],
                            capture_output=True, text=True, timeout=PATIENCE_S, check=True)
    lines = set(result.stdout.splitlines())
    assert {
        "amd.com/gpu.present=true", "amd.com/gpu.cu-count=38", "amd.com/gpu.simd-count=152",
        "amd.com/gpu.device-id=74a1", "amd.com/gpu.family=AI", "amd.com/gpu.product-name=AMD_Instinct_MI300X",
        "beta.amd.com/gpu.cu-count.38=63", "beta.amd.com/gpu.device-id.74a1=8",
    } <= lines
    assert not any(line.startswith("amd.com/gpu.vram") for line in lines)  # the capture has no mem_banks


# --- firmware labels ------------------------------------------------------------------------------

FIRMWARE_ON = "version: v1\nlabeller:\n  labels:\n    firmware: true\n"


def test_builtin_firmware_profile_replays_the_real_debugfs_capture() -> None:
    result = in_process("labels", "--simulate", "mi25-firmware")
    assert result.returncode == 0, result.stderr
    firmware = {line for line in result.stdout.splitlines() if ".firmware." in line}
    # The capture (tests/fixtures/amd/debugfs-firmware-info) in AMD's decimal form, e.g. MEC 0x160 -> 352.
    assert len(firmware) == 20 and {
        "beta.amd.com/gpu.firmware.MEC.feat.33=1", "beta.amd.com/gpu.firmware.MEC.fw.352=1",
        "beta.amd.com/gpu.firmware.SDMA0.fw.407=1", "beta.amd.com/gpu.firmware.VCE.fw.892142592=1",
        "beta.amd.com/gpu.firmware.SMC.fw.1845248=1",
    } <= firmware
    assert "amd.com/gpu.product-name=AMD_Radeon_Instinct_MI25" in result.stdout.splitlines()
    with simulated_node("mi25-firmware") as node:
        written = (node.host_root / "sys/kernel/debug/dri/0/amdgpu_firmware_info").read_text()
    assert written == (Path(__file__).parents[1] / "fixtures/amd/debugfs-firmware-info"
                       / "amdgpu_firmware_info").read_text()


def test_probe_says_why_there_is_no_firmware_data(tmp_path: Path) -> None:
    config = tmp_path / "firmware.yaml"
    config.write_text(FIRMWARE_ON)
    result = in_process("probe", "--simulate", "mi300x-x8-spx", "--config", str(config))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    (problem,) = next(r for r in document["reports"] if r["backend"] == "amd")["problems"]
    assert problem.startswith("firmware labels are on but /") and problem.endswith(
        "/sys/kernel/debug/dri does not exist: debugfs must be mounted there and read as uid 0 "
        "(the Helm chart does both when config.labeller.labels.firmware is true)")
    assert document["partial"] is True  # firmware labels written earlier are kept, not removed
    labels = in_process("labels", "--simulate", "mi300x-x8-spx", "--config", str(config)).stdout
    assert "amd.com/gpu.cu-count=304" in labels and ".firmware." not in labels


def test_unreadable_debugfs_and_firmware_files_are_named(tmp_path: Path) -> None:
    root = build_inline(tmp_path, {**MI300X, "firmware_info": "vega10", "repeat": 2})
    info = root / "sys/kernel/debug/dri/1/amdgpu_firmware_info"
    info.unlink()
    os.mkfifo(info)
    inventory, report = promptly(lambda: amd_probe_of(root, firmware=True))
    assert inventory is not None and [len(g.firmware) for g in inventory.gpus] == [10, 0]
    assert report.problems == (f"0000:25:00.0: no firmware versions: {info}: a FIFO, not a regular file",)
    assert promptly(lambda: amd_probe_of(root))[1].problems == ()  # firmware off: debugfs is never read
    shutil.rmtree(root / "sys/kernel/debug/dri")
    (root / "sys/kernel/debug/dri").symlink_to("dri")
    _, report = amd_probe_of(root, firmware=True)
    assert report.problems == (f"firmware labels are on but {root / 'sys/kernel/debug/dri'}: cannot list: "
                               "Too many levels of symbolic links: debugfs must be mounted there and read as uid 0 "
                               "(the Helm chart does both when config.labeller.labels.firmware is true)",)


def test_firmware_info_next_to_the_profile(tmp_path: Path) -> None:
    (tmp_path / "my-firmware").write_text("MEC feature version: 1, firmware version: 0x00000010\n")
    root = build_inline(tmp_path, {**MI300X, "firmware_info": "my-firmware"})
    inventory, _ = amd_probe_of(root, firmware=True)
    assert inventory is not None and inventory.gpus[0].firmware == (("MEC", 1, 16),)


@pytest.mark.parametrize(("name", "message"), [
    ("../vega10", "amd.gpus[0].firmware_info: a file name next to the profile, without '/', got '../vega10'"),
    ("nothing",
     "amd.gpus[0].firmware_info: 'nothing' is neither a file next to the profile nor a built-in capture (vega10)"),
])
def test_bad_firmware_info_names_the_key(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        build_inline(tmp_path, {**MI300X, "firmware_info": name})
    assert str(info.value) == message
