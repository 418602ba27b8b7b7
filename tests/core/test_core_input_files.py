"""Files the CLI reads cannot exhaust it: a FIFO, a device or a huge file is refused before it is read,
and a document nested too deep or holding a huge integer is one line of error, exit 2.

Every command reads configs, profiles, kubeconfigs and the features file through one bounded reader
(``labeller.model.documents.read_limited``), so a few commands stand for all of them.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from tests.core.cli import error_line, gpu_labeller


MEMORY_CAP = 2 << 30  # bytes of address space the CLI may map here: a reader that grows without end fails fast


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def refused(*args: str, env: dict[str, str] | None = None) -> str:
    """Run the CLI (its memory capped, so a runaway read cannot take the machine), check that it exited
    2 with nothing on stdout, and return its one error line."""
    result = gpu_labeller(*args, preexec_fn=_capped, env=env)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert result.stdout == ""
    return error_line(result)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    return path


def test_a_fifo_as_config_is_refused_not_waited_on(fifo: Path) -> None:
    line = refused("labels", "--simulate", "dgx-h100", "--config", str(fifo))
    assert line == f"Error: {fifo}: not a config file: a FIFO, not a regular file"


def test_a_device_as_config_is_refused_not_read() -> None:
    line = refused("labels", "--simulate", "dgx-h100", "--config", "/dev/zero")
    assert line == "Error: /dev/zero: not a config file: a character device, not a regular file"


def test_a_config_over_one_mebibyte_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n" + ("#" * 1023 + "\n") * 1024)
    line = refused("resources", "--simulate", "dgx-h100", "--config", str(config))
    assert line == f"Error: {config}: not a config file: larger than the limit of 1 MiB"


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_document_nested_too_deep_is_one_line(tmp_path: Path, suffix: str) -> None:
    config = tmp_path / f"config{suffix}"
    config.write_text('{"version": "v1", "imex": ' + "[" * 100_000 + "]" * 100_000 + "}")
    line = refused("labels", "--simulate", "dgx-h100", "--config", str(config))
    assert line.startswith(f"Error: {config}: "), line
    assert "nesting depth" in line or "nested more than 64 levels deep" in line, line


def test_a_document_nested_65_levels_is_refused_at_the_stated_bound(tmp_path: Path) -> None:
    profile = tmp_path / "node.json"
    profile.write_text('{"config": {"version": "v1", "imex": ' + "[" * 63 + "]" * 63 + "}}")
    assert refused("probe", "--simulate", str(profile)) == f"Error: {profile}: nested more than 64 levels deep"


@pytest.mark.parametrize(("suffix", "digits"), [(".yaml", 4400), (".json", 4400), (".yaml", 30)])
def test_a_huge_integer_is_one_line(tmp_path: Path, suffix: str, digits: int) -> None:
    config = tmp_path / f"config{suffix}"
    config.write_text('{"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": '
                      + "1" * digits + "}]}}}")
    line = refused("resources", "--simulate", "dgx-h100", "--config", str(config))
    assert line.startswith(f"Error: {config}: an integer "), line
    assert line.endswith("the largest allowed is 9223372036854775807"), line


def test_a_fifo_as_affinity_file_is_refused(fifo: Path) -> None:
    line = refused("match", "--affinity", str(fifo), "--simulate", "dgx-h100")
    assert line == f"Error: {fifo}: not a node affinity file: a FIFO, not a regular file"


def test_a_fifo_as_kubeconfig_is_refused_not_waited_on(fifo: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    for command in (["cleanup", "--node", "n1"], ["run", "--node-name", "n1", "--simulate", "dgx-h100"]):
        line = refused(*command, "--kubeconfig", str(fifo), env=env)
        assert line == f"Error: {fifo}: not a kubeconfig: a FIFO, not a regular file"


def test_a_kubeconfig_over_one_mebibyte_is_refused(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n" + ("#" * 1023 + "\n") * 1024)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    line = refused("cleanup", "--node", "n1", "--kubeconfig", str(kubeconfig), env=env)
    assert line == f"Error: {kubeconfig}: not a kubeconfig: larger than the limit of 1 MiB"


def test_a_fifo_as_the_features_file_is_refused_not_waited_on(fifo: Path) -> None:
    line = refused("run", "--node-name", "n1", "--simulate", "dgx-h100", "--output", "features-file",
                   "--features-file", str(fifo), "--once", "--start-jitter", "10ms")
    assert line == f"Error: --features-file {fifo}: a FIFO, not a regular file"


@pytest.mark.parametrize("name", ["", "Node_1", "-a", "a" * 254])
def test_cleanup_of_a_node_name_that_cannot_be_is_bad_input(name: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    line = refused("cleanup", "--node", name, env=env)
    assert line == (f"Error: --node {name!r}: not a node name (lowercase letters, digits, '-' and '.', "
                    "at most 253 characters)")
