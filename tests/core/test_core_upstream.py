"""The flags and env vars of GFD, NVIDIA's device plugin and AMD's labeller on gpu-labeller's commands
(labeller.upstream): each sets its config key over the config file, or is a warning naming it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from labeller.cli import main
from labeller.config import Config, load_config
from labeller.upstream import UPSTREAM_FLAGS, UpstreamFlag, go_duration, overlay, overrides_and_warnings
from vendors import RESOURCE_NAMES

MIG_PROFILE = "a100-mig-single"  # an NVIDIA node whose profile config says migStrategy: single
AMD_PROFILE = "mi25-firmware"  # an AMD node with firmware versions to label


def labels_of(*args: str, env: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """``gpu-labeller labels ARGS``: its labels and its stderr."""
    result = invoke("labels", *args, env=env)
    assert result.exit_code == 0, result.output
    pairs = (line.split("=", 1) for line in result.stdout.splitlines())
    return dict(pairs), result.stderr


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--log-format", "console", *args], env=env)


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n" + text)
    return str(path)


# --- the flag, the env var and the config file ----------------------------------------------------

def test_a_flag_beats_its_env_var_which_beats_the_config_file(tmp_path: Path) -> None:
    config = config_file(tmp_path, "flags: {migStrategy: single}\n")
    strategy = "nvidia.com/mig.strategy"
    assert labels_of("--simulate", MIG_PROFILE, "--config", config)[0][strategy] == "single"
    assert labels_of("--simulate", MIG_PROFILE, "--config", config,
                     env={"MIG_STRATEGY": "mixed"})[0][strategy] == "mixed"
    # GFD reads GFD_MIG_STRATEGY before MIG_STRATEGY
    both = {"GFD_MIG_STRATEGY": "mixed", "MIG_STRATEGY": "none"}
    assert labels_of("--simulate", MIG_PROFILE, "--config", config, env=both)[0][strategy] == "mixed"
    given, _ = labels_of("--simulate", MIG_PROFILE, "--config", config, "--mig-strategy", "none",
                         env={"MIG_STRATEGY": "mixed"})
    assert strategy not in given  # none writes no strategy label


def test_flags_apply_over_a_profiles_own_config_too() -> None:
    assert labels_of("--simulate", MIG_PROFILE, "--mig-strategy=mixed")[0]["nvidia.com/mig.strategy"] == "mixed"


def test_no_timestamp_flag_and_env_beat_the_config_file(tmp_path: Path) -> None:
    config = config_file(tmp_path, "flags: {gfd: {noTimestamp: false}}\n")  # GFD's default: a timestamp
    key = "nvidia.com/gfd.timestamp"
    assert key in labels_of("--simulate", MIG_PROFILE, "--config", config)[0]
    assert key not in labels_of("--simulate", MIG_PROFILE, "--config", config, "--no-timestamp")[0]
    assert key not in labels_of("--simulate", MIG_PROFILE, "--config", config, env={"GFD_NO_TIMESTAMP": "true"})[0]
    assert key in labels_of("--simulate", MIG_PROFILE, "--config", config, "--no-timestamp=false",
                            env={"GFD_NO_TIMESTAMP": "true"})[0]
    assert key not in labels_of("--simulate", MIG_PROFILE)[0]  # gpu-labeller's own default: none


def test_machine_type_file_is_read_under_the_host_root(tmp_path: Path) -> None:
    vendor_file = "/sys/bus/pci/devices/0000:07:00.0/vendor"  # a file the simulated DGX A100 has: 0x10de
    assert labels_of("--simulate", MIG_PROFILE)[0]["nvidia.com/gpu.machine"] == "DGXA100"
    assert labels_of("--simulate", MIG_PROFILE,
                     "--machine-type-file", vendor_file)[0]["nvidia.com/gpu.machine"] == "0x10de"
    config = config_file(tmp_path, f"flags: {{gfd: {{machineTypeFile: {vendor_file}}}}}\n")
    assert labels_of("--simulate", MIG_PROFILE, "--config", config)[0]["nvidia.com/gpu.machine"] == "0x10de"
    missing, _ = labels_of("--simulate", MIG_PROFILE, env={"GFD_MACHINE_TYPE_FILE": "/no/such/file"})
    assert missing["nvidia.com/gpu.machine"] == "unknown"


def test_amd_single_dash_switches_work_as_typed(tmp_path: Path) -> None:
    firmware = re.compile(r"beta\.amd\.com/gpu\.firmware\.")
    off = config_file(tmp_path, "labeller: {labels: {firmware: false}}\n")
    assert not any(firmware.match(k) for k in labels_of("--simulate", AMD_PROFILE, "--config", off)[0])
    for switch in ("-firmware", "-firmware=true", "--firmware"):
        assert any(firmware.match(k) for k in labels_of("--simulate", AMD_PROFILE, "--config", off, switch)[0]), switch
    assert any(firmware.match(k) for k in labels_of("--simulate", AMD_PROFILE)[0])  # the profile's config: on
    assert not any(firmware.match(k) for k in labels_of("--simulate", AMD_PROFILE, "-firmware=false")[0])


def test_amd_switches_for_kinds_always_written_warn_only_when_turned_off() -> None:
    labels, stderr = labels_of("--simulate", AMD_PROFILE, "-vram", "-cu-count", "-product-name")
    assert "amd.com/gpu.vram" in labels and stderr == ""
    labels, stderr = labels_of("--simulate", AMD_PROFILE, "-vram=false")
    assert "amd.com/gpu.vram" in labels
    [line] = stderr.splitlines()
    assert "-vram=false" in line and "not honoured" in line


def test_an_unhonoured_config_key_is_one_warning_naming_it(tmp_path: Path) -> None:
    config = config_file(tmp_path, "flags: {gdsEnabled: true, mofedEnabled: false}\n")
    _, stderr = labels_of("--simulate", MIG_PROFILE, "--config", config)
    [line] = stderr.splitlines()
    assert "flags.gdsEnabled: not honoured" in line  # mofedEnabled: false asks for what gpu-labeller does


def test_a_bad_upstream_value_is_one_line_and_exit_2() -> None:
    result = invoke("labels", "--simulate", MIG_PROFILE, "--mig-strategy", "half")
    assert result.exit_code == 2 and "--mig-strategy" in result.stderr and "Traceback" not in result.stderr
    result = invoke("run", "--sleep-interval", "10")  # Go durations have a unit
    assert result.exit_code == 2 and "--sleep-interval" in result.stderr and "Traceback" not in result.stderr


# --- every flag of the table -------------------------------------------------------------------

def sample(flag: UpstreamFlag) -> tuple[list[str], Any]:
    """Arguments that give ``flag`` a value other than gpu-labeller's default, and that value as the
    option holds it."""
    if flag.kind == "bool":
        return [flag.names[0]], True
    if flag.kind == "list":
        return [f"{flag.names[0]}=cdi-cri,envvar"], ("cdi-cri,envvar",)
    if flag.kind == "duration":
        return [flag.names[0], "1m30s"], "1m30s"
    if isinstance(flag.kind, tuple):
        return [flag.names[0], flag.kind[-1]], flag.kind[-1]
    return [flag.names[0], "/some/path"], "/some/path"


def parsed(command_name: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    command = main.get_command(click.Context(main), command_name)
    assert command is not None
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        return command.make_context(command_name, args).params


DECLARED = [(flag, command) for flag in UPSTREAM_FLAGS if flag.alias_of is None for command in flag.commands]


@pytest.mark.parametrize(("flag", "command"), DECLARED, ids=[f"{f.tool}:{f.names[0]}:{c}" for f, c in DECLARED])
def test_every_flag_and_env_var_is_taken_and_the_flag_beats_the_env_var(flag: UpstreamFlag, command: str) -> None:
    args, value = sample(flag)
    for name in flag.names:
        assert parsed(command, [name, *args[1:]] if len(args) > 1 else [args[0].replace(flag.names[0], name, 1)]
                      )[flag.dest] == value, name
    for env in flag.env:
        text = ",".join(value) if isinstance(value, tuple) else str(value).lower() if value is True else value
        assert parsed(command, [], {env: text})[flag.dest] in (value, (text,)), env
    if flag.kind == "bool" and flag.env:
        assert parsed(command, [f"{flag.names[0]}=false"], {flag.env[0]: "true"})[flag.dest] is False


KEYED = [flag for flag in UPSTREAM_FLAGS if flag.key is not None]
VALUES = {"flags.migStrategy": ("single", "mixed"), "flags.failOnInitError": (False, True),
          "flags.nvidiaDriverRoot": ("/a", "/run/nvidia/driver"), "flags.nvidiaDevRoot": ("/a", "/b"),
          "flags.plugin.passDeviceSpecs": (False, True), "flags.plugin.deviceListStrategy": (("envvar",), ("cdi-cri",)),
          "flags.plugin.deviceIDStrategy": ("uuid", "index"), "flags.plugin.cdiAnnotationPrefix": ("a/", "b/"),
          "flags.plugin.nvidiaCTKPath": ("/a", "/b"), "flags.mpsRoot": ("/a", "/b"), "flags.gfd.oneshot": (False, True),
          "flags.gfd.noTimestamp": (False, True), "flags.gfd.sleepInterval": ("60s", "10s"),
          "flags.gfd.outputFile": ("/a", "/b"), "flags.gfd.machineTypeFile": ("/a", "/b"),
          "labeller.labels.firmware": (False, True)}


def test_every_config_key_a_flag_sets_has_two_values_to_try() -> None:
    assert {flag.key for flag in KEYED} == set(VALUES)


@pytest.mark.parametrize("flag", KEYED, ids=[f"{f.tool}:{f.names[0]}" for f in KEYED])
def test_every_keyed_flag_beats_the_config_file(flag: UpstreamFlag, tmp_path: Path) -> None:
    assert flag.key is not None
    in_file, from_flag = VALUES[flag.key]

    def loaded(value: Any, overrides: tuple[tuple[str, Any], ...] = ()) -> Config:
        path = tmp_path / "config.yaml"
        path.write_text(repr_yaml(overlay({"version": "v1"}, ((flag.key or "", value),))))
        return load_config(path, RESOURCE_NAMES, overrides)

    overrides, warnings = overrides_and_warnings({flag: from_flag})
    assert warnings == [] and overrides == ((flag.key, from_flag),)
    assert loaded(in_file) != loaded(from_flag)
    assert loaded(in_file, overrides) == loaded(from_flag)


def repr_yaml(document: Any) -> str:
    import json

    return json.dumps(document)  # JSON is YAML


def test_flags_not_honoured_warn_naming_the_flag_unless_neutral() -> None:
    by_name = {(f.tool, f.names[0]): f for f in UPSTREAM_FLAGS if f.names}
    gds = by_name[("plugin", "--gds-enabled")]
    assert overrides_and_warnings({gds: False}) == ((), [])
    _, [line] = overrides_and_warnings({gds: True})
    assert line.startswith("--gds-enabled=true (NVIDIA's device plugin) is not honoured")
    imex = by_name[("plugin", "--imex-channel-ids")]
    _, [line] = overrides_and_warnings({imex: ("1", "2")})
    assert line.startswith("--imex-channel-ids=1,2 ")


def test_config_file_is_nvidias_config_file_name_and_ds_node_name_amds_node_name(tmp_path: Path) -> None:
    config = config_file(tmp_path, "flags: {migStrategy: mixed}\n")
    assert parsed("labels", ["--config-file", config])["config_path"] == Path(config)
    assert parsed("run", [], {"DS_NODE_NAME": "n1"})["node_name"] == "n1"
    assert parsed("run", [], {"DS_NODE_NAME": "n1", "NODE_NAME": "n2"})["node_name"] == "n2"


def test_go_durations() -> None:
    assert go_duration("10s") == 10 and go_duration("1m30s") == 90 and go_duration("500ms") == 0.5
    assert go_duration("1.5h") == 5400
    for bad in ("", "10", "s", "10 s", "1d"):
        with pytest.raises(ValueError):
            go_duration(bad)


# --- flags.gfd in the config file -----------------------------------------------------------------

def test_gfd_settings_are_read(tmp_path: Path) -> None:
    path = Path(config_file(tmp_path, "flags: {gfd: {oneshot: true, noTimestamp: false, sleepInterval: 1m30s, "
                                      "outputFile: /out/gfd, machineTypeFile: /m}}\n"))
    gfd = load_config(path, RESOURCE_NAMES).gfd
    assert (gfd.oneshot, gfd.sleep_interval_s, gfd.output_file, gfd.machine_type_file) == (True, 90.0, "/out/gfd", "/m")
    assert load_config(path, RESOURCE_NAMES).labels.timestamp


@pytest.mark.parametrize("interval", ["10", "0s", "5ms", "ten", "[1]", "true"])
def test_a_bad_sleep_interval_names_the_key(tmp_path: Path, interval: str) -> None:
    from labeller.config import ConfigError

    path = Path(config_file(tmp_path, f"flags: {{gfd: {{sleepInterval: {interval}}}}}\n"))
    with pytest.raises(ConfigError, match="flags.gfd.sleepInterval: must be a duration of at least 10ms"):
        load_config(path, RESOURCE_NAMES)


def test_a_bare_sleep_interval_is_nanoseconds_as_in_gfd(tmp_path: Path) -> None:
    path = Path(config_file(tmp_path, "flags: {gfd: {sleepInterval: 60000000000}}\n"))
    assert load_config(path, RESOURCE_NAMES).gfd.sleep_interval_s == 60.0


def test_run_takes_gfds_interval_oneshot_and_output_file_where_its_own_options_are_not_given() -> None:
    from labeller.config import GfdFlags
    from labeller.daemon.cli import DEFAULT_FEATURES_FILE, _gfd_settings

    gfd = GfdFlags(oneshot=True, sleep_interval_s=10.0, output_file="/out/gfd")
    assert _gfd_settings(GfdFlags(), False, None, None, "node") == (False, 60.0, DEFAULT_FEATURES_FILE)
    assert _gfd_settings(gfd, False, None, None, "features-file") == (True, 10.0, Path("/out/gfd"))
    assert _gfd_settings(gfd, False, 5.0, Path("/mine"), "features-file") == (True, 5.0, Path("/mine"))


def test_each_unhonoured_key_of_nvidias_format_is_named() -> None:
    from labeller.upstream import unhonoured_keys

    raw = {"version": "v1", "flags": {"deviceDiscoveryStrategy": "tegra", "useNodeFeatureAPI": False,
                                      "plugin": {"containerDriverRoot": "/driver-root"}},
           "imex": {"channelIDs": [0]}, "resources": {"gpus": []}}
    assert [line.split(":")[0] for line in unhonoured_keys(raw)] == [
        "flags.deviceDiscoveryStrategy", "flags.plugin.containerDriverRoot", "resources", "imex"]
    assert unhonoured_keys({"version": "v1", "flags": {"deviceDiscoveryStrategy": "auto"}}) == []
