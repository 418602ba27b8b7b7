"""Credentials: ``connect`` says in one line why there are none, as a domain error (no click), and
the command line's root turns that into ``Error: <line>`` and exit code 2 for every command that
connects, the kubectl plugin included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from labeller.cli.root import LazyGroup
from labeller.cluster.connect import NoCredentials, connect
from labeller.base.errors import InputError
from tests.builders import config_map_volume
from tests.core.cli import error_line, in_process
from tests.fakes.apiserver import FakeApiServer

OUTSIDE_A_CLUSTER = ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "NODE_NAME")


@pytest.fixture
def outside_a_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, str]]:
    """No kubeconfig and no service account, here and in the environment of a child process."""
    for name in OUTSIDE_A_CLUSTER:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    yield dict(os.environ)


def test_a_missing_kubeconfig_is_named_with_what_is_wrong(tmp_path: Path) -> None:
    missing = tmp_path / "kubeconfig"
    with pytest.raises(NoCredentials) as raised:
        connect(str(missing))
    assert isinstance(raised.value, InputError)
    assert str(raised.value) == f"{missing}: cannot read kubeconfig: No such file or directory"


def test_no_credentials_at_all_suggests_a_kubeconfig_and_the_alternative(outside_a_cluster: dict[str, str]) -> None:
    with pytest.raises(NoCredentials) as raised:
        connect(None, alternative="--config-label '' to follow no node label")
    assert str(raised.value) == ("no Kubernetes credentials: no kubeconfig (no --kubeconfig, no KUBECONFIG, no "
                                 "~/.kube/config) and no in-cluster service account (Service host/port is not set); "
                                 "give --kubeconfig FILE (env KUBECONFIG), or --config-label '' to follow no node "
                                 "label")
    with pytest.raises(NoCredentials) as plain:
        connect(None)
    assert str(plain.value).endswith("; give --kubeconfig FILE (env KUBECONFIG)")


def test_a_client_with_its_observer_and_pool(api: FakeApiServer, kubeconfig: Path) -> None:
    api.create_node("n1")
    seen: list[tuple[str, int]] = []
    kube = connect(str(kubeconfig), observer=lambda verb, code: seen.append((verb, code)), pool_size=2)
    try:
        assert kube.list_node_names() == ["n1"]
    finally:
        kube.close()
    assert seen == [("list", 200)]


def test_the_command_line_prints_an_input_error_as_one_line_with_exit_2() -> None:
    @click.group(cls=LazyGroup)
    def root() -> None:
        """A root like gpu-labeller's."""

    @root.command()
    def bent() -> None:
        raise InputError("the widget is bent")

    result = CliRunner().invoke(root, ["bent"])
    assert (result.exit_code, result.output) == (2, "Error: the widget is bent\n")


@pytest.mark.parametrize("command", [["run", "--node-name", "n1", "--simulate", "dgx-h100"], ["cleanup", "--all-nodes"],
                                     ["inspect"], ["scheduler-extender", "--port", "0"], ["nodes"],
                                     ["match", "nvidia.com/gpu.present=true", "--kubeconfig"]],
                         ids=lambda command: command[0])
def test_every_command_that_connects_says_why_it_cannot_in_one_line(command: list[str], tmp_path: Path,
                                                                      outside_a_cluster: dict[str, str]) -> None:
    missing = tmp_path / "nope"
    args = [*command, str(missing)] if command[-1] == "--kubeconfig" else [*command, "--kubeconfig", str(missing)]
    result = in_process(*args, env=outside_a_cluster)
    assert result.returncode == 2
    assert error_line(result) == f"Error: {missing}: cannot read kubeconfig: No such file or directory"


def test_device_plugin_following_its_node_label_without_credentials(tmp_path: Path,
                                                                    outside_a_cluster: dict[str, str]) -> None:
    configs = config_map_volume(tmp_path / "configs", {"default": {"version": "v1"}})
    result = in_process("device-plugin", "--simulate", "dgx-h100", "--socket-dir", str(tmp_path), "--config-dir",
                        str(configs), "--node-name", "n1", env=outside_a_cluster)
    assert result.returncode == 2
    line = error_line(result)
    assert line.startswith("Error: no Kubernetes credentials: no kubeconfig (no --kubeconfig, no KUBECONFIG, no "
                           "~/.kube/config) and no in-cluster service account")
    assert line.endswith("or --config-label '' to follow no node label")


def test_the_kubectl_plugin_says_why_it_cannot_connect_in_one_line(tmp_path: Path,
                                                                   outside_a_cluster: dict[str, str]) -> None:
    """``kubectl inspect gpushare`` runs its command without the root group: the same one line."""
    script = tmp_path / "kubectl-inspect-gpushare"
    gpu_labeller_script = shutil.which("gpu-labeller", path=os.path.dirname(sys.executable))
    assert gpu_labeller_script is not None
    script.symlink_to(gpu_labeller_script)
    missing = tmp_path / "nope"
    result = subprocess.run([str(script), "--kubeconfig", str(missing)], capture_output=True, text=True, timeout=60,
                            env=outside_a_cluster, check=False)
    assert result.returncode == 2
    assert error_line(result) == f"Error: {missing}: cannot read kubeconfig: No such file or directory"
    nowhere = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, env=outside_a_cluster,
                             check=False)
    assert nowhere.returncode == 2
    assert error_line(nowhere).startswith("Error: no Kubernetes credentials: no kubeconfig (no --kubeconfig")
