"""PCI presence scan over a sysfs tree, and the bounded readers every probe goes through."""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from labeller.model.config import Config
from labeller.model.inventory import ProbeError
from tests.builders import add_pci_device, discover_node, empty_node, label_set_of, pci_scan, promptly
from tests.core.cli import gpu_labeller, in_process
from vendors import sysfs
from vendors.pci import normalise_bdf

DEVICES = "sys/bus/pci/devices"
HINT = "is the host's /sys mounted at --host-root (HOST_ROOT)?"


def test_finds_nvidia_and_amd_gpus_and_ignores_other_devices(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200, numa_node=0, driver="nvidia")
    add_pci_device(tmp_path, "0000:c1:00.0", 0x1002, 0x74A1, 0x038000, numa_node=1)
    add_pci_device(tmp_path, "0000:00:1f.3", 0x8086, 0x1234, 0x040300)  # Intel audio
    add_pci_device(tmp_path, "0000:3b:00.1", 0x10DE, 0x22A3, 0x040300)  # NVIDIA audio function
    add_pci_device(tmp_path, "0000:02:00.0", 0x1A03, 0x2000, 0x030000)  # ASPEED BMC VGA

    gpus, report = pci_scan(tmp_path)

    assert [(g.bdf, g.vendor_id, g.numa_node, g.driver) for g in gpus] == [
        ("0000:18:00.0", 0x10DE, 0, "nvidia"),
        ("0000:c1:00.0", 0x1002, 1, None),
    ]
    assert report.status == "ok" and report.problems == ()


def test_amd_processing_accelerators_count_as_gpus(tmp_path: Path) -> None:
    # amdgpu binds Instinct MI300-class parts that report PCI class 0x1200, not a display class
    add_pci_device(tmp_path, "0000:0c:00.0", 0x1002, 0x74A1, 0x120000)
    add_pci_device(tmp_path, "0000:0d:00.0", 0x10DE, 0x1234, 0x120000)  # not an NVIDIA GPU class
    gpus, _ = pci_scan(tmp_path)
    assert [(g.bdf, g.vendor_id) for g in gpus] == [("0000:0c:00.0", 0x1002)]
    assert label_set_of(discover_node(tmp_path), Config()).labels["amd.com/gpu.present"] == "true"


def test_a_readable_bus_without_gpus_is_a_genuine_empty_node(tmp_path: Path) -> None:
    gpus, report = pci_scan(empty_node(tmp_path))
    assert gpus == () and (report.status, report.problems) == ("absent", ())
    inventory = discover_node(tmp_path)
    assert not inventory.partial and label_set_of(inventory, Config()).labels == {}


def _missing(root: Path) -> None:
    pass


def _a_file(root: Path) -> None:
    (root / "sys/bus/pci").mkdir(parents=True)
    (root / DEVICES).write_text("")


def _empty(root: Path) -> None:  # what a DirectoryOrCreate hostPath gives
    (root / DEVICES).mkdir(parents=True)


def _loop(root: Path) -> None:
    (root / "sys/bus/pci").mkdir(parents=True)
    (root / DEVICES).symlink_to("devices")


def _only_junk(root: Path) -> None:
    (root / DEVICES / "not-a-pci-address").mkdir(parents=True)


@pytest.mark.parametrize(("make", "why"), [
    (_missing, "does not exist"), (_a_file, "not a directory"), (_empty, "lists no PCI device"),
    (_loop, "cannot list: Too many levels of symbolic links"), (_only_junk, "lists no PCI device"),
])
def test_a_host_root_without_a_pci_device_list_is_a_failed_probe(tmp_path: Path, make: Callable[[Path], None],
                                                                 why: str) -> None:
    make(tmp_path)
    with pytest.raises(ProbeError) as info:
        discover_node(tmp_path)
    message = str(info.value)
    assert message.startswith(str(tmp_path / DEVICES)) and why in message and message.endswith(HINT)
    assert "\n" not in message


