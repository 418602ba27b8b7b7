"""The real ``gpu-labeller device-plugin`` process: flags, serving, metrics, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from click.testing import CliRunner

from labeller.cli import main
from tests.fakes.kubelet import FakeKubelet


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


def _port(proc: subprocess.Popen[str]) -> int:
    assert proc.stderr is not None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "metrics server listening":
            return int(event["port"])
    raise AssertionError("the plugin never reported its metrics port")


def test_serves_registers_reloads_on_sighup_and_stops_on_sigterm(sock_dir: Path, kubelet: FakeKubelet) -> None:
    config = sock_dir.parent / f"{sock_dir.name}-config.yaml"
    config.write_text("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
                      "    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n")
    env = {**os.environ, "DP_DISABLE_HEALTHCHECKS": "", "GRPC_VERBOSITY": "ERROR"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "labeller.cli", "--log-format", "json", "device-plugin", "--simulate", "dgx-h100",
         "--config", str(config), "--socket-dir", str(sock_dir), "--metrics-port", "0",
         "--metrics-bind", "127.0.0.1", "--health-recovery-seconds", "5"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        port = _port(proc)
        assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu.shared") == 24, 10)
        assert (sock_dir / "nvidia-gpu.shared.sock").exists()
        kubelet.admit("nvidia.com/gpu.shared", [1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        assert 'gpu_labeller_plugin_registrations_total{outcome="ok",resource="nvidia.com/gpu.shared"} 1.0' in metrics
        assert 'gpu_labeller_plugin_allocations_total{outcome="ok",resource="nvidia.com/gpu.shared"} 1.0' in metrics
        assert 'gpu_labeller_plugin_devices{health="Healthy",resource="nvidia.com/gpu.shared"} 24.0' in metrics
        config.write_text("version: v1\nsharing: {timeSlicing: {replicas: 3}}\n")  # a bad config ...
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)  # ... is refused: the plugin serves on with the old config
        assert proc.poll() is None and kubelet.allocatable("nvidia.com/gpu.shared") == 24
        config.write_text("version: v1\n")  # SIGHUP: the config is read again, sharing is gone
        proc.send_signal(signal.SIGHUP)
        assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 8, 10)
        assert kubelet.allocatable("nvidia.com/gpu.shared") == 0
        assert not (sock_dir / "nvidia-gpu.shared.sock").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        config.unlink(missing_ok=True)
    assert sorted(p.name for p in sock_dir.iterdir()) == ["kubelet.sock"]
