"""The CLI as a user runs it: real processes, real exit codes, real output."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labeller import __version__
from tests.core.cli import gpu_labeller, in_process
from tests.builders import PATIENCE_S, add_pci_device, config_map_volume, empty_node


def test_version() -> None:
    result = gpu_labeller("--version")
    assert result.returncode == 0 and __version__ in result.stdout


def test_labels_for_a_mounted_host_root(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x20B0, 0x030200)
    result = in_process("labels", "--host-root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "nvidia.com/gpu.present=true" in result.stdout.splitlines()


def test_a_node_without_gpus_gets_no_labels(tmp_path: Path) -> None:
    result = in_process("labels", "--host-root", str(empty_node(tmp_path)), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {}


@pytest.mark.parametrize(("command", "stdout"), [(["labels"], ""), (["labels", "--format", "json"], "{}\n"),
                                                 (["resources"], ""), (["resourceslices", "--dra-vendors", "all"], "")],
                         ids=lambda c: " ".join(c) if isinstance(c, list) else "")
def test_a_node_without_gpus_says_so_on_stderr_and_names_simulate(command: list[str], stdout: str,
                                                                    tmp_path: Path) -> None:
    result = in_process("--log-format", "console", *command, "--host-root", str(empty_node(tmp_path)))
    assert (result.returncode, result.stdout) == (0, stdout), result.stderr
    [line] = result.stderr.splitlines()
    assert "no GPU found" in line and "--simulate" in line and "gpu-labeller profiles" in line


NVML_MISSING = "NVML Shared Library Not Found"  # what pynvml says on a machine without the NVIDIA driver


@pytest.mark.parametrize("command", [["labels"], ["resources"],
                                     ["run", "--once", "--dry-run", "--node-name", "n1", "--output", "features-file"]],
                         ids=lambda c: c[0])
def test_nvml_missing_is_logged_once(command: list[str], tmp_path: Path) -> None:
    root = empty_node(tmp_path / "root")
    add_pci_device(root, "0000:3b:00.0", 0x10DE, 0x2330, 0x030200, driver="nvidia")
    extra = ["--features-file", str(tmp_path / "features")] if command[0] == "run" else []
    result = gpu_labeller("--log-format", "console", *command, "--host-root", str(root), *extra)
    assert result.returncode in (0, 1), result.stderr  # run --once: 1, the probe was partial
    assert "nvidia.com/gpu.present" in result.stdout + result.stderr
    assert sum(NVML_MISSING in line for line in result.stderr.splitlines()) == 1, result.stderr


def test_run_once_does_not_wait_a_start_jitter(tmp_path: Path) -> None:
    """The jitter spreads a fleet's first reconcile; one reconcile by hand (--once) has no fleet to spread."""
    result = gpu_labeller("run", "--once", "--dry-run", "--node-name", "n1", "--output", "features-file",
                          "--features-file", str(tmp_path / "features"), "--simulate", "dgx-h100",
                          "--start-jitter", "3600s")  # times out (PATIENCE_S) if it waited
    assert result.returncode == 0, result.stderr


def test_bad_config_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    result = in_process("labels", "--host-root", str(tmp_path), "--config", str(config))
    assert result.returncode == 2
    assert result.stdout == ""
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1 and "flags.migStrategy" in error_lines[0]
    assert "Traceback" not in result.stderr


def test_unknown_profile_names_the_built_in_ones() -> None:
    result = in_process("labels", "--simulate", "no-such-node")
    assert result.returncode == 2
    assert "no-such-node: no such profile" in result.stderr and "Traceback" not in result.stderr


