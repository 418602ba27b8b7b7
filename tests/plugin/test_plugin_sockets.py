"""Where the plugins put their sockets: a directory whose parent is missing is refused at start, and a
socket path something else took is one error line and retried with backoff, never a traceback storm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.builders import PATIENCE_S, stays_true, wait_for
from tests.fakes.kubelet import FakeKubelet
from tests.plugin.conftest import running_plugin

GPU = "nvidia.com/gpu"
TAKEN = "cannot create the plugin socket; retrying"


def _events(logs: list[dict[str, Any]], name: str) -> int:
    return sum(e["event"] == name for e in logs)


def test_a_directory_at_the_socket_path_is_one_error_line_and_a_retry_with_backoff(sock_dir: Path,
                                                                                     kubelet: FakeKubelet) -> None:
    taken = sock_dir / "nvidia-gpu.sock"
    taken.mkdir()
    with structlog.testing.capture_logs() as logs, running_plugin(sock_dir, "dgx-h100") as running:
        wait_for(lambda: _events(logs, TAKEN) == 1)
        problem = next(e for e in logs if e["event"] == TAKEN)
        assert problem["socket"] == str(taken) and problem["log_level"] == "error"
        assert problem["error"] == f"{taken}: a directory, not a socket; remove it"
        # the supervisor ticks every 50 ms: a line per tick would be 20 a second
        stays_true(lambda: _events(logs, TAKEN) == 1 and not any("exc_info" in e for e in logs), seconds=1.0)
        assert not running.plugin.ready
        taken.rmdir()
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)  # the next retry, within 5 s
        wait_for(lambda: _events(logs, "plugin socket created") == 1)
    assert not any("exc_info" in e for e in logs)


def _refused(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    result = subprocess.run([sys.executable, "-m", "labeller.cli", *args, "--metrics-port", "0"], capture_output=True,
                            text=True, timeout=PATIENCE_S, env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_socket_dir_whose_parent_is_missing_is_one_line_and_exit_2(tmp_path: Path) -> None:
    socket_dir = tmp_path / "missing" / "device-plugins"
    line = _refused("device-plugin", "--simulate", "dgx-h100", "--socket-dir", str(socket_dir))
    assert line == f"Error: --socket-dir {socket_dir}: directory {socket_dir.parent} does not exist"
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("flag", ["--plugins-dir", "--registry-dir"])
def test_a_dra_plugin_dir_whose_parent_is_missing_is_one_line_and_exit_2(tmp_path: Path, flag: str) -> None:
    directory = tmp_path / "missing" / "plugins"
    dirs = {"--plugins-dir": str(tmp_path / "plugins"), "--registry-dir": str(tmp_path / "plugins_registry"),
            flag: str(directory)}
    line = _refused("dra-plugin", "--node-name", "n1", "--simulate", "dgx-h100",
                    *(a for kv in dirs.items() for a in kv))
    assert line == f"Error: {flag} {directory}: directory {directory.parent} does not exist"
    assert not (tmp_path / "missing").exists()
