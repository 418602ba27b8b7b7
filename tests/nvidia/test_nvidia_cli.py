"""The real command line on the built-in NVIDIA profiles, and on broken profile files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from labeller.cli.root import main
from tests.builders import PATIENCE_S, h100, section

NVIDIA_PROFILES = ("dgx-h100", "dgx-a100-mig-mixed", "a100-mig-single", "t4-time-slicing", "h100-pcie-driver-2part")


def cli() -> list[str]:
    exe = shutil.which("gpu-labeller")
    return [exe] if exe else [sys.executable, "-m", "labeller.cli"]


def parse(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_dgx_h100_end_to_end() -> None:
    result = subprocess.run([*cli(), "labels", "--simulate", "dgx-h100"], capture_output=True, text=True,
                            timeout=PATIENCE_S)
    assert result.returncode == 0, result.stderr
    found = parse(result.stdout)
    expected = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559",  # 85520809984 bytes
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.machine": "DGXH100",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/vgpu.present": "false",
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.runtime-version.full": "12.4",
    }
    assert {key: found.get(key) for key in expected} == expected
    assert not any(key.startswith(("nvidia.com/mig.strategy", "nvidia.com/mig-")) for key in found)


def test_dgx_h100_probe_models_nvswitch_all_to_all() -> None:
    result = CliRunner().invoke(main, ["probe", "--simulate", "dgx-h100"])
    assert result.exit_code == 0, result.output
    gpus = json.loads(result.output)["nvidia"]["gpus"]
    buses = {gpu["pci_bus_id"] for gpu in gpus}
    assert len(gpus) == 8 and all(set(gpu["nvlink_peers"]) == buses - {gpu["pci_bus_id"]} for gpu in gpus)
    assert [gpu["numa_node"] for gpu in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("profile", NVIDIA_PROFILES)
def test_builtin_profiles_label_cleanly(profile: str) -> None:
    result = CliRunner().invoke(main, ["labels", "--simulate", profile, "--format", "json"])
    assert result.exit_code == 0, result.output
    labels = json.loads(result.output)
    assert labels["nvidia.com/gpu.present"] == "true" and "nvidia.com/gpu.product" in labels


def test_builtin_profiles_are_listed_with_one_line_descriptions() -> None:
    listed = CliRunner().invoke(main, ["profiles"]).output
    for profile in NVIDIA_PROFILES:
        line = next(line for line in listed.splitlines() if line.startswith(profile + " "))
        assert len(line.split(None, 1)[1]) > 10


def test_mixed_profile_counts_what_each_resource_offers() -> None:
    labels = json.loads(CliRunner().invoke(main,
                                           ["labels", "--simulate", "dgx-a100-mig-mixed", "--format", "json"]).output)
    # gpu.count: the 4 whole GPUs advertised as nvidia.com/gpu (GFD would count all 8 physical GPUs);
    # 2 GPUs x 7 1g.5gb + 2 GPUs x (3g.20gb + 2g.10gb + 2 x 1g.5gb)
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/mig-1g.5gb.count"]) == ("4", "18")
    assert (labels["nvidia.com/mig-3g.20gb.count"], labels["nvidia.com/mig-2g.10gb.count"]) == ("2", "2")
    assert labels["nvidia.com/mig-3g.20gb.memory"] == "20096"


def test_single_profile_and_time_slicing_profile() -> None:
    single = json.loads(CliRunner().invoke(main,
                                           ["labels", "--simulate", "a100-mig-single", "--format", "json"]).output)
    assert (single["nvidia.com/gpu.product"],
            single["nvidia.com/gpu.count"]) == ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "56")
    t4 = json.loads(CliRunner().invoke(main, ["labels", "--simulate", "t4-time-slicing", "--format", "json"]).output)
    assert (t4["nvidia.com/gpu.product"], t4["nvidia.com/gpu.replicas"], t4["nvidia.com/gpu.memory"]) == \
        ("Tesla-T4-SHARED", "4", "15109")


def write_profile(tmp_path: Path, nvidia: object) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({"name": "broken", "description": "broken", "nvidia": nvidia}))
    return path


BAD = section(h100(), h100(), h100(memory_bytes=0))
BAD_MESSAGE = "nvidia.gpus[2].memory_bytes: must be a positive integer"


def test_bad_profile_exits_2_through_the_real_cli(tmp_path: Path) -> None:
    path = write_profile(tmp_path, BAD)
    result = subprocess.run([*cli(), "labels", "--simulate", str(path)], capture_output=True, text=True,
                            timeout=PATIENCE_S)
    assert result.returncode == 2 and BAD_MESSAGE in result.stderr and result.stdout == ""
    assert "Traceback" not in result.stderr


def test_bad_profile_exits_2_through_click(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["labels", "--simulate", str(write_profile(tmp_path, BAD))])
    assert result.exit_code == 2 and BAD_MESSAGE in result.output


def test_nvml_missing_profile_labels_presence_only(tmp_path: Path) -> None:
    path = write_profile(tmp_path, section(h100(), nvml_error="library_not_found"))
    result = CliRunner().invoke(main, ["labels", "--simulate", str(path)])
    assert result.exit_code == 0
    assert "nvidia.com/gpu.present=true" in result.output and "nvidia.com/gpu.product" not in result.output
    assert "NVML library not found" in result.output  # the warning log on stderr (mixed in by CliRunner)


def test_mig_media_extension_profile_keeps_its_plus_as_a_dot_in_the_product(tmp_path: Path) -> None:
    me = {"profile": "1g.10gb+me", "uuid": "MIG-{gpu}-{i}", "memory_mib": 9856, "engines_jpeg": 1, "engines_ofa": 1}
    profile = yaml.safe_load(write_profile(tmp_path, section(h100(mig_mode="enabled", mig_devices=[me]))).read_text())
    profile["config"] = {"version": "v1", "flags": {"migStrategy": "mixed"}}
    path = tmp_path / "h100-me.yaml"
    path.write_text(yaml.safe_dump(profile))
    result = subprocess.run([*cli(), "labels", "--simulate", str(path)], capture_output=True, text=True,
                            timeout=PATIENCE_S)
    assert result.returncode == 0, result.stderr
    found = parse(result.stdout)
    assert found["nvidia.com/mig-1g.10gb.me.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me"
    assert found["nvidia.com/mig-1g.10gb.me.count"] == "1"
