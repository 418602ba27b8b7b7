"""The exit-code table every command follows: 0 ok, 1 runtime or cluster failure, 2 bad input, 130
interrupted (tests/core/test_core_interrupt.py). An API server that cannot be reached is a cluster
failure: one line naming the server and what failed, exit 1, whatever the command."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from labeller.cluster.kube import Kube, KubeError, Unavailable
from labeller.base.errors import ClusterError
from tests.core.cli import error_line, gpu_labeller, in_process


OK, FAILURE, BAD_INPUT = 0, 1, 2


def closed_port() -> int:
    """A local port nothing listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unreachable_kubeconfig(tmp_path: Path) -> tuple[Path, str]:
    server = f"http://127.0.0.1:{closed_port()}"
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path, server


def test_an_unreachable_api_server_is_one_line_naming_the_server(tmp_path: Path) -> None:
    kubeconfig, server = unreachable_kubeconfig(tmp_path)
    kube = Kube(str(kubeconfig))
    with pytest.raises(Unavailable) as raised:
        kube.list_nodes()
    assert isinstance(raised.value, KubeError) and isinstance(raised.value, ClusterError)
    assert str(raised.value) == f"cannot reach the API server at {server}: connection refused"


# Commands that read the cluster and print what they found.
READERS = [["nodes"], ["match", "nvidia.com/gpu.present"], ["inspect"]]


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_command_that_reads_the_cluster_it_cannot_reach_exits_1_with_one_line(command: list[str],
                                                                                  tmp_path: Path) -> None:
    kubeconfig, server = unreachable_kubeconfig(tmp_path)
    result = gpu_labeller(*command, "--kubeconfig", str(kubeconfig))
    assert result.returncode == FAILURE and result.stdout == ""
    line = error_line(result)  # ``inspect`` says what it was doing first: "Error: cannot read the cluster: ..."
    assert line.endswith(f"cannot reach the API server at {server}: connection refused"), line


def test_cleanup_of_a_cluster_it_cannot_reach_exits_1_with_one_line(tmp_path: Path) -> None:
    kubeconfig, server = unreachable_kubeconfig(tmp_path)
    result = gpu_labeller("--log-format", "console", "cleanup", "--node", "n1", "--kubeconfig", str(kubeconfig))
    assert result.returncode == FAILURE
    [line] = result.stderr.splitlines()
    assert f"cannot reach the API server at {server}: connection refused" in line and "Traceback" not in line


def test_run_once_against_a_cluster_it_cannot_reach_exits_1_naming_the_server(tmp_path: Path) -> None:
    kubeconfig, server = unreachable_kubeconfig(tmp_path)
    result = gpu_labeller("--log-format", "json", "run", "--once", "--node-name", "n1", "--simulate", "dgx-h100",
                          "--kubeconfig", str(kubeconfig), "--metrics-port", "0")
    assert result.returncode == FAILURE
    errors = [json.loads(line) for line in result.stderr.splitlines() if '"error"' in line]
    assert any(entry.get("error") == f"cannot reach the API server at {server}: connection refused"
               for entry in errors), result.stderr
    assert "HTTPConnectionPool" not in result.stderr and "Max retries" not in result.stderr


@pytest.mark.parametrize("command", [["labels", "--simulate", "dgx-h100"], ["profiles"]], ids=lambda c: c[0])
def test_a_dry_run_command_that_works_exits_0(command: list[str]) -> None:
    assert in_process(*command).returncode == OK


@pytest.mark.parametrize("command", [["labels", "--simulate", "no-such-profile"],
                                     ["nodes", "--kubeconfig", "/nonexistent/kubeconfig"],
                                     ["run", "--once", "--node-name", ""]],
                         ids=lambda c: c[0])
def test_bad_input_exits_2_with_one_line(command: list[str]) -> None:
    result = in_process(*command)
    assert result.returncode == BAD_INPUT and error_line(result)
