"""The real ``gpu-labeller device-plugin`` process: flags, serving, metrics, SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from labeller.cli.root import main
from labeller.cli.commands.device_plugin import device_plugin
from tests.builders import PATIENCE_S, wait_for
from tests.core.cli import in_process
from tests.fakes.kubelet import FakeKubelet
from tests.processes import LoggedProcess
from tests.plugin.profile_files import l40s_node, time_slicing, write_yaml

GPU = "nvidia.com/gpu"


def test_help_lists_the_flags() -> None:
    result = CliRunner().invoke(main, ["device-plugin", "--help"])
    assert result.exit_code == 0
    for flag in ("--host-root", "--simulate", "--config", "--socket-dir", "--kubelet-socket", "--metrics-port",
                 "--health-recovery-seconds"):
        assert flag in result.output
    assert "/var/lib/kubelet/device-plugins" in result.output


def test_bad_profile_is_bad_input(sock_dir: Path) -> None:
    result = CliRunner().invoke(main, ["device-plugin", "--simulate", "nope", "--socket-dir", str(sock_dir)])
    assert result.exit_code == 2 and "no such profile" in result.output


def test_memory_sharing_without_a_node_name_is_one_line_and_exit_2(sock_dir: Path) -> None:
    result = in_process("device-plugin", "--simulate", "t4-x4-gpushare", "--socket-dir", str(sock_dir),
                        "--metrics-port", "0", env={k: v for k, v in os.environ.items() if k != "NODE_NAME"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "Error: sharing.memory: the plugin reads the pods bound to this Node to serve aliyun.com/gpu-mem; "
        "give --node-name NAME or set NODE_NAME"]


class PluginProcess(LoggedProcess):
    """A real ``gpu-labeller device-plugin`` process (or ``command``); its JSON log events are
    collected as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, command: str = "device-plugin"):
        super().__init__(command, "--metrics-port", "0", "--metrics-bind", "127.0.0.1", *args,
                         env={"DP_DISABLE_HEALTHCHECKS": "", **(env or {})})

    @property
    def port(self) -> int:
        return int(self.event("metrics server listening")["port"])

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=PATIENCE_S) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return exc.code


def test_serves_registers_reloads_on_sighup_and_stops_on_sigterm(sock_dir: Path, kubelet: FakeKubelet,
                                                                 tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
                      "    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n")
    with PluginProcess("--simulate", "dgx-h100", "--config", str(config), "--socket-dir", str(sock_dir),
                       "--health-recovery-seconds", "5s") as plugin:
        assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu.shared") == 24)
        assert (sock_dir / "nvidia-gpu.shared.sock").exists()
        kubelet.admit("nvidia.com/gpu.shared", [1])
        # Like a real kubelet, ours watches the plugin before its Register answer reaches the plugin,
        # which is ready once it has that answer: a moment after the devices are seen, on a loaded box.
        wait_for(lambda: plugin.status("/readyz") == 200)
        with urllib.request.urlopen(f"http://127.0.0.1:{plugin.port}/metrics", timeout=PATIENCE_S) as answer:
            metrics = answer.read().decode()
        assert 'gpu_labeller_plugin_registrations_total{outcome="ok",resource="nvidia.com/gpu.shared"} 1.0' in metrics
        assert 'gpu_labeller_plugin_allocations_total{outcome="ok",resource="nvidia.com/gpu.shared"} 1.0' in metrics
        assert 'gpu_labeller_plugin_devices{health="Healthy",resource="nvidia.com/gpu.shared"} 24.0' in metrics
        config.write_text("version: v1\nsharing: {timeSlicing: {replicas: 3}}\n")  # a bad config ...
        plugin.proc.send_signal(signal.SIGHUP)
        plugin.event("config reload failed, keeping the old config")
        assert plugin.proc.poll() is None and kubelet.allocatable("nvidia.com/gpu.shared") == 24
        since = time.monotonic()
        config.write_text("version: v1\n")  # SIGHUP: the config is read again, sharing is gone
        plugin.proc.send_signal(signal.SIGHUP)
        assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 8)
        assert kubelet.wait_for(lambda: [o.event for o in kubelet.seen("nvidia.com/gpu.shared", since)] ==
                                ["stream-ended"])  # a name no longer served: its stream ends
        assert kubelet.allocatable("nvidia.com/gpu.shared") == 0
        assert not (sock_dir / "nvidia-gpu.shared.sock").exists()
        assert plugin.stop() == 0
    assert sorted(p.name for p in sock_dir.iterdir()) == ["kubelet.sock"]


