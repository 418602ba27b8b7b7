"""Every GFD labelling rule (nvidia.md §1), on inventories built by hand."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import structlog

from labeller.model.config import Config, SharedResource, Sharing, parse_config
from labeller.model.inventory import Inventory, PciGpu
from tests.builders import A100_40GB_BYTES, H100_BYTES, T4_BYTES, label_set_of, mps_ready
from vendors import RESOURCE_NAMES
from vendors.nvidia.facts import PCI_VENDOR_ID
from vendors.nvidia.labels import family, sanitise
from vendors.nvidia.model import MigDevice, NvidiaGpu, NvidiaInventory

H100 = NvidiaGpu(0, "NVIDIA H100 80GB HBM3", "GPU-h0", H100_BYTES, (9, 0), "0000:1b:00.0", 0, True, False,
                 pci_class=0x030200)
A100 = NvidiaGpu(0, "NVIDIA A100-SXM4-40GB", "GPU-a0", A100_40GB_BYTES, (8, 0), "0000:07:00.0", 0, True, False,
                 pci_class=0x030200)
T4 = NvidiaGpu(0, "Tesla T4", "GPU-t0", T4_BYTES, (7, 5), "0000:00:1e.0", 0, False, False, pci_class=0x030200)
# A100-40GB MIG attributes from nvidia-smi mig -lgip.
MIG_1G5GB = MigDevice(0, "MIG-a", "1g.5gb", 4864, multiprocessors=14, slices_gi=1, slices_ci=1, engines_copy=1)
MIG_3G20GB = MigDevice(1, "MIG-b", "3g.20gb", 20096, multiprocessors=42, slices_gi=3, slices_ci=3, engines_copy=3,
                       engines_decoder=2)


def gpus(template: NvidiaGpu, count: int, **changes: Any) -> list[NvidiaGpu]:
    return [replace(template, index=i, uuid=f"{template.uuid}-{i}", **changes) for i in range(count)]


def with_mig(gpu: NvidiaGpu, *migs: MigDevice) -> NvidiaGpu:
    return replace(gpu, mig_enabled=True, mig_devices=migs)


def labels(*members: NvidiaGpu, config: dict[str, Any] | Config | None = None, driver: str = "550.54.15",
           cuda: int = 12040, machine: str | None = "DGXH100", vgpu: bool = False, mps_served: bool = False
           ) -> dict[str, str]:
    """The labels; ``mps_served``: as while the MPS control daemon serves what the config shares."""
    inventory = Inventory(parts=(NvidiaInventory(driver, cuda, tuple(members), vgpu_present=vgpu),), machine=machine)
    parsed = parse_config(config, RESOURCE_NAMES) if isinstance(config, dict) else config or Config()
    if mps_served:
        inventory = mps_ready(inventory, parsed)
    result = label_set_of(inventory, parsed)
    assert result.conflicts == []
    return result.labels


def subset(found: dict[str, str], expected: dict[str, str]) -> None:
    assert {key: found.get(key) for key in expected} == expected


@pytest.mark.parametrize(("raw", "clean"), [
    ("NVIDIA-TITAN-X-(Pascal)", "NVIDIA-TITAN-X-Pascal"),
    ("some [ / thing / ]else", "some-thing-else"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("HP Z820 Workstation", "HP-Z820-Workstation"),
])
def test_sanitise_like_gfd(raw: str, clean: str) -> None:
    assert sanitise(raw) == clean


@pytest.mark.parametrize(("major", "minor", "name"), [
    (1, 3, "tesla"), (2, 1, "fermi"), (3, 7, "kepler"), (5, 2, "maxwell"), (6, 1, "pascal"), (7, 0, "volta"),
    (7, 2, "volta"), (7, 5, "turing"), (8, 0, "ampere"), (8, 6, "ampere"), (8, 7, "ampere"), (8, 8, "ampere"),
    (8, 9, "ada-lovelace"), (8, 10, "ada-lovelace"),  # GFD: ampere only while the minor is below 9
    (9, 0, "hopper"), (10, 0, "blackwell"), (12, 0, "blackwell"), (13, 0, "rubin"), (4, 0, "undefined"),
    (11, 0, "undefined"),
])
def test_family_table(major: int, minor: int, name: str) -> None:
    assert family(major, minor) == name


def test_a100_node_matches_the_gfd_example() -> None:
    found = labels(*gpus(A100, 8), driver="550.54.15", cuda=12040, machine="DGX-A100")
    subset(found, {
        "nvidia.com/cuda.driver-version.full": "550.54.15", "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "54", "nvidia.com/cuda.driver-version.revision": "15",
        "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "54", "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime-version.full": "12.4", "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4", "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4", "nvidia.com/gpu.machine": "DGX-A100",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "40536", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.mode": "compute", "nvidia.com/mig.capable": "true", "nvidia.com/mps.capable": "false",
        "nvidia.com/vgpu.present": "false", "nvidia.com/gpu.present": "true",
    })
    assert "nvidia.com/mig.strategy" not in found and "nvidia.com/gpu.clique" not in found


def test_two_part_driver_version_has_an_empty_revision() -> None:
    subset(labels(H100, driver="550.90"), {"nvidia.com/cuda.driver-version.revision": "",
                                          "nvidia.com/cuda.driver.rev": "",
                                          "nvidia.com/cuda.driver-version.minor": "90"})


def test_malformed_driver_version_drops_only_driver_labels() -> None:
    found = labels(H100, driver="550")
    assert not any(key.startswith(("nvidia.com/cuda.driver-version", "nvidia.com/cuda.driver.")) for key in found)
    assert found["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_memory_label_omitted_when_unknown() -> None:
    assert "nvidia.com/gpu.memory" not in labels(replace(H100, memory_bytes=0))
    assert labels(H100)["nvidia.com/gpu.memory"] == "81559"
    assert labels(T4)["nvidia.com/gpu.memory"] == "15109"


def test_compute_major_zero_gives_no_family() -> None:
    found = labels(replace(H100, compute_capability=(0, 0)))
    assert not any(key.startswith(("nvidia.com/gpu.family", "nvidia.com/gpu.compute")) for key in found)


def test_product_name_with_parentheses_is_sanitised() -> None:
    assert labels(replace(T4, name="NVIDIA TITAN X (Pascal)"))["nvidia.com/gpu.product"] == "NVIDIA-TITAN-X-Pascal"


def test_machine_label() -> None:
    assert labels(H100, machine=None)["nvidia.com/gpu.machine"] == "unknown"  # unreadable
    assert labels(H100, machine="")["nvidia.com/gpu.machine"] == ""  # readable but empty: GFD keeps it empty
    assert labels(H100, machine="ProLiant DL380 Gen10/Plus")["nvidia.com/gpu.machine"] == "ProLiant-DL380-Gen10Plus"
    assert "nvidia.com/gpu.machine" not in labels(H100, config={"labeller": {"labels": {"machine": False}}})


def test_time_slicing() -> None:
    sharing = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    subset(labels(T4, config=sharing), {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4",
                                        "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.count": "1"})


def test_rename_by_default_keeps_the_plain_product() -> None:
    sharing = {"sharing": {"timeSlicing": {"renameByDefault": True,
                                           "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    subset(labels(T4, config=sharing), {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.replicas": "4",
                                        "nvidia.com/gpu.sharing-strategy": "time-slicing"})


MPS = Config(sharing=Sharing("mps", fail_requests_greater_than_one=True,
                             resources=(SharedResource("nvidia.com/gpu", 2),)))


def test_mps_is_labelled_only_while_the_control_daemon_serves_it() -> None:
    subset(labels(H100, config=MPS, mps_served=True), {
        "nvidia.com/mps.capable": "true", "nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "2",
        "nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED"})
    # No readiness file (or a stale one): no MPS replicas are advertised, and the labels say so.
    subset(labels(H100, config=MPS), {
        "nvidia.com/mps.capable": "false", "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.replicas": "0",
        "nvidia.com/gpu.count": "0", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})


def test_mps_with_mig_enabled_is_not_capable_instead_of_failing() -> None:
    with structlog.testing.capture_logs() as logs:
        found = labels(with_mig(A100, MIG_1G5GB), replace(A100, index=1, uuid="GPU-a1"), config=MPS, mps_served=True)
    assert found["nvidia.com/mps.capable"] == "false"
    assert any(entry["log_level"] == "error" and entry.get("vendor") == "nvidia" for entry in logs)


def test_a_shared_subset_is_counted_with_its_whole_gpus() -> None:
    config = {"sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4, "devices": [0, 1, 2], "rename": "gpu-shared"}]}}}
    subset(labels(*gpus(H100, 8), config=config), {
        "nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.shared-count": "3",
        "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    # every GPU listed: nothing stays whole, so no shared-count (GFD's labels, as with devices: all)
    everything = {"sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4, "devices": 2, "rename": "gpu-shared"}]}}}
    assert "nvidia.com/gpu.shared-count" not in labels(*gpus(H100, 2), config=everything)


def test_mig_enabled_gpus_under_strategy_none_are_labelled_as_advertised() -> None:
    # NVIDIA's plugin advertises a MIG-enabled GPU whole under migStrategy none, and time-slicing
    # replicates it; GFD would label replicas=0 and sharing-strategy=none, contradicting that.
    sharing = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    subset(labels(with_mig(A100, MIG_1G5GB), config=sharing),
           {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED", "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.count": "1"})


def test_every_gpu_in_mig_under_strategy_mixed_offers_no_whole_gpu() -> None:
    found = labels(with_mig(A100, MIG_1G5GB), config={"flags": {"migStrategy": "mixed"}})
    subset(found, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "0",
                   "nvidia.com/gpu.replicas": "0", "nvidia.com/gpu.sharing-strategy": "none",
                   "nvidia.com/mig-1g.5gb.count": "1"})


def test_mig_single() -> None:
    members = [with_mig(gpu, *(replace(MIG_1G5GB, index=i, uuid=f"MIG-{gpu.index}-{i}") for i in range(7)))
               for gpu in gpus(A100, 2)]
    found = labels(*members, config={"flags": {"migStrategy": "single"}})
    subset(found, {
        "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "14", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "4864", "nvidia.com/gpu.multiprocessors": "14", "nvidia.com/gpu.slices.gi": "1",
        "nvidia.com/gpu.slices.ci": "1", "nvidia.com/gpu.engines.copy": "1", "nvidia.com/gpu.engines.decoder": "0",
        "nvidia.com/gpu.engines.encoder": "0", "nvidia.com/gpu.engines.jpeg": "0", "nvidia.com/gpu.engines.ofa": "0",
        "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.compute.major": "8",
    })


def test_mig_single_with_sharing_is_shared() -> None:
    config = {"flags": {"migStrategy": "single"},
              "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    subset(labels(with_mig(A100, MIG_1G5GB), config=config),
           {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED", "nvidia.com/gpu.replicas": "2",
            "nvidia.com/gpu.sharing-strategy": "time-slicing"})


def test_mig_single_without_mig_enabled_gpus_is_like_none() -> None:
    subset(labels(A100, config={"flags": {"migStrategy": "single"}}),
           {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "40536"})


INVALID = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID", "nvidia.com/gpu.count": "0",
           "nvidia.com/gpu.replicas": "0", "nvidia.com/gpu.sharing-strategy": "", "nvidia.com/gpu.memory": "0"}


@pytest.mark.parametrize("members", [
    [with_mig(A100, MIG_1G5GB), replace(A100, index=1, uuid="GPU-a1")],  # MIG on one GPU only
    [with_mig(A100)],  # MIG enabled without MIG devices
    [with_mig(A100, MIG_1G5GB, MIG_3G20GB)],  # two profiles
], ids=["mixed-modes", "empty", "two-profiles"])
def test_mig_single_invalid(members: list[NvidiaGpu]) -> None:
    subset(labels(*members, config={"flags": {"migStrategy": "single"}}), INVALID)


def test_mig_single_invalid_names_the_mig_enabled_model_even_when_another_is_more_numerous() -> None:
    l4 = NvidiaGpu(0, "NVIDIA L4", "GPU-l0", 24152899584, (8, 9), "0000:01:00.0", 0, False, False, pci_class=0x030200)
    members = [*gpus(l4, 3), replace(with_mig(A100, MIG_1G5GB), index=3, uuid="GPU-a3"),
               replace(with_mig(A100, MIG_1G5GB), index=4, uuid="GPU-a4")]
    subset(labels(*members, config={"flags": {"migStrategy": "single"}}), INVALID)


def test_mig_mixed() -> None:
    members = [with_mig(A100, MIG_1G5GB, replace(MIG_1G5GB, index=1, uuid="MIG-a2"), MIG_3G20GB),
               replace(A100, index=1, uuid="GPU-a1"), with_mig(replace(A100, index=2, uuid="GPU-a2"))]
    config = {"flags": {"migStrategy": "mixed"},
              "sharing": {"timeSlicing": {"resources": [{"name": "mig-1g.5gb", "replicas": 3}]}}}
    found = labels(*members, config=config)
    subset(found, {
        "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count": "1",  # the one GPU offered whole
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.replicas": "1",
        "nvidia.com/mig-1g.5gb.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED", "nvidia.com/mig-1g.5gb.count": "2",
        "nvidia.com/mig-1g.5gb.replicas": "3", "nvidia.com/mig-1g.5gb.sharing-strategy": "time-slicing",
        "nvidia.com/mig-1g.5gb.memory": "4864", "nvidia.com/mig-1g.5gb.multiprocessors": "14",
        "nvidia.com/mig-3g.20gb.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "nvidia.com/mig-3g.20gb.count": "1",
        "nvidia.com/mig-3g.20gb.replicas": "1", "nvidia.com/mig-3g.20gb.sharing-strategy": "none",
        "nvidia.com/mig-3g.20gb.memory": "20096", "nvidia.com/mig-3g.20gb.engines.decoder": "2",
        "nvidia.com/mig-3g.20gb.slices.gi": "3",
    })


def test_mig_mixed_media_extension_profile_key() -> None:
    me = replace(MIG_1G5GB, profile="1g.5gb+me", engines_jpeg=1, engines_ofa=1)
    found = labels(with_mig(A100, me), config={"flags": {"migStrategy": "mixed"}})
    subset(found, {"nvidia.com/mig-1g.5gb.me.count": "1", "nvidia.com/mig-1g.5gb.me.engines.jpeg": "1",
                   "nvidia.com/mig-1g.5gb.me.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"})


# H100-80GB 1g.10gb+me: 9856 MiB, 16 SMs, one JPEG and one OFA engine (nvidia-smi mig -lgip).
MIG_1G10GB_ME = MigDevice(0, "MIG-h", "1g.10gb+me", 9856, multiprocessors=16, slices_gi=1, slices_ci=1,
                          engines_copy=1, engines_jpeg=1, engines_ofa=1)


@pytest.mark.parametrize(("strategy", "key"), [("mixed", "nvidia.com/mig-1g.10gb.me.product"),
                                               ("single", "nvidia.com/gpu.product")])
def test_a_plus_in_the_mig_profile_is_a_dot_in_the_product_as_gfd_writes_it(strategy: str, key: str) -> None:
    found = labels(with_mig(H100, MIG_1G10GB_ME), config={"flags": {"migStrategy": strategy}})
    assert found[key] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me"  # not ...-1g.10gbme


def test_gpu_mode() -> None:
    assert labels(replace(T4, pci_class=0x030000))["nvidia.com/gpu.mode"] == "graphics"
    mixed = [replace(T4, pci_class=0x030000), replace(T4, index=1, uuid="GPU-t1")]
    assert labels(*mixed)["nvidia.com/gpu.mode"] == "unknown"
    assert labels(replace(T4, pci_class=None))["nvidia.com/gpu.mode"] == "unknown"


def test_clique_only_when_all_agree() -> None:
    clique = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"
    same = gpus(H100, 2, clique=clique)
    assert labels(*same)["nvidia.com/gpu.clique"] == clique
    assert "nvidia.com/gpu.clique" not in labels(same[0], replace(same[1], clique=clique[:-1] + "2"))


def test_vgpu_present() -> None:
    assert labels(H100, vgpu=True)["nvidia.com/vgpu.present"] == "true"


def test_heterogeneous_node_describes_the_most_numerous_model_and_counts_every_gpu_offered() -> None:
    members = [H100, *(replace(gpu, index=gpu.index + 1) for gpu in gpus(A100, 2))]
    with structlog.testing.capture_logs() as logs:
        found = labels(*members)
    # nvidia.com/gpu advertises all 3 GPUs; GFD would count only the 2 of the model it names
    subset(found, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "3",
                   "nvidia.com/gpu.memory": "40536", "nvidia.com/gpu.family": "ampere"})
    assert any(entry["log_level"] == "warning" and "models" in entry for entry in logs)


def test_heterogeneous_tie_goes_to_the_lowest_index() -> None:
    found = labels(replace(A100, index=1), replace(H100, index=0))
    subset(found, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2"})


def test_pci_only_gpus_get_presence_only() -> None:
    inventory = Inventory(pci_gpus=(PciGpu("0000:1b:00.0", PCI_VENDOR_ID, 0x2330, 0x030200),))
    assert label_set_of(inventory, Config()).labels == {"nvidia.com/gpu.present": "true"}


def test_labels_group_switch_turns_nvidia_labels_off() -> None:
    assert labels(H100, config={"labeller": {"labels": {"nvidia": False}}}) == {}
    assert labels(H100, config={"labeller": {"labels": {"nvidia": False, "timestamp": True}}}) == {}
    assert "nvidia.com/gfd.timestamp" in labels(H100, config={"labeller": {"labels": {"timestamp": True}}})
