"""NVIDIA's device-plugin flags and env vars on ``gpu-labeller device-plugin`` (labeller.model.upstream)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import PATIENCE_S
from tests.plugin.profile_files import l40s_node, time_slicing, write_yaml
from tests.plugin.test_plugin_cli import PluginProcess


def driverless_node(tmp_path: Path) -> tuple[Path, Path]:
    """A profile whose NVML is missing, and a config file that says failOnInitError: false."""
    profile, config = tmp_path / "node.yaml", tmp_path / "config.yaml"
    write_yaml(profile, l40s_node(2, nvml_error="library_not_found"))
    write_yaml(config, time_slicing(2, fail_on_init_error=False))
    return profile, config


@pytest.mark.parametrize(("args", "env"), [(["--fail-on-init-error"], {}), ([], {"FAIL_ON_INIT_ERROR": "true"})],
                         ids=["flag", "env"])
def test_fail_on_init_error_beats_the_config_file(sock_dir: Path, tmp_path: Path, args: list[str],
                                                  env: dict[str, str]) -> None:
    profile, config = driverless_node(tmp_path)
    with PluginProcess("--simulate", str(profile), "--config-file", str(config), "--socket-dir", str(sock_dir),
                       *args, env=env) as plugin:
        assert plugin.proc.wait(PATIENCE_S) == 1
        plugin.event("driver not ready and flags.failOnInitError is true; exiting")


def test_a_flag_not_honoured_is_one_warning_naming_it(sock_dir: Path, tmp_path: Path) -> None:
    profile, config = driverless_node(tmp_path)
    with PluginProcess("--simulate", str(profile), "--config", str(config), "--socket-dir", str(sock_dir),
                       "--gds-enabled", "--mofed-enabled=false", "--fail-on-init-error=true") as plugin:
        assert plugin.proc.wait(PATIENCE_S) == 1
        plugin.event("driver not ready and flags.failOnInitError is true; exiting")  # logged after the warnings
        warnings = plugin.matching(None, reason="not-honoured")
        assert [w["event"].split(" ")[0] for w in warnings] == ["--gds-enabled=true"]
        assert warnings[0]["level"] == "warning"
