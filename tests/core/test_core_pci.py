"""PCI presence scan over a sysfs tree."""

from pathlib import Path

from labeller.config import Config
from labeller.discovery import discover
from labeller.rules import node_labels
from tests.core.sysfs_tree import add_pci_device
from vendors.pci import normalise_bdf, scan


def test_finds_nvidia_and_amd_gpus_and_ignores_other_devices(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200, numa_node=0, driver="nvidia")
    add_pci_device(tmp_path, "0000:c1:00.0", 0x1002, 0x74A1, 0x038000, numa_node=1)
    add_pci_device(tmp_path, "0000:00:1f.3", 0x8086, 0x1234, 0x040300)  # Intel audio
    add_pci_device(tmp_path, "0000:3b:00.1", 0x10DE, 0x22A3, 0x040300)  # NVIDIA audio function
    add_pci_device(tmp_path, "0000:02:00.0", 0x1A03, 0x2000, 0x030000)  # ASPEED BMC VGA

    gpus, report = scan(tmp_path)

    assert [(g.bdf, g.vendor_id, g.numa_node, g.driver) for g in gpus] == [
        ("0000:18:00.0", 0x10DE, 0, "nvidia"),
        ("0000:c1:00.0", 0x1002, 1, None),
    ]
    assert report.status == "ok"


def test_amd_processing_accelerators_count_as_gpus(tmp_path: Path) -> None:
    # amdgpu binds Instinct MI300-class parts that report PCI class 0x1200, not a display class
    add_pci_device(tmp_path, "0000:0c:00.0", 0x1002, 0x74A1, 0x120000)
    add_pci_device(tmp_path, "0000:0d:00.0", 0x10DE, 0x1234, 0x120000)  # not an NVIDIA GPU class
    gpus, _ = scan(tmp_path)
    assert [(g.bdf, g.vendor_id) for g in gpus] == [("0000:0c:00.0", 0x1002)]
    assert node_labels(discover(tmp_path), Config()).labels["amd.com/gpu.present"] == "true"


def test_missing_bus_is_absent_not_an_error(tmp_path: Path) -> None:
    gpus, report = scan(tmp_path)
    assert gpus == () and report.status == "absent"


def test_garbage_files_skip_only_that_device(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200)
    broken = add_pci_device(tmp_path, "0000:19:00.0", 0x10DE, 0x2330, 0x030200)
    (broken / "class").write_text("not-a-number\n")
    gpus, _ = scan(tmp_path)
    assert [g.bdf for g in gpus] == ["0000:18:00.0"]


def test_presence_labels_come_from_pci_even_without_a_driver(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200)
    add_pci_device(tmp_path, "0000:c1:00.0", 0x1002, 0x74A1, 0x038000)
    labels = node_labels(discover(tmp_path), Config()).labels
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["amd.com/gpu.present"] == "true"


def test_bus_ids_from_nvml_and_sysfs_compare_equal() -> None:
    assert normalise_bdf("00000000:18:00.0") == "0000:18:00.0"
    assert normalise_bdf("00000001:AB:00.1") == "0001:ab:00.1"
    assert normalise_bdf("0000:18:00.0") == "0000:18:00.0"