@pytest.mark.parametrize("command", ["labels", "probe"])
def test_cli_on_a_wrong_host_root_exits_2_with_one_line(tmp_path: Path, command: str) -> None:
    result = in_process(command, "--host-root", str(tmp_path / "nonexistent"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"Error: {tmp_path / 'nonexistent' / DEVICES} does not exist: {HINT}\n"


def test_cli_reads_the_host_root_from_host_root_env(tmp_path: Path) -> None:
    (tmp_path / DEVICES).mkdir(parents=True)  # an empty hostPath mount, as DirectoryOrCreate leaves it
    result = in_process("labels", env={**os.environ, "HOST_ROOT": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert f"{tmp_path / DEVICES} lists no PCI device" in result.stderr


def test_garbage_files_skip_only_that_device_and_are_a_problem(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200)
    broken = add_pci_device(tmp_path, "0000:19:00.0", 0x10DE, 0x2330, 0x030200)
    (broken / "class").write_text("not-a-number\n")
    gpus, report = pci_scan(tmp_path)
    assert [g.bdf for g in gpus] == ["0000:18:00.0"]
    assert report.problems == (f"0000:19:00.0: {broken / 'class'}: no PCI class code in it; "
                               "cannot tell whether it is a GPU",)


def test_ids_wider_than_pci_allows_are_a_problem(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x12330, 0x030200)
    gpus, report = pci_scan(tmp_path)
    assert gpus == () and "device id 0x12330" in report.problems[0]
    assert discover_node(tmp_path).partial  # so nothing is removed on its account


def test_a_fifo_where_the_scan_reads_is_reported_not_read(tmp_path: Path) -> None:
    device = add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200)
    add_pci_device(tmp_path, "0000:19:00.0", 0x10DE, 0x2330, 0x030200)
    (device / "class").unlink()
    os.mkfifo(device / "class")  # opening it for reading would block until a writer comes
    gpus, report = promptly(lambda: pci_scan(tmp_path))
    assert [g.bdf for g in gpus] == ["0000:19:00.0"]
    assert report.problems == (f"0000:18:00.0: {device / 'class'}: a FIFO, not a regular file; "
                               "cannot tell whether it is a GPU",)


def test_an_oversized_file_where_the_scan_reads_is_reported(tmp_path: Path) -> None:
    device = add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200)
    (device / "vendor").write_text("0x10de\n" + " " * sysfs.ATTRIBUTE_LIMIT)
    gpus, report = promptly(lambda: pci_scan(tmp_path))
    assert gpus == () and report.problems == (
        f"0000:18:00.0: {device / 'vendor'}: larger than 65536 bytes, more than any real one; "
        "cannot tell whether it is a GPU",)


def test_cli_probe_with_a_fifo_in_sysfs_answers_promptly_and_reports_it(tmp_path: Path) -> None:
    device = add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200)
    (device / "vendor").unlink()
    os.mkfifo(device / "vendor")
    started = time.monotonic()
    result = gpu_labeller("probe", "--host-root", str(tmp_path))  # the 60 s subprocess timeout is the guard
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    document = json.loads(result.stdout)
    pci = next(r for r in document["reports"] if r["backend"] == "pci")
    assert "a FIFO, not a regular file" in pci["problems"][0] and document["partial"] is True


def test_readers_refuse_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "device").symlink_to("/dev/null")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dir").mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "socket"))
        for name, kind in (("fifo", "a FIFO"), ("device", "a character device"), ("socket", "a socket"),
                           ("dir", "a directory")):
            with pytest.raises(sysfs.Untrusted, match=f"{kind}, not a regular file"):
                promptly(functools.partial(sysfs.read_text, tmp_path / name))
    with pytest.raises(sysfs.Untrusted, match="Too many levels of symbolic links"):
        sysfs.read_text(tmp_path / "loop")
    assert sysfs.read_text(tmp_path / "missing") is None
    assert sysfs.read_text(tmp_path / "fifo" / "below") is None  # a path through a non-directory is missing


def test_reads_and_listings_are_bounded(tmp_path: Path) -> None:
    (tmp_path / "exact").write_bytes(b"x" * 4096)
    (tmp_path / "over").write_bytes(b"x" * 4097)
    assert sysfs.read_bytes(tmp_path / "exact", sysfs.CONFIG_SPACE_LIMIT) == b"x" * 4096
    with pytest.raises(sysfs.Untrusted, match="larger than 4096 bytes"):
        sysfs.read_bytes(tmp_path / "over", sysfs.CONFIG_SPACE_LIMIT)
    assert sysfs.list_dir(tmp_path, limit=2) == ["exact", "over"]
    (tmp_path / "third").write_text("")
    with pytest.raises(sysfs.Untrusted, match="more than 2 entries"):
        sysfs.list_dir(tmp_path, limit=2)


def test_presence_labels_come_from_pci_even_without_a_driver(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200)
    add_pci_device(tmp_path, "0000:c1:00.0", 0x1002, 0x74A1, 0x038000)
    labels = label_set_of(discover_node(tmp_path), Config()).labels
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["amd.com/gpu.present"] == "true"


def test_bus_ids_from_nvml_and_sysfs_compare_equal() -> None:
    assert normalise_bdf("00000000:18:00.0") == "0000:18:00.0"
    assert normalise_bdf("00000001:AB:00.1") == "0001:ab:00.1"
    assert normalise_bdf("0000:18:00.0") == "0000:18:00.0"


