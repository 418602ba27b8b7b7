"""Bad input, as a user meets it: one line on stderr naming the file and the problem, exit code 2.

Config files, profiles (and the paths and templates inside them), kubeconfigs, node names,
credentials, durations and ports, each through the CLI (in this process where only what it prints counts).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.core.cli import error_line, gpu_labeller, in_process


BINARY = b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe\x00garbage"
TEMPLATE_GPU = ('{{name: Tesla T4, uuid: "{uuid}", pci_bus_id: "0000:{{i:02x}}:00.0", memory_bytes: 15843721216, '
                "repeat: 2}}")


def nvidia_profile(tmp_path: Path, uuid: str) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text("nvidia:\n  driver_version: '550.54.15'\n  cuda_driver_version: 12040\n"
                    f"  gpus:\n    - {TEMPLATE_GPU.format(uuid=uuid)}\n")
    return path


def refused(*args: str, env: dict[str, str] | None = None) -> str:
    """Run the CLI, check that it exited 2 with nothing on stdout, and return its one error line."""
    result = in_process(*args, env=env)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == ""
    return error_line(result)


# --- files that are not text ---------------------------------------------------------------------


def test_a_binary_config_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_bytes(BINARY)
    line = refused("labels", "--simulate", "dgx-h100", "--config", str(config))
    assert line == f"Error: {config}: not a config file: not UTF-8 text (byte 0xff at offset 10)"


def test_a_binary_profile_file(tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    profile.write_bytes(BINARY)
    line = refused("probe", "--simulate", str(profile))
    assert line == f"Error: {profile}: not a profile: not UTF-8 text (byte 0xff at offset 10)"


# --- config documents ----------------------------------------------------------------------------


def test_a_config_without_version(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("flags:\n  migStrategy: mixed\n")
    line = refused("labels", "--simulate", "dgx-h100", "--config", str(config))
    assert line == f"Error: {config}: version: required; add 'version: v1' (the only version)"


def test_a_profiles_config_section_without_version(tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    profile.write_text("config:\n  flags: {migStrategy: mixed}\n")
    assert refused("labels", "--simulate", str(profile)) == (
        f"Error: {profile}: config: version: required; add 'version: v1' (the only version)")


@pytest.mark.parametrize(("devices", "problem"), [
    ("[0, 9]", "sharing.timeSlicing.resources[0].devices: no device 9 in nvidia.com/gpu on this node (8 there: "),
    ("12", "sharing.timeSlicing.resources[0].devices: 12 devices to share, but nvidia.com/gpu has 8 on this node"),
])
def test_a_sharing_config_naming_devices_the_node_lacks(tmp_path: Path, devices: str, problem: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
                      f"      - {{name: nvidia.com/gpu, replicas: 4, devices: {devices}}}\n")
    for command in ("labels", "resources"):
        line = refused(command, "--simulate", "dgx-h100", "--config", str(config))
        assert line.startswith(f"Error: {config}: {problem}")


def test_mps_beside_time_slicing_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  mps:\n    resources:\n      - {name: nvidia.com/gpu, replicas: 4}\n"
                      "  timeSlicing:\n    resources:\n      - {name: nvidia.com/gpu, replicas: 2}\n")
    line = refused("labels", "--simulate", "dgx-h100", "--config", str(config))
    assert line.startswith(f"Error: {config}: sharing: timeSlicing and mps are both set")


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("config.yaml", "version: v1\nversion: v1\n", "not valid YAML at line 2: duplicate key 'version'"),
    ("node.yaml", "name: a\nmachine: b\nname: c\n", "not valid YAML at line 3: duplicate key 'name'"),
    ("node.json", '{"name": "a", "name": "b"}', "not valid JSON: duplicate key 'name'"),
])
def test_a_key_given_twice(tmp_path: Path, name: str, text: str, problem: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    option = "--config" if name.startswith("config") else "--simulate"
    args = ["labels", option, str(path)] + (["--simulate", "dgx-h100"] if option == "--config" else [])
    assert refused(*args) == f"Error: {path}: {problem}"


# --- paths and templates inside a profile --------------------------------------------------------


def amd_profile(tmp_path: Path, sysfs: str) -> Path:
    path = tmp_path / "profiles" / "node.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"amd:\n  sysfs: {json.dumps(sysfs)}\n")
    return path


@pytest.mark.parametrize("sysfs", ["../..", "../outside", "/etc", "trees/../../outside"])
def test_a_sysfs_path_that_leaves_the_profiles_directory(tmp_path: Path, sysfs: str) -> None:
    (tmp_path / "outside").mkdir()
    profile = amd_profile(tmp_path, sysfs)
    line = refused("labels", "--simulate", str(profile))
    assert line.startswith(f"Error: {profile}: amd.sysfs: {sysfs!r} must name a directory inside the profile's "
                           "directory")


def test_a_sysfs_tree_that_is_a_symlink_out(tmp_path: Path) -> None:
    profile = amd_profile(tmp_path, "tree")
    (profile.parent / "tree").symlink_to("/etc")
    line = refused("labels", "--simulate", str(profile))
    assert line == (f"Error: {profile}: amd.sysfs: 'tree' leads outside {profile.parent} "
                    f"(through {profile.parent / 'tree'})")


def test_a_sysfs_tree_with_a_symlink_out_inside_it(tmp_path: Path) -> None:
    profile = amd_profile(tmp_path, "tree")
    nodes = profile.parent / "tree" / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
    nodes.mkdir(parents=True)
    (nodes / "0").symlink_to("/etc")
    line = refused("labels", "--simulate", str(profile))
    assert line == f"Error: {profile}: amd.sysfs: 'tree' leads outside {profile.parent} (through {nodes / '0'})"


def test_a_sysfs_tree_with_a_broken_symlink(tmp_path: Path) -> None:
    profile = amd_profile(tmp_path, "tree")
    (profile.parent / "tree").mkdir()
    (profile.parent / "tree" / "class").symlink_to("missing")
    line = refused("labels", "--simulate", str(profile))
    assert line == f"Error: {profile}: amd.sysfs: 'tree' has a broken symlink: {profile.parent / 'tree' / 'class'}"


@pytest.mark.parametrize("uuid", ["GPU-{i.__class__}", "GPU-{i[0]}", "GPU-{i.__init__.__globals__}", "GPU-{i!r}",
                                  "GPU-{0}", "GPU-{}", "GPU-{i:{i}}", "GPU-{gpu}"])
def test_a_template_reaches_only_its_fields(tmp_path: Path, uuid: str) -> None:
    profile = nvidia_profile(tmp_path, uuid)
    line = refused("labels", "--simulate", str(profile))
    assert line == (f"Error: {profile}: nvidia.gpus[0].uuid: bad template {uuid!r}: only {{i}} with an optional "
                    "format spec (such as {i:02x}) may be used")


def test_a_template_with_a_format_spec_still_works(tmp_path: Path) -> None:
    result = gpu_labeller("probe", "--simulate", str(nvidia_profile(tmp_path, "GPU-{i:04x}")))
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)["nvidia"]["gpus"]
    assert [gpu["uuid"] for gpu in gpus] == ["GPU-0000", "GPU-0001"]


# --- run and cleanup: node name, credentials, kubeconfig, port, durations --------------------------


@pytest.fixture
def clean_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of a shell outside any cluster: no node name, no kubeconfig (nor ~/.kube/config),
    no service host."""
    yield {**{k: v for k, v in os.environ.items()
              if k not in ("NODE_NAME", "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")},
           "HOME": str(tmp_path_factory.mktemp("home"))}