def test_output_file_is_written_atomically(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:c1:00.0", 0x1002, 0x74A1, 0x038000)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "labels.txt"
    result = in_process("labels", "--host-root", str(tmp_path), "--format", "nfd", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "amd.com/gpu.present=true" in out.read_text().splitlines()


def test_probe_explains_why_a_backend_found_nothing(tmp_path: Path) -> None:
    result = in_process("probe", "--host-root", str(empty_node(tmp_path)))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    reports = {r["backend"]: r for r in document["reports"]}
    assert (reports["pci"]["status"], reports["pci"]["detail"]) == ("absent", "0 GPU(s) among 1 PCI device(s)")
    assert reports["amd"]["detail"] == "no AMD GPU on the PCI bus and no KFD topology"
    assert document["partial"] is False


@pytest.mark.parametrize("command", [["labels"], ["resources"], ["probe"], ["labels", "--simulate", "dgx-h100"],
                                     ["resources", "--simulate", "dgx-a100-mig-mixed", "--format", "json"],
                                     ["labels", "--simulate", "dgx-h100", "--config-dir", "CONFIGS",
                                      "--config-name", "a"],
                                     ["resources", "--simulate", "dgx-h100", "--config-dir", "CONFIGS"],
                                     ["labels", "--simulate", "t4-x4-gpushare"],
                                     ["resources", "--simulate", "t4-x4-gpushare", "--format", "json"],
                                     ["explain", "--simulate", "dgx-h100"],
                                     ["explain", "nvidia.com/gpu.product", "--simulate", "mixed-l40s-mi210"],
                                     ["match", "nvidia.com/gpu.product=Tesla-T4"],
                                     ["match", "amd.com/gpu.present", "--simulate", "mi210-x8"],
                                     ["labels", "--simulate", "dgx-h100", "--format", "selector"],
                                     ["labels", "--simulate", "dgx-h100", "--format", "affinity", "--min-memory", "8"],
                                     ["resourceslices"],
                                     ["resourceslices", "--simulate", "mixed-l40s-mi210", "--dra-vendors", "all"],
                                     ["explain", "--simulate", "dgx-h100", "gpu.nvidia.com/productName"]])
def test_dry_run_never_imports_the_kubernetes_client_grpc_or_the_plugin(tmp_path: Path, command: list[str]) -> None:
    configs = config_map_volume(tmp_path / "configs", {"a": "version: v1\n"})
    command = [str(configs) if part == "CONFIGS" else part for part in command]
    args = command if "--simulate" in command else [*command, "--host-root", str(empty_node(tmp_path))]
    code = (
        "import sys\n"
        "from labeller.cli.root import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'grpc', 'google')\n"
        "             or m.startswith(('labeller.apps.plugin', 'labeller.apps.draplugin'))"
        " or m.rsplit('.', 1)[-1] in ('allocate', 'health')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PATIENCE_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_quiet_dry_run_never_imports_structlog() -> None:
    """structlog costs about a tenth of a cold dry run: it loads with the first line logged."""
    code = ("import sys\nfrom labeller.cli.root import main\ntry:\n    main(['labels', '--simulate', 'dgx-h100'])\n"
            "except SystemExit:\n    pass\nprint('structlog' in sys.modules, 'logging' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PATIENCE_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False False"


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_a_dry_run_that_logs_loads_structlog_as_configured(log_format: str, tmp_path: Path) -> None:
    """The format and level given before structlog was loaded apply to the first line it logs."""
    quiet = gpu_labeller("--log-format", log_format, "--log-level", "error", "labels",
                         "--host-root", str(empty_node(tmp_path)))
    assert (quiet.returncode, quiet.stderr) == (0, "")  # "no GPU found" is a warning: below the level asked
    result = gpu_labeller("--log-format", log_format, "labels", "--host-root", str(empty_node(tmp_path)))
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.splitlines()
    if log_format == "json":
        record = json.loads(line)
        assert (record["level"], "no GPU found" in record["event"]) == ("warning", True), line
    else:
        assert "[warning  ]" in line and "no GPU found" in line and not line.startswith("{"), line


def test_help_lists_every_command_without_loading_them() -> None:
    result = gpu_labeller("--help")
    assert result.returncode == 0
    for command in ("labels", "resources", "resourceslices", "probe", "profiles", "run", "cleanup", "device-plugin",
                    "completion", "explain", "match", "nodes"):
        assert f"  {command} " in result.stdout


def test_shell_completion_script() -> None:
    result = gpu_labeller("completion", "bash")
    assert result.returncode == 0 and "_GPU_LABELLER_COMPLETE" in result.stdout


def test_a_node_with_both_vendors_gets_both_label_sets() -> None:
    result = gpu_labeller("labels", "--simulate", "mixed-l40s-mi210", "--format", "json")
    assert result.returncode == 0, result.stderr
    labels = json.loads(result.stdout)
    # each vendor's labels describe only its own GPUs: nothing of one vendor overwrites the other
    assert labels["nvidia.com/gpu.count"] == "2" and labels["nvidia.com/gpu.product"] == "NVIDIA-L40S"
    assert labels["nvidia.com/gpu.family"] == "ada-lovelace"
    assert labels["amd.com/gpu.product-name"] == "AMD_Instinct_MI210"
    assert labels["beta.amd.com/gpu.device-id.740f"] == "2" and labels["amd.com/gpu.vram"] == "64G"
    assert labels["nvidia.com/gpu.present"] == labels["amd.com/gpu.present"] == "true"
    probe = json.loads(gpu_labeller("probe", "--simulate", "mixed-l40s-mi210").stdout)
    assert sorted(g["vendor_id"] for g in probe["pci_gpus"]) == ["1002", "1002", "10de", "10de"]


def test_a_simulated_node_never_consults_this_machines_nvml(tmp_path: Path) -> None:
    # The real pynvml, except that initialising NVML leaves a mark: on a host with NVIDIA GPUs that
    # would add the host's GPUs to a simulated AMD-only node.
    real = importlib.util.find_spec("pynvml")
    assert real is not None and real.origin is not None
    marker = tmp_path / "nvml-initialised"
    (tmp_path / "pynvml.py").write_text(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('pynvml', {real.origin!r})\n"
        "real = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(real)\n"
        "globals().update({k: v for k, v in vars(real).items() if not k.startswith('__')})\n"
        "def nvmlInit(*args, **kwargs):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    return real.nvmlInit(*args, **kwargs)\n"
    )
    result = subprocess.run([sys.executable, "-m", "labeller.cli", "labels", "--simulate", "mi210-x8"],
                            capture_output=True, text=True, timeout=PATIENCE_S,
                            env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{Path.cwd()}"})
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert "amd.com/gpu.present=true" in result.stdout and "nvidia.com" not in result.stdout


def test_resources_says_what_the_plugin_would_advertise() -> None:
    result = gpu_labeller("resources", "--simulate", "t4-time-slicing")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "nvidia.com/gpu: 4 devices (1 physical x 4 replicas, time-slicing), socket nvidia-gpu.sock"
    assert lines[1].startswith("  health: NVML")
    assert len(lines) == 2 + 4  # one line per device ID
    assert [line.split()[0].rsplit("::", 1)[1] for line in lines[2:]] == ["0", "1", "2", "3"]


def test_resources_names_what_is_withheld_and_why(tmp_path: Path) -> None:
    config = tmp_path / "single.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: single\n")
    result = gpu_labeller("resources", "--simulate", "dgx-a100-mig-mixed", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "nvidia.com/gpu: nothing offered: some GPUs have MIG enabled and some do not\n"


def test_resources_json_lists_each_device_with_its_physical_device() -> None:
    result = gpu_labeller("resources", "--simulate", "mi300x-x8-cpx", "--format", "json")
    (amd,) = json.loads(result.stdout)["resources"]
    assert (amd["name"], amd["count"], amd["physical"], amd["replicas"]) == ("amd.com/gpu", 63, 63, 1)
    assert {d["partition"] for d in amd["devices"]} == {"xcp"}  # the capture has no partition mode files
    assert len({d["gpu"] for d in amd["devices"]}) == 8  # 63 partitions of 8 GPUs


def test_probe_prints_pci_ids_classes_and_revisions_in_hex_as_lspci() -> None:
    result = gpu_labeller("probe", "--simulate", "mixed-l40s-mi210")
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    nvidia_gpu = next(g for g in probe["pci_gpus"] if g["vendor_id"] == "10de")
    assert (nvidia_gpu["id"], nvidia_gpu["class_code"], nvidia_gpu["revision"]) == ("10de:26b9", "0302", "a1")
    amd_gpu = next(g for g in probe["pci_gpus"] if g["vendor_id"] == "1002")
    assert (amd_gpu["id"], amd_gpu["class_code"]) == ("1002:740f", "0380")
    assert probe["nvidia"]["gpus"][0]["pci_class"] == "0302"
    assert probe["amd"]["gpus"][0]["device_id"] == "740f"