def kernel_device(root: Path, hardware_path: str, vendor: int = 0x10DE) -> str:
    """A GPU as the kernel lays it out: its files at ``sys/<hardware_path>``, and
    ``sys/bus/pci/devices/<bdf>`` a relative link to them."""
    directory = root / "sys" / hardware_path
    directory.mkdir(parents=True)
    for name, text in (("vendor", f"0x{vendor:04x}"), ("device", "0x2330"), ("class", "0x030200")):
        (directory / name).write_text(text + "\n")
    bdf = directory.name
    link = root / DEVICES / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(directory, link.parent), link)
    return bdf


def test_the_pcie_root_is_the_root_complex_the_kernels_link_leads_into(tmp_path: Path) -> None:
    """As Kubernetes' deviceattribute reads resource.kubernetes.io/pcieRoot: the first directory of
    the device's path under /sys/devices, whatever switches lie between."""
    behind_switch = kernel_device(tmp_path, "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0")
    on_root_port = kernel_device(tmp_path, "devices/pci0000:40/0000:40:01.1/0000:47:00.0")
    behind_vmd = kernel_device(tmp_path, "devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e1:00.0")
    hyper_v = kernel_device(tmp_path, "devices/LNXSYSTM:00/LNXSYBUS:00/VMBUS:00/7870a1b2/pci7870:00/7870:00:00.0")
    gpus, _ = pci_scan(tmp_path)
    assert {g.bdf: g.pcie_root for g in gpus} == {behind_switch: "pci0000:15", on_root_port: "pci0000:40",
                                                  behind_vmd: "pci0000:00", hyper_v: None}


def test_no_pcie_root_where_the_entry_is_not_the_kernels_link(tmp_path: Path) -> None:
    plain = tmp_path / DEVICES / "0000:18:00.0"  # a hand-made tree, a capture without links
    plain.mkdir(parents=True)
    for name, text in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200")):
        (plain / name).write_text(text)
    absolute = kernel_device(tmp_path, "devices/pci0000:20/0000:20:01.1/0000:21:00.0")
    (tmp_path / DEVICES / absolute).unlink()
    os.symlink(tmp_path / "sys/devices/pci0000:20/0000:20:01.1/0000:21:00.0", tmp_path / DEVICES / absolute)
    elsewhere = kernel_device(tmp_path, "devices/pci0000:40/0000:40:01.1/0000:41:00.0")
    (tmp_path / DEVICES / elsewhere).unlink()  # a link to another device's directory
    os.symlink("../../../devices/pci0000:20/0000:20:01.1/0000:21:00.0", tmp_path / DEVICES / elsewhere)
    gpus, report = pci_scan(tmp_path)
    assert [(g.bdf, g.pcie_root) for g in gpus] == [("0000:18:00.0", None), (absolute, None), (elsewhere, None)]
    assert report.problems == ()


def test_a_simulated_gpu_hangs_off_one_of_eight_root_complexes_per_domain(tmp_path: Path) -> None:
    for bdf in ("0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:e5:00.0", "0001:20:00.0"):
        add_pci_device(tmp_path, bdf, 0x10DE, 0x2330, 0x030200)
    gpus, _ = pci_scan(tmp_path)
    assert [(g.bdf, g.pcie_root) for g in gpus] == [
        ("0000:07:00.0", "pci0000:00"), ("0000:0f:00.0", "pci0000:00"), ("0000:47:00.0", "pci0000:40"),
        ("0000:e5:00.0", "pci0000:e0"), ("0001:20:00.0", "pci0001:20")]
    assert os.readlink(tmp_path / DEVICES / "0000:47:00.0") == "../../../devices/pci0000:40/0000:40:01.1/0000:47:00.0"


def test_a_fifo_for_the_dmi_product_name_is_reported_not_read(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x2330, 0x030200)
    product_name = tmp_path / "sys/class/dmi/id/product_name"
    product_name.parent.mkdir(parents=True)
    os.mkfifo(product_name)
    inventory = promptly(lambda: discover_node(tmp_path))
    assert inventory.machine is None and inventory.partial  # the machine label is kept, not rewritten
    dmi = next(r for r in inventory.reports if r.backend == "dmi")
    assert (dmi.status, dmi.detail) == ("error", f"machine name unreadable: {product_name}: a FIFO, not a regular file")


def test_a_simulated_node_without_gpus_is_a_genuine_empty_node(tmp_path: Path) -> None:
    profile = tmp_path / "no-gpu.yaml"
    profile.write_text("name: no-gpu\nmachine: PowerEdge R650\n")
    result = in_process("probe", "--simulate", str(profile))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    pci = next(r for r in document["reports"] if r["backend"] == "pci")
    assert (pci["status"], pci["detail"]) == ("absent", "0 GPU(s) among 1 PCI device(s)") and not document["partial"]
    labels = in_process("labels", "--simulate", str(profile), "--format", "json")
    assert labels.returncode == 0 and json.loads(labels.stdout) == {}
