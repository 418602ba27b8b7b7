"""``gpu-labeller inspect``, ``kubectl-inspect-gpushare`` and ``gpu-labeller scheduler-extender`` as
a user runs them: real processes against the fake API server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from labeller.model import gpushare
from tests.core.cli import error_line, gpu_labeller, in_process
from tests.builders import PATIENCE_S, wait_for
from tests.extender.conftest import mem_pod, share_node
from tests.fakes.apiserver import FakeApiServer
from tests.processes import LoggedProcess


def cluster(api: FakeApiServer) -> None:
    share_node(api, "n1")
    share_node(api, "n2", gpus=1, units=8)
    api.set_config_map("unhealthy-gpu-n1", {"gpus": "1"})
    mem_pod(api, "train", 6, node="n1", annotations={gpushare.ANN_IDX: "0", gpushare.ANN_ASSIGNED: "true"})
    mem_pod(api, "infer", 2, 1, namespace="ml", node="n1", annotations={gpushare.ANN_IDX: "0",
                                                                         gpushare.ANN_ASSIGNED: "false"})
    mem_pod(api, "done", 8, node="n2", phase="Succeeded", annotations={gpushare.ANN_IDX: "0"})


def test_inspect_prints_each_gpu_with_its_pods(api: FakeApiServer, kubeconfig: Path) -> None:
    cluster(api)
    result = gpu_labeller("inspect", "--kubeconfig", str(kubeconfig))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "NODE  GPU  TOTAL  USED  FREE       PODS",
        "n1    0    16     9     7          default/train (6), ml/infer (3, pending allocation)",
        "n1    1    16     0     unhealthy  -",
        "n2    0    8      0     8          -",
        "Allocated/Total GPU memory of healthy GPUs in cluster: 9/24 (37%)",
    ]


def test_inspect_one_node_as_json(api: FakeApiServer, kubeconfig: Path) -> None:
    cluster(api)
    result = gpu_labeller("inspect", "n2", "--format", "json", "--kubeconfig", str(kubeconfig))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"nodes": [{"name": "n2", "totalGPU": 8, "usedGPU": 0, "devs": [
        {"id": 0, "totalGPU": 8, "usedGPU": 0, "freeGPU": 8, "healthy": True, "pods": []}]}]}


def test_inspect_of_an_unknown_node_is_one_line_and_exit_2(api: FakeApiServer, kubeconfig: Path) -> None:
    api.create_node("plain")
    result = gpu_labeller("inspect", "plain", "--kubeconfig", str(kubeconfig))
    assert result.returncode == 2 and result.stdout == ""
    assert error_line(result) == ("Error: node plain: not found, or it shares no GPU memory "
                                  "(no aliyun.com/gpu-mem capacity)")


def test_inspect_without_credentials_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = in_process("inspect", env={**os.environ, "HOME": str(tmp_path), "KUBECONFIG": ""})
    assert result.returncode == 2
    assert error_line(result).startswith("Error: no Kubernetes credentials: no kubeconfig (no --kubeconfig")
    missing = in_process("inspect", "--kubeconfig", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "nope" in error_line(missing)


def test_inspect_of_an_unreachable_cluster_fails_with_one_line(api: FakeApiServer, kubeconfig: Path) -> None:
    api.forbid("list", "pods")
    result = gpu_labeller("inspect", "--kubeconfig", str(kubeconfig))
    assert result.returncode == 1
    assert error_line(result).startswith('Error: cannot read the cluster: 403 Forbidden: pods is forbidden')


@pytest.mark.parametrize("how", ["console script", "link to gpu-labeller"])
def test_kubectl_plugin_is_the_same_inspect(api: FakeApiServer, kubeconfig: Path, tmp_path: Path, how: str) -> None:
    cluster(api)
    bin_dir = os.path.dirname(sys.executable)
    if how == "console script":
        script = shutil.which("kubectl-inspect-gpushare", path=bin_dir)
    else:
        script = str(tmp_path / "kubectl-inspect-gpushare")
        os.symlink(str(shutil.which("gpu-labeller", path=bin_dir)), script)
    assert script is not None, "pip install -e . installs the kubectl plugin script"
    result = subprocess.run([script, "n1", "--kubeconfig", str(kubeconfig)], capture_output=True, text=True,
                            timeout=PATIENCE_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].startswith("n1    0    16     9     7")
    assert result.stderr == ""
    usage = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=PATIENCE_S)
    assert usage.stdout.startswith("Usage: kubectl inspect gpushare [OPTIONS] [NODE]")
    unknown = subprocess.run([script, "nowhere", "--kubeconfig", str(kubeconfig)], capture_output=True, text=True,
                             timeout=PATIENCE_S)
    assert unknown.returncode == 2 and error_line(unknown).startswith("Error: node nowhere: not found")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_scheduler_extender_serves_until_sigterm(api: FakeApiServer, kubeconfig: Path) -> None:
    share_node(api, "n1")
    pod = mem_pod(api, "p", 4)
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=PATIENCE_S) as answer:
                return answer.status == 200
        except OSError:
            return False

    with LoggedProcess("scheduler-extender", "--port", str(port), "--bind", "127.0.0.1", "--kubeconfig",
                       str(kubeconfig), "--policy", "spread") as process:
        wait_for(ready)
        body = json.dumps({"Pod": pod, "NodeNames": ["n1"]}).encode()
        request = urllib.request.Request(base + "/gpushare-scheduler/filter", data=body)
        with urllib.request.urlopen(request, timeout=PATIENCE_S) as answer:
            assert json.loads(answer.read())["NodeNames"] == ["n1"]
        assert process.stop() == 0
    assert process.count("stopped", reason="stop") == 1 and "Traceback" not in process.log


def test_scheduler_extender_bad_input_is_one_line_and_exit_2(api: FakeApiServer, kubeconfig: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = gpu_labeller("scheduler-extender", "--port", str(port), "--bind", "127.0.0.1",
                              "--kubeconfig", str(kubeconfig))
    assert result.returncode == 2
    assert error_line(result) == f"Error: --port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"
    missing = in_process("scheduler-extender", "--kubeconfig", "/nonexistent/kubeconfig")
    assert missing.returncode == 2 and "/nonexistent/kubeconfig" in error_line(missing)
    started = time.monotonic()
    policy = in_process("scheduler-extender", "--policy", "random")
    assert policy.returncode == 2 and "'random' is not one of 'binpack', 'spread'" in policy.stderr
    assert time.monotonic() - started < 30  # refused as it starts, not after trying to reach a cluster
