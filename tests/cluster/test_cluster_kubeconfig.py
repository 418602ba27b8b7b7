"""One kubeconfig rule for every command, as kubectl's: --kubeconfig, else the files KUBECONFIG lists
(merged: the first to set a name wins, current-context from the first that sets one), else
~/.kube/config, else the in-cluster service account (labeller.cluster.connect). Each command that
talks to the cluster is run in-process and shown to find its credentials by it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from labeller.cli.root import main
from labeller.cluster.connect import NoCredentials, find_kubeconfig
from labeller.cli.commands.completion import complete_node_names
from tests.builders import config_map_volume
from tests.fakes.apiserver import FakeApiServer

DEAD_SERVER = "https://127.0.0.1:1"  # nothing listens on port 1: a file naming it was not the one used


def kubeconfig_file(path: Path, *, current: str | None = None, clusters: dict[str, str] | None = None,
                    users: tuple[str, ...] = (), contexts: dict[str, tuple[str, str]] | None = None) -> Path:
    """A kubeconfig: ``clusters`` name -> server, ``contexts`` name -> (cluster, user)."""
    document: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    if current is not None:
        document["current-context"] = current
    if clusters:
        document["clusters"] = [{"name": n, "cluster": {"server": s}} for n, s in clusters.items()]
    if users:
        document["users"] = [{"name": n, "user": {"token": f"token-of-{n}"}} for n in users]
    if contexts:
        document["contexts"] = [{"name": n, "context": {"cluster": c, "user": u}} for n, (c, u) in contexts.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A HOME of our own (no ~/.kube/config unless a test writes one), no KUBECONFIG, no service account."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "NODE_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    yield tmp_path / "home"


def split_kubeconfig(api: FakeApiServer, directory: Path) -> str:
    """KUBECONFIG for the fake API server as three files, merged as kubectl merges them: a missing one
    (skipped), one that sets only current-context, and one that sets another current-context, a dead
    cluster under the same name and the real one. Only kubectl's merge (first wins) reaches the server."""
    first = kubeconfig_file(directory / "first", current="fake")
    second = kubeconfig_file(directory / "second", current="dead", clusters={"fake": api.url, "dead": DEAD_SERVER},
                             users=("labeller",), contexts={"fake": ("fake", "labeller"), "dead": ("dead", "labeller")})
    third = kubeconfig_file(directory / "third", clusters={"fake": DEAD_SERVER})
    return ":".join([str(directory / "missing"), str(first), str(second), str(third)])


# --- the rule ------------------------------------------------------------------------------------

def test_kubeconfig_files_merge_as_kubectl_merges_them(api: FakeApiServer, tmp_path: Path, home: Path) -> None:
    found = find_kubeconfig(None, {"KUBECONFIG": split_kubeconfig(api, tmp_path)})
    assert found.files == (tmp_path / "first", tmp_path / "second", tmp_path / "third")
    assert found.document is not None
    assert found.document["current-context"] == "fake"
    assert {c["name"]: c["cluster"]["server"] for c in found.document["clusters"]} == {"fake": api.url,
                                                                                       "dead": DEAD_SERVER}


def test_the_flag_beats_kubeconfig_which_beats_the_home_file(tmp_path: Path, home: Path) -> None:
    flag = kubeconfig_file(tmp_path / "flag", current="a", clusters={"a": "https://flag"})
    env = kubeconfig_file(tmp_path / "env", current="a", clusters={"a": "https://env"})
    kubeconfig_file(home / ".kube" / "config", current="a", clusters={"a": "https://home"})

    def server(flag_value: str | None, environ: dict[str, str]) -> str:
        document = find_kubeconfig(flag_value, environ).document
        assert document is not None
        return str(document["clusters"][0]["cluster"]["server"])

    assert server(str(flag), {"KUBECONFIG": str(env)}) == "https://flag"
    assert server(None, {"KUBECONFIG": str(env)}) == "https://env"
    assert server(None, {}) == "https://home"


def test_nothing_found_is_the_in_cluster_service_account(tmp_path: Path, home: Path) -> None:
    assert find_kubeconfig(None, {}).document is None
    empty = tmp_path / "empty"
    empty.write_text("")
    only_missing = find_kubeconfig(None, {"KUBECONFIG": f"{tmp_path / 'nope'}:{empty}"})
    assert only_missing.document is None  # kubectl skips missing and empty files, then asks the pod
    with pytest.raises(NoCredentials, match=f"^{empty}: not a kubeconfig: the file is empty$"):
        find_kubeconfig(str(empty), {})  # a file named on the command line must be one


