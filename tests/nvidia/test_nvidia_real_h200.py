"""A real NVIDIA H200 (passed through to a VM, driver 580.159.04) as its NVML answered
``tests/e2e/real_nvml.py`` (tests/fixtures/nvidia/h200-passthrough/): the MIG table and the
simulated profile ``h200-passthrough`` are held to what the real GPU said, and so is everything the
CLI derives from it (labels, advertised resources, ResourceSlices, with and without time-slicing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml
from click.testing import CliRunner

from labeller.cli.root import main
from vendors.nvidia.migtable import MIG_MODELS

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia" / "h200-passthrough"
PROFILE = Path(__file__).resolve().parents[2] / "vendors" / "profiles" / "h200-passthrough.yaml"
TIME_SLICING = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}


def _nvml() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CAPTURE / "nvml.json").read_text())
    return loaded


def test_the_h200_mig_table_is_what_the_real_gpus_nvml_reports() -> None:
    gpu = _nvml()["gpus"][0]
    (model,) = [m for m in MIG_MODELS if gpu["pci"]["pciDeviceId"] >> 16 in m.pci_device_ids]
    real = {}
    for index, entry in gpu["gpu_instance_profiles"].items():
        info = entry["info"]
        if "name" in info:  # NVMLError_NotSupported: not a profile of this GPU
            real[info["name"].removeprefix("MIG ")] = (
                int(index), info["id"], info["memorySizeMB"], info["multiprocessorCount"], info["instanceCount"],
                info["sliceCount"], tuple(start for start, _ in entry["placements"]),
                {size for _, size in entry["placements"]},
                (info["copyEngineCount"], info["decoderCount"], info["encoderCount"], info["jpegCount"],
                 info["ofaCount"]))
    ours = {p.name: (getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{p.nvml}"), p.id, p.memory_mib, p.multiprocessors,
                     p.instances, p.compute_slices, p.starts, {p.memory_slices},
                     (p.engines.copy, p.engines.decoder, p.engines.encoder, p.engines.jpeg, p.engines.ofa))
            for p in model.profiles}
    assert ours == real
    assert model.memory_mib == gpu["memory"]["total"] // 2**20


def test_the_simulated_profile_is_the_captured_gpu() -> None:
    nvml, profile = _nvml(), yaml.safe_load(PROFILE.read_text())["nvidia"]
    gpu, simulated = nvml["gpus"][0], profile["gpus"][0]
    assert (profile["driver_version"], profile["cuda_driver_version"]) == (
        nvml["system"]["driver_version"], nvml["system"]["cuda_driver_version"])
    assert (simulated["name"], simulated["uuid"], simulated["memory_bytes"], simulated["compute_capability"]) == (
        gpu["name"], gpu["uuid"], gpu["memory"]["total"], gpu["compute_capability"])
    assert (simulated["pci_bus_id"], simulated["pci_device_id"]) == (
        gpu["pci"]["busIdLegacy"], gpu["pci"]["pciDeviceId"] >> 16)
    assert simulated["mig_mode"] == "disabled" and gpu["mig_mode"] == [0, 0]


@pytest.mark.parametrize(("command", "captured", "sharing"), [
    (["labels", "--format", "json"], "labels.json", False),
    (["resources", "--format", "json"], "resources.json", False),
    (["resourceslices", "--format", "json", "--node-name", "gpu-node", "--dra-vendors", "all"],
     "resourceslices.json", False),
    (["labels", "--format", "json"], "labels-ts.json", True),
    (["resources", "--format", "json"], "resources-ts.json", True),
])
def test_the_simulated_h200_says_what_the_real_one_said(tmp_path: Path, command: list[str], captured: str,
                                                        sharing: bool) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(TIME_SLICING))
    result = CliRunner().invoke(main, [*command, "--simulate", "h200-passthrough",
                                       *(["--config", str(config)] if sharing else [])])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == json.loads((CAPTURE / captured).read_text())


def test_the_real_gpu_registered_for_the_events_the_health_check_watches() -> None:
    gpu = _nvml()["gpus"][0]
    assert gpu["events"]["register"] == "ok"
    assert gpu["events"]["wait_1s"]["nvml_error"] == "NVMLError_Timeout"
    assert gpu["supported_event_types"] & pynvml.nvmlEventTypeXidCriticalError
