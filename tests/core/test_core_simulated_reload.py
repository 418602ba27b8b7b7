"""A profile file followed under a running process, and simulated roots that a SIGKILL leaves behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog

from labeller.host.machine import Host, NodeOptions, open_host
from vendors.nvidia.model import NvidiaInventory
from tests.builders import PATIENCE_S, wait_for
from tests.plugin.profile_files import l40s_node, time_slicing, write_yaml


def _gpus(node: Host) -> list[str]:
    """Probe the node; the UUIDs of the NVIDIA GPUs found."""
    nvidia = node.probe().part(NvidiaInventory)
    return [] if nvidia is None else [g.uuid for g in nvidia.gpus]


def test_probe_follows_the_profile_file(tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(1))
    with open_host(NodeOptions(simulate=str(profile))) as node:
        (uuid,) = _gpus(node)
        root, nvml = node.host_root, node.handles["nvidia"]
        assert nvml is not None
        os.utime(profile, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched, same contents
        nvml.set_lost(uuid, True)  # a test hook on the fake NVML module of this build
        assert _gpus(node) == []  # the lost GPU is left out: the same module, the hook still in force
        assert (node.host_root, node.handles["nvidia"]) == (root, nvml)
        write_yaml(profile, l40s_node(3))
        assert len(_gpus(node)) == 3
        assert node.host_root != root and node.handles["nvidia"] is not nvml
        assert root.is_dir()  # an earlier root stays until the node is closed: a reader may still use it
    assert not root.exists() and not node.host_root.exists()


def test_a_profile_that_breaks_keeps_the_previous_node(tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(1))
    with open_host(NodeOptions(simulate=str(profile))) as node, structlog.testing.capture_logs() as logs:
        profile.write_text("nvidia: {gpus: 3}\n")
        assert len(_gpus(node)) == 1 and len(_gpus(node)) == 1
        profile.unlink()
        assert len(_gpus(node)) == 1 and len(_gpus(node)) == 1
        write_yaml(profile, l40s_node(2))
        assert len(_gpus(node)) == 2
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["reason"] for e in errors] == ["bad-profile", "bad-profile"]  # once per change, not per probe
    assert "nvidia.driver_version" in errors[0]["error"] and "cannot read profile" in errors[1]["error"]


def test_the_profiles_config_follows_the_file_unless_config_is_given(tmp_path: Path) -> None:
    profile, config = tmp_path / "node.yaml", tmp_path / "config.yaml"
    write_yaml(profile, l40s_node(1, config=time_slicing(2)))
    write_yaml(config, time_slicing(5))
    with open_host(NodeOptions(simulate=str(profile))) as node, \
            open_host(NodeOptions(simulate=str(profile), config_path=config)) as given:
        assert node.config.sharing.replicas_for("nvidia.com/gpu") == 2
        write_yaml(profile, l40s_node(2, config=time_slicing(4)))
        node.probe(), given.probe()
        assert node.config.sharing.replicas_for("nvidia.com/gpu") == 4
        assert given.config.sharing.replicas_for("nvidia.com/gpu") == 5
        write_yaml(profile, l40s_node(3, config={"version": "v2"}))  # a bad config rejects the whole change
        assert len(_gpus(node)) == 2 and node.config.sharing.replicas_for("nvidia.com/gpu") == 4


def test_built_in_profiles_are_not_read_again() -> None:
    with open_host(NodeOptions(simulate="t4-time-slicing")) as node:
        assert node.simulation is None
        root = node.host_root
        node.probe()
        assert node.host_root == root


def _roots(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("gpu-labeller-sim-"))


def test_a_sigkilled_simulation_leaves_its_root_only_until_the_next_start(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"  # TMPDIR: where roots go instead of /dev/shm, so the test owns the directory
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "GRPC_VERBOSITY": "ERROR"}
    (scratch / f"gpu-labeller-sim-{os.getpid()}-alive").mkdir()  # a live process's root
    (scratch / "gpu-labeller-sim-unrelated").mkdir()  # not named by a pid: never ours to judge
    killed = subprocess.Popen([sys.executable, "-m", "labeller.cli", "device-plugin", "--simulate", "dgx-h100",
                               "--socket-dir", str(tmp_path / "sockets"), "--metrics-port", "0",
                               "--metrics-bind", "127.0.0.1"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: killed.poll() is not None or any(n.startswith(f"gpu-labeller-sim-{killed.pid}-")
                                                          for n in _roots(scratch)))
        assert killed.poll() is None, "the plugin exited before it was killed"
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    left = [n for n in _roots(scratch) if n.startswith(f"gpu-labeller-sim-{killed.pid}-")]
    assert len(left) == 1  # SIGKILL: no chance to clean up
    result = subprocess.run([sys.executable, "-m", "labeller.cli", "labels", "--simulate", "dgx-h100"], env=env,
                            capture_output=True, text=True, timeout=PATIENCE_S)
    assert result.returncode == 0, result.stderr
    assert _roots(scratch) == sorted([f"gpu-labeller-sim-{os.getpid()}-alive", "gpu-labeller-sim-unrelated"])


def test_the_daemon_follows_the_profile_file(tmp_path: Path) -> None:
    profile, features = tmp_path / "node.yaml", tmp_path / "features.d" / "gpu-labeller"
    write_yaml(profile, l40s_node(1))
    daemon = subprocess.Popen(
        [sys.executable, "-m", "labeller.cli", "run", "--node-name", "n1", "--output", "features-file",
         "--features-file", str(features), "--simulate", str(profile), "--interval", "0.2", "--start-jitter", "0",
         "--metrics-port", "0", "--metrics-bind", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_for_line(line: str) -> None:
        wait_for(lambda: daemon.poll() is not None or (features.exists() and line in features.read_text().splitlines()))
        assert daemon.poll() is None, f"the daemon exited before it wrote {line}"

    try:
        wait_for_line("nvidia.com/gpu.count=1")
        write_yaml(profile, l40s_node(2))  # no SIGHUP: the next probe reads the file again
        wait_for_line("nvidia.com/gpu.count=2")
    finally:
        daemon.terminate()
        daemon.wait(PATIENCE_S)