def test_sighup_with_more_replicas_updates_the_stream_without_registering_again(
        sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write_yaml(config, time_slicing(2))
    with PluginProcess("--simulate", "dgx-h100", "--config", str(config), "--socket-dir", str(sock_dir)) as plugin:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 16)
        wait_for(lambda: plugin.status("/readyz") == 200)  # the Register answer comes a moment after the watch
        since = time.monotonic()
        write_yaml(config, time_slicing(4))
        plugin.proc.send_signal(signal.SIGHUP)
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 32)
        assert kubelet.registration_count(GPU) == 1
        assert [(o.event, o.allocatable) for o in kubelet.seen(GPU, since)] == [("devices", 32)]
        assert plugin.status("/readyz") == 200


def test_a_late_driver_is_found_without_a_sighup(sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(2, nvml_error="library_not_found"))
    with PluginProcess("--simulate", str(profile), "--socket-dir", str(sock_dir)) as plugin:
        waiting = plugin.event("driver not ready; probing again")
        assert waiting["reason"] == "driver-not-ready" and "NVML library not found" in waiting["detail"]
        assert plugin.status("/readyz") == 503 and kubelet.registrations == []
        write_yaml(profile, l40s_node(2))  # the driver is installed
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2)
        assert plugin.event("driver ready; serving")["reason"] == "driver-ready"
        wait_for(lambda: plugin.status("/readyz") == 200)  # the Register answer comes a moment after the watch
        assert plugin.count("signal received") == 0


def test_fail_on_init_error_exits_with_1(sock_dir: Path, tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(2, nvml_error="library_not_found", config=time_slicing(2, fail_on_init_error=True)))
    with PluginProcess("--simulate", str(profile), "--socket-dir", str(sock_dir)) as plugin:
        assert plugin.proc.wait(PATIENCE_S) == 1
        plugin.event("driver not ready and flags.failOnInitError is true; exiting")
        assert "Traceback" not in "".join(plugin.stderr)


def test_a_missing_kubelet_socket_is_logged_with_its_path(sock_dir: Path) -> None:
    with PluginProcess("--simulate", "dgx-h100", "--socket-dir", str(sock_dir)) as plugin:
        missing = plugin.event("kubelet socket not found; waiting for the kubelet to create it")
        assert missing["socket"] == str(sock_dir / "kubelet.sock") and missing["reason"] == "kubelet-missing"
        # after the 1 s grace, not the 60 s between repeats; timed from the plugin's first line, as
        # starting the process may take seconds on a loaded machine
        assert missing["seen"] - plugin.events[0]["seen"] < 30
        assert plugin.status("/readyz") == 503


def test_a_metrics_port_in_use_is_one_line_and_exit_code_2(sock_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "labeller.cli", "device-plugin", "--simulate", "dgx-h100",
                                 "--socket-dir", str(sock_dir), "--metrics-bind", "127.0.0.1",
                                 "--metrics-port", str(port)], capture_output=True, text=True, timeout=PATIENCE_S)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("value", "seconds"), [("90", 90.0), ("90s", 90.0), ("2m", 120.0), ("500ms", 0.5)])
def test_health_recovery_takes_a_duration(value: str, seconds: float) -> None:
    context = device_plugin.make_context("device-plugin", ["--health-recovery-seconds", value])
    assert context.params["health_recovery_seconds"] == seconds


def test_health_recovery_rejects_a_non_duration() -> None:
    result = CliRunner().invoke(main, ["device-plugin", "--health-recovery-seconds", "soon"])
    assert result.exit_code == 2 and "'soon' is not a duration" in result.output
