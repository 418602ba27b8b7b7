"""AMD profiles: generated and captured sysfs trees, read back by the real backend and CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labeller.config import Config
from tests.amd.amd_tree import MI210, labels_for, probe
from vendors import amd_sim
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
    inventory, report = probe(root)
    assert inventory is not None and report.status == "ok" and report.problems == ()
    assert [len(g.nodes) for g in inventory.gpus] == [8, 8]
    first = inventory.gpus[0]
    assert (first.compute_partition, first.memory_partition, first.expected_partitions) == ("cpx", "nps1", 8)
    assert [n.card for n in first.nodes] == list(range(8)) and first.nodes[0].numa_node == 0
    assert (inventory.gpus[1].nodes[0].kfd_node, 11) in first.nodes[0].links
    labels = labels_for(root)
    assert labels["amd.com/gpu.cu-count"] == "38" and labels["beta.amd.com/gpu.cu-count.38"] == "16"
    assert labels["amd.com/gpu.vram"] == "24G" and labels["beta.amd.com/gpu.device-id.74a1"] == "2"
    assert labels["amd.com/gpu.compute-memory-partition"] == "cpx_nps1"
    assert labels["amd.com/gpu.driver-version"] == "6.16.13"


def test_inline_writes_pci_devices_the_pci_scan_reads(tmp_path: Path) -> None:
    from vendors import pci

    root = build_inline(tmp_path, {**MI300X, "numa_node": 1, "revision": "0x01"})
    gpus, _ = pci.scan(root)
    assert [(g.bdf, g.device_id, g.revision, g.numa_node) for g in gpus] == [("0000:05:00.0", 0x74A1, 1, 1)]


def test_inline_heterogeneous_node(tmp_path: Path) -> None:
    mi210 = {"device_id": 0x740F, "revision": 2, "gfx_target_version": 90010, "simd_count": 416,
             "vram_bytes": 68702699520, "repeat": 2}
    labels = labels_for(build_inline(tmp_path, {**MI300X, "repeat": 2}, mi210))
    assert labels["amd.com/gpu.product-name.AMD_Instinct_MI300X_OAM"] == "2"
    assert labels["amd.com/gpu.product-name.AMD_Instinct_MI210"] == "2"  # from amdgpu.ids (empty FRU name)
    assert labels["amd.com/gpu.cu-count.104"] == "2" and "amd.com/gpu.cu-count" not in labels


def test_captured_tree_next_to_the_profile(tmp_path: Path) -> None:
    shutil.copytree(MI210, tmp_path / "my-capture")
    root = tmp_path / "root"
    amd_sim.build({"sysfs": "my-capture", "revision": 2}, root, tmp_path)
    assert labels_for(root)["amd.com/gpu.product-name"] == "AMD_Instinct_MI210"
    assert len(list((root / "sys/bus/pci/devices").iterdir())) == 8


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


@pytest.mark.parametrize("name", ["mi300x-x8-spx", "mi210-x8", "mi300x-x8-cpx", "rx7900xtx"])
def test_builtin_profiles_load_and_label(name: str) -> None:
    assert name in builtin_profiles()
    assert set(load_profile(resolve(name))) <= {"name", "description", "config", "machine", "amd"}
    with simulated_node(name) as sim:
        labels = labels_for(sim.host_root, Config())
    assert labels["amd.com/gpu.present"] == "true" and "amd.com/gpu.device-id" in labels


def test_mi300x_spx_profile_gives_the_real_label_set() -> None:
    with simulated_node("mi300x-x8-spx") as sim:
        labels = labels_for(sim.host_root)
        inventory, _ = probe(sim.host_root)
    expected = {"cu-count": "304", "simd-count": "1216", "vram": "192G", "device-id": "74a1", "family": "AI",
                "product-name": "AMD_Instinct_MI300X_OAM", "driver-version": "6.8.5",
                "compute-memory-partition": "spx_nps1"}
    assert {k: labels[f"amd.com/gpu.{k}"] for k in expected} == expected
    assert inventory is not None and {g.numa_node for g in inventory.gpus} == {0, 1}
    assert all(len([t for _, t in g.nodes[0].links if t == 11]) == 7 for g in inventory.gpus)


def test_cli_labels_simulate_mi300x_cpx_end_to_end() -> None:
    result = subprocess.run([sys.executable, "-m", "labeller.cli", "labels", "--simulate", "mi300x-x8-cpx"],
                            capture_output=True, text=True, timeout=60, check=True)
    lines = set(result.stdout.splitlines())
    assert {
        "amd.com/gpu.present=true", "amd.com/gpu.cu-count=38", "amd.com/gpu.simd-count=152",
        "amd.com/gpu.device-id=74a1", "amd.com/gpu.family=AI", "amd.com/gpu.product-name=AMD_Instinct_MI300X",
        "beta.amd.com/gpu.cu-count.38=63", "beta.amd.com/gpu.device-id.74a1=8",
    } <= lines
    assert not any(line.startswith("amd.com/gpu.vram") for line in lines)  # the capture has no mem_banks
