"""MIG on every MIG-capable GPU: a profile with MIG devices on each model loads, and the probe, the
labels and the resources say what the real GPU says (profile ids, placements, memory, SMs, engines,
as `nvidia-smi mig -lgip` / `-lgipp` print them; sources in vendors/nvidia/migtable.py). A model
the MIG table does not know still loads, laid out in order, with one warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest
from structlog.testing import capture_logs

from tests.builders import build, inventory_of, label_set_of, nvidia_part, offer_of, section
from vendors.nvidia.migtable import MIG_MODELS

MIB = 1 << 20
MIXED = {"flags": {"migStrategy": "mixed"}}


def gpu(name: str, pci_device_id: int, memory_mib: int, cc: tuple[int, int], *migs: dict[str, Any],
        **extra: Any) -> dict[str, Any]:
    return {"name": name, "uuid": "GPU-0b0b0b0b-0000-4000-8000-0000000000{i:02d}", "pci_bus_id": "0000:{i:02x}:00.0",
            "pci_device_id": pci_device_id, "memory_bytes": memory_mib * MIB, "compute_capability": list(cc),
            "mig_mode": "enabled", "mig_devices": list(migs)} | extra


def mig(profile: str, repeat: int = 1, **extra: Any) -> dict[str, Any]:
    uuid = "MIG-0c0c0c0c-0000-4000-8000-00000000{gpu:02d}{i:02d}"
    return {"profile": profile, "repeat": repeat, "uuid": uuid} | extra


def placements(tmp_path: Path, nvidia: dict[str, Any]) -> list[tuple[str, int | None, int | None, int | None]]:
    (found,) = nvidia_part(inventory_of(tmp_path, nvidia)).gpus
    return [(m.profile, m.gpu_instance_profile_id, m.placement_start, m.placement_size) for m in found.mig_devices]


# (GPU, its MIG devices as a profile gives them, what the probe finds: profile, profile id, start,
# size; labels under migStrategy mixed), one layout per model, each as the sources show it.
CASES = {
    # -cgi 14, 14, 5 on an A30: 1g.6gb at 0:1 and 1:1, 2g.12gb at 2:2; 5952 and 11968 MiB, 14 and 28 SMs.
    "A30": (gpu("NVIDIA A30", 0x20B7, 24576, (8, 0), mig("1g.6gb", 2), mig("2g.12gb")),
            [("1g.6gb", 14, 0, 1), ("1g.6gb", 14, 1, 1), ("2g.12gb", 5, 2, 2)],
            {"nvidia.com/mig-1g.6gb.count": "2", "nvidia.com/mig-1g.6gb.memory": "5952",
             "nvidia.com/mig-1g.6gb.multiprocessors": "14", "nvidia.com/mig-1g.6gb.engines.decoder": "1",
             "nvidia.com/mig-2g.12gb.memory": "11968", "nvidia.com/mig-2g.12gb.engines.copy": "2",
             "nvidia.com/gpu.family": "ampere"}),
    # 1g.10gb (R525) takes two memory slices on an A100 40GB: profile id 15, placements {0,2,4,6}:2.
    "A100 40GB": (gpu("NVIDIA A100-PCIE-40GB", 0x20F1, 40960, (8, 0), mig("1g.10gb", 4)),
                  [("1g.10gb", 15, 0, 2), ("1g.10gb", 15, 2, 2), ("1g.10gb", 15, 4, 2), ("1g.10gb", 15, 6, 2)],
                  {"nvidia.com/mig-1g.10gb.count": "4", "nvidia.com/mig-1g.10gb.memory": "9856",
                   "nvidia.com/mig-1g.10gb.slices.gi": "1"}),
    # 3g.40gb only fits at 4:4 next to two 2g.20gb (placements {0,2,4}:2).
    "A100 80GB": (gpu("NVIDIA A100-SXM4-80GB", 0x20B2, 81920, (8, 0), mig("3g.40gb"), mig("2g.20gb", 2)),
                  [("3g.40gb", 9, 4, 4), ("2g.20gb", 14, 0, 2), ("2g.20gb", 14, 2, 2)],
                  {"nvidia.com/mig-3g.40gb.memory": "40192", "nvidia.com/mig-3g.40gb.multiprocessors": "42",
                   "nvidia.com/mig-2g.20gb.count": "2", "nvidia.com/mig-2g.20gb.memory": "19968"}),
    "H100 SXM5": (gpu("NVIDIA H100 80GB HBM3", 0x2330, 81559, (9, 0), mig("1g.10gb", 7)),
                  [("1g.10gb", 19, n, 1) for n in range(7)],
                  {"nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/mig-1g.10gb.memory": "9984",
                   "nvidia.com/mig-1g.10gb.multiprocessors": "16", "nvidia.com/mig-1g.10gb.engines.jpeg": "1",
                   "nvidia.com/mig-1g.10gb.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"}),
    "H100 PCIe": (gpu("NVIDIA H100 PCIe", 0x2331, 81559, (9, 0), mig("3g.40gb", 2)),
                  [("3g.40gb", 9, 0, 4), ("3g.40gb", 9, 4, 4)],
                  {"nvidia.com/mig-3g.40gb.memory": "40448", "nvidia.com/mig-3g.40gb.multiprocessors": "46"}),
    # -cgi 9,15,19 on an H100 NVL: 47488, 22144 and 11008 MiB; 60, 26 and 16 SMs.
    "H100 NVL": (gpu("NVIDIA H100 NVL", 0x2321, 95830, (9, 0), mig("3g.47gb"), mig("1g.24gb"), mig("1g.12gb")),
                 [("3g.47gb", 9, 0, 4), ("1g.24gb", 15, 4, 2), ("1g.12gb", 19, 6, 1)],
                 {"nvidia.com/mig-3g.47gb.memory": "47488", "nvidia.com/mig-1g.24gb.memory": "22144",
                  "nvidia.com/mig-1g.24gb.multiprocessors": "26", "nvidia.com/mig-1g.12gb.memory": "11008"}),
    "H800": (gpu("NVIDIA H800", 0x2324, 81559, (9, 0), mig("4g.40gb"), mig("3g.40gb")),
             [("4g.40gb", 5, 0, 4), ("3g.40gb", 9, 4, 4)],
             {"nvidia.com/mig-4g.40gb.multiprocessors": "64", "nvidia.com/mig-3g.40gb.engines.decoder": "3"}),
    # -cgi 15,15,15 on a GH200 480GB: 23.00 GiB, 26 SMs each.
    "GH200": (gpu("NVIDIA GH200 480GB", 0x2342, 97871, (9, 0), mig("1g.24gb", 3)),
              [("1g.24gb", 15, 0, 2), ("1g.24gb", 15, 2, 2), ("1g.24gb", 15, 4, 2)],
              {"nvidia.com/mig-1g.24gb.count": "3", "nvidia.com/mig-1g.24gb.memory": "23552"}),
    "H20": (gpu("NVIDIA H20", 0x2329, 97871, (9, 0), mig("7g.96gb")),
            [("7g.96gb", 0, 0, 8)],
            {"nvidia.com/mig-7g.96gb.count": "1", "nvidia.com/mig-7g.96gb.product": "NVIDIA-H20-MIG-7g.96gb",
             "nvidia.com/mig-7g.96gb.engines.ofa": "1", "nvidia.com/gpu.family": "hopper"}),
    "H200": (gpu("NVIDIA H200", 0x2335, 143771, (9, 0), mig("1g.18gb", 7)),
             [("1g.18gb", 19, n, 1) for n in range(7)],
             {"nvidia.com/mig-1g.18gb.memory": "16384", "nvidia.com/mig-1g.18gb.multiprocessors": "16"}),
    # mig-parted's all-balanced on a B200: 2x 1g.23gb, 2g.45gb (45312 MiB), 3g.90gb.
    "B200": (gpu("NVIDIA B200", 0x2901, 183359, (10, 0), mig("1g.23gb", 2), mig("2g.45gb"), mig("3g.90gb")),
             [("1g.23gb", 19, 0, 1), ("1g.23gb", 19, 1, 1), ("2g.45gb", 14, 2, 2), ("3g.90gb", 9, 4, 4)],
             {"nvidia.com/mig-2g.45gb.memory": "45312", "nvidia.com/mig-3g.90gb.engines.copy": "6",
              "nvidia.com/mig-1g.23gb.count": "2", "nvidia.com/gpu.family": "blackwell"}),
    "GB200": (gpu("NVIDIA GB200", 0x2941, 189471, (10, 0), mig("1g.47gb", 4)),
              [("1g.47gb", 15, n, 2) for n in (0, 2, 4, 6)],
              {"nvidia.com/mig-1g.47gb.count": "4", "nvidia.com/mig-1g.47gb.product": "NVIDIA-GB200-MIG-1g.47gb"}),
    # -cgi 2g.48gb,1g.24gb,1g.24gb on an RTX PRO 6000 Blackwell SE: 0:6, 6:3 and 9:3 of its 12 slices.
    "RTX PRO 6000": (gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", 0x2BB5, 97887, (12, 0),
                         mig("2g.48gb"), mig("1g.24gb", 2)),
                     [("2g.48gb", 5, 0, 6), ("1g.24gb", 14, 6, 3), ("1g.24gb", 14, 9, 3)],
                     {"nvidia.com/mig-2g.48gb.memory": "48512", "nvidia.com/mig-2g.48gb.multiprocessors": "94",
                      "nvidia.com/mig-1g.24gb.memory": "24192", "nvidia.com/mig-1g.24gb.engines.encoder": "1",
                      "nvidia.com/gpu.family": "blackwell"}),
    # the media-engine variants: +me.all owns all four decoders, -me has none.
    "RTX PRO 6000 WS": (gpu("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 0x2BB1, 97887, (12, 0),
                            mig("1g.24gb+me.all"), mig("1g.24gb-me", 3)),
                        [("1g.24gb+me.all", 65, 0, 3), ("1g.24gb-me", 67, 3, 3), ("1g.24gb-me", 67, 6, 3),
                         ("1g.24gb-me", 67, 9, 3)],
                        {"nvidia.com/mig-1g.24gb.me.all.engines.decoder": "4",
                         "nvidia.com/mig-1g.24gb-me.engines.decoder": "0", "nvidia.com/mig-1g.24gb-me.count": "3"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mig_devices_on_each_model_are_what_the_gpu_reports(tmp_path: Path, case: str) -> None:
    nvidia, expected, labels = CASES[case]
    assert placements(tmp_path / "probe", section(nvidia)) == expected
    inventory = inventory_of(tmp_path / "labels", section(nvidia))
    found = label_set_of(inventory, MIXED).labels
    assert {key: found.get(key) for key in labels} == labels
    resources = {resource.name: len(resource.devices) for resource in offer_of(inventory, MIXED).resources}
    per_profile: dict[str, int] = {}
    for profile, *_ in expected:
        name = "nvidia.com/mig-" + profile.replace("+", ".")
        per_profile[name] = per_profile.get(name, 0) + 1
    assert resources == per_profile


def test_every_model_of_the_table_has_a_case() -> None:
    """A model added to the table without a layout here, or one that is gone, fails."""
    cased = {(nvidia["name"], nvidia["pci_device_id"]) for nvidia, _, _ in CASES.values()}
    for model in MIG_MODELS:
        assert any(name in model.names and pci in model.pci_device_ids for name, pci in cased), model.model


def test_a_gpu_known_by_its_pci_device_id_gets_its_models_table_whatever_its_name(tmp_path: Path) -> None:
    # go-nvml's dgxa100 mock names its GPUs "Mock NVIDIA A100-SXM4-40GB", with the real device id
    nvidia = gpu("Mock NVIDIA A100-SXM4-40GB", 0x20B0, 40960, (8, 0), mig("1g.5gb", 2, memory_mib=4864))
    with capture_logs() as logs:
        assert placements(tmp_path, section(nvidia)) == [("1g.5gb", 19, 0, 1), ("1g.5gb", 19, 1, 1)]
    assert logs == []


def test_the_table_fills_what_a_mig_entry_leaves_out_and_takes_what_it_gives(tmp_path: Path) -> None:
    nvidia = gpu("NVIDIA B200", 0x2901, 183359, (10, 0), mig("7g.180gb"))
    (device,) = nvidia_part(inventory_of(tmp_path / "a", section(nvidia))).gpus[0].mig_devices
    assert (device.memory_mib, device.multiprocessors, device.engines_copy, device.engines_ofa) == (181248, 126, 16, 1)
    older_driver = gpu("NVIDIA A100-SXM4-40GB", 0x20B0, 40960, (8, 0), mig("2g.10gb", memory_mib=9984, engines_copy=3))
    (device,) = nvidia_part(inventory_of(tmp_path / "b", section(older_driver))).gpus[0].mig_devices
    assert (device.memory_mib, device.engines_copy, device.multiprocessors) == (9984, 3, 28)


def test_a_split_gpu_instance_gets_its_share_of_the_sms(tmp_path: Path) -> None:
    nvidia = gpu("NVIDIA A100-SXM4-40GB", 0x20B0, 40960, (8, 0),
                 *(mig("1c.3g.20gb", gpu_instance_id=1, compute_instance_id=n) for n in range(3)))
    devices = nvidia_part(inventory_of(tmp_path, section(nvidia))).gpus[0].mig_devices
    assert [(d.profile, d.multiprocessors, d.slices_gi, d.slices_ci, d.placement_start) for d in devices] == [
        ("1c.3g.20gb", 14, 3, 1, 0)] * 3


def test_nvml_answers_profile_info_from_the_models_table(tmp_path: Path) -> None:
    nvml = build(tmp_path, section(gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", 0x2BB5, 97887, (12, 0))))[1]
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX)
    assert (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB, info.multiprocessorCount) == (
        47, 1, 4, 24192, 46)
    assert (info.decoderCount, info.encoderCount, info.name) == (1, 1, "MIG 1g.24gb+gfx")
    with pytest.raises(pynvml.NVMLError_NotSupported):  # a GB202 has no 7-slice profile
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 4


UNKNOWN = "NVIDIA Z100 80GB"  # a model the table does not know


def unknown(*migs: dict[str, Any], repeat: int = 1) -> dict[str, Any]:
    return gpu(UNKNOWN, 0x9999, 81920, (11, 0), *migs, repeat=repeat)


def test_a_model_the_table_does_not_know_is_laid_out_in_order_with_one_warning(tmp_path: Path) -> None:
    nvidia = unknown(mig("3g.40gb", memory_mib=40192, multiprocessors=60), mig("1g.10gb", 2, memory_mib=9728),
                     repeat=2)
    with capture_logs() as logs:
        inventory = inventory_of(tmp_path, section(nvidia))
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert [(entry["device"], entry["reason"]) for entry in warnings] == [(UNKNOWN, "mig-model-unknown")]
    first, _ = nvidia_part(inventory).gpus
    # in order, each GPU instance as many memory slices as GPU slices; ids made up (index + 100)
    assert [(m.profile, m.gpu_instance_profile_id, m.placement_start, m.placement_size) for m in first.mig_devices] == [
        ("3g.40gb", pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE + 100, 0, 3),
        ("1g.10gb", pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE + 100, 3, 1),
        ("1g.10gb", pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE + 100, 4, 1)]
    labels = label_set_of(inventory, MIXED).labels
    assert (labels["nvidia.com/mig-3g.40gb.count"], labels["nvidia.com/mig-3g.40gb.multiprocessors"],
            labels["nvidia.com/mig-1g.10gb.count"], labels["nvidia.com/mig-1g.10gb.memory"]) == ("2", "60", "4", "9728")


def test_placements_a_profile_gives_are_used(tmp_path: Path) -> None:
    known = gpu("NVIDIA B200", 0x2901, 183359, (10, 0), mig("1g.23gb", placement_start=6), mig("1g.45gb"))
    assert placements(tmp_path / "known", section(known)) == [("1g.23gb", 19, 6, 1), ("1g.45gb", 15, 0, 2)]
    given = unknown(mig("2g.20gb", memory_mib=19968, placement_start=4, placement_size=4),
                    mig("1g.10gb", memory_mib=9728, placement_size=2), mig("1g.10gb", memory_mib=9728))
    assert [(start, size) for *_, start, size in placements(tmp_path / "unknown", section(given))] == [
        (4, 4), (0, 2), (2, 1)]