def test_relative_paths_are_read_from_the_directory_of_the_file_that_names_them(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "conf" / "kubeconfig"
    path.parent.mkdir()
    path.write_text(json.dumps({
        "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://x", "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": {"client-certificate": "/abs/cert", "client-key": "keys/key",
                                         "tokenFile": "token", "exec": {"command": "./bin/login"}}},
                  {"name": "v", "user": {"exec": {"command": "kubelogin"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    document = find_kubeconfig(str(path), {}).document
    assert document is not None
    assert document["clusters"][0]["cluster"]["certificate-authority"] == str(tmp_path / "conf" / "ca.crt")
    user = document["users"][0]["user"]
    assert (user["client-certificate"], user["client-key"], user["tokenFile"], user["exec"]["command"]) == (
        "/abs/cert", str(tmp_path / "conf" / "keys" / "key"), str(tmp_path / "conf" / "token"),
        str(tmp_path / "conf" / "bin" / "login"))
    assert document["users"][1]["user"]["exec"]["command"] == "kubelogin"  # looked up on PATH


def test_a_file_that_is_not_a_kubeconfig_is_named(tmp_path: Path, home: Path) -> None:
    listed = tmp_path / "list"
    listed.write_text("- 1\n")
    with pytest.raises(NoCredentials, match=f"^{listed}: not a kubeconfig: a list, not a mapping$"):
        find_kubeconfig(None, {"KUBECONFIG": str(listed)})
    bad = tmp_path / "bad"
    bad.write_text("clusters: {a: 1}\n")
    with pytest.raises(NoCredentials, match="clusters must be a list of entries with a name"):
        find_kubeconfig(str(bad), {})


# --- every command ---------------------------------------------------------------------------------

def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--log-format", "console", *args], env=env)


def gpu_node(api: FakeApiServer) -> None:
    api.create_node("n1", {"nvidia.com/gpu.present": "true"})


SHORT_COMMANDS = {  # command line, what it must have read from the fake API server
    "run": (["run", "--node-name", "n1", "--simulate", "dgx-h100", "--once", "--start-jitter", "0",
             "--metrics-port", "0"], "nodes"),
    "cleanup": (["cleanup", "--node", "n1"], "nodes"),
    "nodes": (["nodes"], "nodes"),
    "inspect": (["inspect"], "pods"),
    "match": (["match", "nvidia.com/gpu.present=true", "--cluster"], "nodes"),
}


@pytest.mark.parametrize("where", ["KUBECONFIG", "~/.kube/config"])
@pytest.mark.parametrize("name", sorted(SHORT_COMMANDS))
def test_each_one_shot_command_finds_the_cluster_by_the_rule(name: str, where: str, api: FakeApiServer,
                                                             tmp_path: Path, home: Path) -> None:
    gpu_node(api)
    args, resource = SHORT_COMMANDS[name]
    env: dict[str, str] = {}
    if where == "KUBECONFIG":
        env["KUBECONFIG"] = split_kubeconfig(api, tmp_path)
    else:
        (home / ".kube").mkdir(parents=True)
        api.write_kubeconfig(home / ".kube" / "config")
    result = invoke(*args, env=env)
    assert result.exit_code == 0, result.output
    assert api.log.count(resource=resource) > 0


def test_node_name_completion_finds_the_cluster_by_the_rule(api: FakeApiServer, tmp_path: Path, home: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_node(api)
    monkeypatch.setenv("KUBECONFIG", split_kubeconfig(api, tmp_path))
    command = main.get_command(click.Context(main), "nodes")
    assert command is not None
    ctx = click.Context(command, info_name="nodes")
    assert [item.value for item in complete_node_names(ctx, command.params[0], "")] == ["n1"]


def long_running(tmp_path: Path) -> dict[str, list[str]]:
    """The serving commands, each stopped where it first needs the cluster: they report the kubeconfig
    they found, before they serve anything."""
    configs = str(config_map_volume(tmp_path / "configs", {"default": {"version": "v1"}}))
    follows = ["--simulate", "dgx-h100", "--config-dir", configs, "--node-name", "n1"]
    return {
        "device-plugin": ["device-plugin", *follows, "--socket-dir", str(tmp_path)],
        "mps-control-daemon": ["mps-control-daemon", *follows, "--metrics-port", "0"],
        "dra-plugin": ["dra-plugin", "--simulate", "dgx-h100", "--node-name", "n1", "--plugins-dir",
                       str(tmp_path / "plugins"), "--registry-dir", str(tmp_path / "registry")],
        "scheduler-extender": ["scheduler-extender", "--port", "0"],
        "run": ["run", "--simulate", "dgx-h100", "--node-name", "n1", "--metrics-port", "0"],
    }


@pytest.mark.parametrize("where", ["KUBECONFIG", "~/.kube/config"])
@pytest.mark.parametrize("name", ["device-plugin", "mps-control-daemon", "dra-plugin", "scheduler-extender", "run"])
def test_each_serving_command_finds_its_kubeconfig_by_the_rule(name: str, where: str, tmp_path: Path,
                                                               home: Path) -> None:
    """A kubeconfig whose current context does not exist: the command names the file the rule found."""
    broken = kubeconfig_file((home / ".kube" / "config") if where != "KUBECONFIG" else tmp_path / "kc",
                             current="nowhere", clusters={"a": DEAD_SERVER})
    env = {"KUBECONFIG": f"{tmp_path / 'missing'}:{broken}"} if where == "KUBECONFIG" else {}
    result = invoke(*long_running(tmp_path)[name], env=env)
    assert result.exit_code == 2, result.output
    line = result.stderr.splitlines()[-1]
    assert line.startswith(f"Error: {broken}: ") and "nowhere" in line, line
