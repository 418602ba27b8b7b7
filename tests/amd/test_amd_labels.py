"""AMD labels: exactly AMD k8s-node-labeller's keys, values and counts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import Offer
from tests.builders import (MI210, MI300X_CPX, RX7900XTX, VEGA10, amd, amd_gpu, amd_labels_of, amd_node, groups,
                            label_set_of)
from vendors.amd import labels as amd_labels

MI300X_SPX_NEW = {
    "amd.com/gpu.cu-count": "304",
    "amd.com/gpu.simd-count": "1216",
    "amd.com/gpu.vram": "192G",
    "amd.com/gpu.device-id": "74a1",
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
    "amd.com/gpu.driver-version": "6.8.5",
}


def amd_only(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if "amd.com/" in k}


def test_mi300x_spx_matches_the_real_label_set() -> None:
    labels = label_set_of(amd(*(amd_gpu(i) for i in range(8))), Config()).labels
    assert MI300X_SPX_NEW.items() <= labels.items()
    assert labels["beta.amd.com/gpu.cu-count.304"] == "8"
    assert labels["beta.amd.com/gpu.vram.192G"] == "8"
    assert labels["beta.amd.com/gpu.product-name"] == "AMD_Instinct_MI300X_OAM"


@pytest.mark.parametrize(("capture", "count", "device_id", "simd", "cu", "vram"), [
    (VEGA10, 2, "6860", "256", "64", "16G"),
    (MI210, 8, "740f", "416", "104", None),
    (MI300X_CPX, 63, "74a1", "152", "38", None),
    (RX7900XTX, 1, "744c", "192", "96", None),
])
def test_captures_match_the_would_compute_table(capture: Path, count: int, device_id: str, simd: str, cu: str,
                                                 vram: str | None) -> None:
    labels = amd_labels_of(capture)
    assert labels["amd.com/gpu.device-id"] == device_id
    assert labels["amd.com/gpu.simd-count"] == simd and labels[f"beta.amd.com/gpu.simd-count.{simd}"] == str(count)
    assert labels["amd.com/gpu.cu-count"] == cu and labels[f"beta.amd.com/gpu.cu-count.{cu}"] == str(count)
    assert labels.get("amd.com/gpu.vram") == vram


def test_cpx_counts_partitions_for_cu_but_physical_gpus_for_device_id() -> None:
    labels = amd_labels_of(MI300X_CPX)
    assert labels["beta.amd.com/gpu.cu-count.38"] == "63"
    assert labels["beta.amd.com/gpu.device-id.74a1"] == "8"
    assert labels["beta.amd.com/gpu.family.AI"] == "8"
    assert labels["amd.com/gpu.product-name"] == "AMD_Instinct_MI300X"


@pytest.mark.parametrize(("size_bytes", "label"), [
    (8573157376, "8G"),  # 7.98 GiB RX Vega
    (17163091968, "16G"),  # MI25
    (206141652992, "192G"),
    (25767706624, "24G"),
    ((16 * 1024 + 512) * 2**20, "17G"),  # exactly .5: away from zero
    ((16 * 1024 + 512) * 2**20 - 1, "16G"),  # just below .5 once truncated to whole MiB
    ((2 * 1024 + 512) * 2**20, "3G"),  # banker's round() would say 2
    (512 * 2**20, "1G"),  # banker's round() would say 0
    (511 * 2**20 + 2**20 - 1, "0G"),
    (0, "0G"),
])
def test_vram_uses_go_rounding(size_bytes: int, label: str) -> None:
    assert amd_labels.vram_gib_label(size_bytes) == label


def test_heterogeneous_node_gets_counted_keys_and_no_plain_key() -> None:
    mi210 = amd_gpu(9, device_id=0x740F, name="AMD Instinct MI210", nodes=(amd_node(10, simd=416, vram=68702699520),))
    labels = amd_only(label_set_of(amd(amd_gpu(1), amd_gpu(2), mi210), Config()).labels)
    assert labels["amd.com/gpu.device-id.74a1"] == "2" and labels["amd.com/gpu.device-id.740f"] == "1"
    assert labels["amd.com/gpu.cu-count.304"] == "2" and labels["amd.com/gpu.cu-count.104"] == "1"
    assert labels["amd.com/gpu.vram.192G"] == "2" and labels["amd.com/gpu.vram.64G"] == "1"
    assert labels["amd.com/gpu.product-name.AMD_Instinct_MI210"] == "1"
    for kind in ("device-id", "cu-count", "simd-count", "vram", "product-name"):
        assert f"amd.com/gpu.{kind}" not in labels and f"beta.amd.com/gpu.{kind}" not in labels
    assert labels["amd.com/gpu.family"] == "AI" and labels["beta.amd.com/gpu.family"] == "AI"  # same family


def test_compute_memory_partition_only_when_homogeneous() -> None:
    spx: dict[str, Any] = {"compute_partition": "spx", "memory_partition": "nps1"}
    cpx: dict[str, Any] = {"compute_partition": "cpx", "memory_partition": "nps1"}
    same = label_set_of(amd(amd_gpu(1, **spx), amd_gpu(2, **spx), amd_gpu(3)), Config()).labels  # gpu 3 has no files
    assert same["amd.com/gpu.compute-memory-partition"] == "spx_nps1"
    mixed = label_set_of(amd(amd_gpu(1, **spx), amd_gpu(2, **cpx)), Config()).labels
    assert "amd.com/gpu.compute-memory-partition" not in mixed


def test_partitioning_supported_comes_from_the_first_gpu_by_address() -> None:
    gpus = (amd_gpu(2), amd_gpu(1, compute_partitioning_supported=True))
    labels = label_set_of(amd(*gpus), Config()).labels
    assert labels["amd.com/gpu.compute-partitioning-supported"] == "true"
    assert labels["amd.com/gpu.memory-partitioning-supported"] == "false"


@pytest.mark.parametrize(("name", "value"), [
    ("AMD Instinct MI300X OAM", "AMD_Instinct_MI300X_OAM"),
    ("AMD INSTINCT MI250X (MCM) OAM AC MBA MSFT", "AMD_INSTINCT_MI250X_MCM_OAM_AC_MBA_MSFT"),
    ("AMD Instinct MI250X / MI250", "AMD_Instinct_MI250X___MI250"),
    ("Radeon Pro W7900 + extra!", "Radeon_Pro_W7900_-_extra"),
    ("  (Engineering Sample)  ", "Engineering_Sample"),
    ("X" * 70, "X" * 63),
])
def test_product_name_values(name: str, value: str) -> None:
    labels = label_set_of(amd(amd_gpu(1, name=name)), Config())
    assert labels.labels["amd.com/gpu.product-name"] == value
    assert amd_labels.product_name_value(name) == value


def test_product_name_too_long_for_a_beta_key_drops_only_that_key() -> None:
    name = "AMD Instinct MI300X OAM With A Longer Board Name"  # fine as a value, too long in gpu.product-name.<v>
    result = label_set_of(amd(amd_gpu(1, name=name)), Config())
    assert result.labels["amd.com/gpu.product-name"] == name.replace(" ", "_")
    assert result.labels["beta.amd.com/gpu.product-name"] == name.replace(" ", "_")
    assert list(result.dropped) == [f"beta.amd.com/gpu.product-name.{name.replace(' ', '_')}"]
    assert result.labels["amd.com/gpu.cu-count"] == "304"


def test_unnamed_gpus_get_no_product_name() -> None:
    labels = label_set_of(amd(amd_gpu(1, name=None), amd_gpu(2, name="()")), Config()).labels
    assert not any("product-name" in key for key in labels)


def test_unknown_family_is_skipped_alone() -> None:
    labels = label_set_of(amd(amd_gpu(1, family=None), amd_gpu(2)), Config()).labels
    assert labels["beta.amd.com/gpu.family.AI"] == "1" and labels["amd.com/gpu.family"] == "AI"


def test_driver_versions_are_amd_com_only_and_empty_when_absent() -> None:
    labels = label_set_of(amd(amd_gpu(1), driver="", src=""), Config()).labels
    assert labels["amd.com/gpu.driver-version"] == "" and labels["amd.com/gpu.driver-src-version"] == ""
    assert not any(k.startswith("beta.amd.com/gpu.driver") for k in labels)


def test_groups_off() -> None:
    inv = amd(amd_gpu(1, compute_partition="spx", memory_partition="nps1"))
    beta_only = label_set_of(inv, groups(amd=False)).labels
    beta_only.pop("amd.com/gpu.present")  # rules.py's own presence label, on while either group is
    assert beta_only and all(k.startswith("beta.amd.com/") for k in beta_only)
    new_only = amd_only(label_set_of(inv, groups(amdBeta=False)).labels)
    assert new_only and all(k.startswith("amd.com/") for k in new_only)
    assert label_set_of(inv, groups(amd=False, amdBeta=False)).labels == {}


def test_firmware_labels_are_opt_in_and_beta_only() -> None:
    firmware = (("MEC", 33, 0x160), ("SDMA0", 40, 0x197))
    inv = amd(amd_gpu(1, firmware=firmware), amd_gpu(2, firmware=firmware))
    assert not any("firmware" in k for k in label_set_of(inv, Config()).labels)
    labels = label_set_of(inv, groups(firmware=True)).labels
    fw = {k: v for k, v in labels.items() if "firmware" in k}
    assert fw == {
        "beta.amd.com/gpu.firmware.MEC.feat.33": "2", "beta.amd.com/gpu.firmware.MEC.fw.352": "2",
        "beta.amd.com/gpu.firmware.SDMA0.feat.40": "2", "beta.amd.com/gpu.firmware.SDMA0.fw.407": "2",
    }


def test_no_amd_inventory_gives_no_amd_labels() -> None:
    assert amd_only(label_set_of(Inventory(), Config()).labels) == {}
    assert all(labeler(Inventory(), Config(), Offer()) == {} for labeler in amd_labels.LABELERS)


def test_cu_count_skips_nodes_without_simd_per_cu() -> None:
    labels = label_set_of(amd(amd_gpu(1, nodes=(replace(amd_node(2), simd_per_cu=0),))), Config()).labels
    assert "amd.com/gpu.cu-count" not in labels and labels["amd.com/gpu.simd-count"] == "1216"