def test_run_without_a_node_name_mentions_node_name(clean_env: dict[str, str]) -> None:
    line = refused("run", "--simulate", "dgx-h100", env=clean_env)
    assert line == ("Error: no node name: give --node-name NAME or set NODE_NAME "
                    "(a DaemonSet sets it from spec.nodeName)")


def test_run_without_credentials_suggests_a_kubeconfig_or_the_features_file(clean_env: dict[str, str]) -> None:
    line = refused("run", "--node-name", "n1", "--simulate", "dgx-h100", env=clean_env)
    assert line.startswith("Error: no Kubernetes credentials: no kubeconfig (no --kubeconfig, no KUBECONFIG, no "
                           "~/.kube/config) and no in-cluster service account")
    assert line.endswith("give --kubeconfig FILE (env KUBECONFIG), or use --output features-file without --events, "
                         "which needs none")
    cleanup = refused("cleanup", "--all-nodes", env=clean_env)
    assert cleanup.endswith("; give --kubeconfig FILE (env KUBECONFIG)")


KUBECONFIG_OK = """apiVersion: v1
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", certificate-authority-data: "%s"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize(("content", "problem"), [
    (BINARY, "not a kubeconfig: not UTF-8 text"),
    (b"clusters: [unclosed\n", "not valid YAML at line 2"),
    (b"- 1\n- 2\n", "not a kubeconfig: a list, not a mapping"),
    (b"", "not a kubeconfig: the file is empty"),
    ((KUBECONFIG_OK % "!!!notbase64").encode(), "malformed kubeconfig (Error: Invalid base64-encoded string"),
], ids=["binary", "yaml", "list", "empty", "base64"])
def test_a_malformed_kubeconfig_for_run_and_cleanup(tmp_path: Path, content: bytes, problem: str,
                                                    clean_env: dict[str, str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)
    for command in (["run", "--node-name", "n1", "--simulate", "dgx-h100"], ["cleanup", "--all-nodes"]):
        line = refused(*command, "--kubeconfig", str(kubeconfig), env=clean_env)
        assert line.startswith(f"Error: {kubeconfig}: {problem}"), line


def test_a_missing_kubeconfig_file(tmp_path: Path, clean_env: dict[str, str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    for command in (["run", "--node-name", "n1", "--simulate", "dgx-h100"], ["cleanup", "--node", "n1"]):
        line = refused(*command, "--kubeconfig", str(kubeconfig), env=clean_env)
        assert line == f"Error: {kubeconfig}: cannot read kubeconfig: No such file or directory"


def features_file_run(tmp_path: Path, *extra: str) -> list[str]:
    return ["run", "--node-name", "n1", "--simulate", "dgx-h100", "--output", "features-file",
            "--features-file", str(tmp_path / "gpu-labeller"), *extra]


def test_run_with_its_metrics_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(*features_file_run(tmp_path, "--metrics-bind", "127.0.0.1", "--metrics-port", str(port)))
    assert line == f"Error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"


@pytest.mark.parametrize(("interval", "expiry_s"), [("90", 360), ("90s", 360), ("2m", 480), ("500ms", 300)])
def test_run_reads_durations_in_any_unit(tmp_path: Path, interval: str, expiry_s: int) -> None:
    # The features.d file expires after max(4 x interval, 300 s): the interval shows through it.
    result = gpu_labeller(*features_file_run(tmp_path, "--once", "--interval", interval, "--start-jitter", "10ms"))
    assert result.returncode == 0, result.stderr
    stamp = next(line.split("=", 1)[1] for line in (tmp_path / "gpu-labeller").read_text().splitlines()
                 if line.startswith("# +expiry-time="))
    left = datetime.fromisoformat(stamp) - datetime.now(UTC)
    assert timedelta(seconds=expiry_s - 30) < left <= timedelta(seconds=expiry_s)


@pytest.mark.parametrize("option", ["--interval", "--start-jitter"])
def test_run_refuses_a_time_that_is_not_a_duration(tmp_path: Path, option: str) -> None:
    result = in_process(*features_file_run(tmp_path, "--once", option, "soon"))
    assert result.returncode == 2 and not (tmp_path / "gpu-labeller").exists()
    assert f"Invalid value for '{option}': 'soon' is not a duration like 60, 60s, 500ms or 2m" in result.stderr


@pytest.mark.parametrize("asked", ["dgx-h10", "DGX-H100", "dgx_h100"])
def test_a_mistyped_profile_name_suggests_the_built_in_one(asked: str) -> None:
    result = in_process("labels", "--simulate", asked)
    line = error_line(result)
    assert result.returncode == 2 and f"Error: {asked}: no such profile" in line
    assert line.endswith("did you mean dgx-h100? (gpu-labeller profiles lists them all)"), line


def test_a_profile_name_like_none_lists_the_built_in_ones() -> None:
    result = in_process("labels", "--simulate", "qqqq")
    assert result.returncode == 2 and "(built-in: a100-mig-single, " in error_line(result)
