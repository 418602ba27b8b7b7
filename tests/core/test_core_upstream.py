"""The flags and env vars of the tools gpu-labeller replaces on gpu-labeller's commands
(labeller.model.upstream): each sets its config key over the config file, or is a warning naming it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from labeller.cli.root import main
from labeller.model.config import Config, config_table, load_config, upstream_flags
from labeller.model.upstream import UpstreamFlag, go_duration, overlay, overrides_and_warnings
from vendors import RESOURCE_NAMES
from vendors.nvidia.settings import NvidiaSettings

UPSTREAM_FLAGS = upstream_flags(RESOURCE_NAMES)

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
    if flag.kind in ("bool", "switch"):
        return [flag.names[0]], True
    if flag.kind == "int":
        return [flag.names[0], "7"], 7
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


DECLARED = [(flag, command) for flag in UPSTREAM_FLAGS if flag.alias_of is None and flag.names
            for command in flag.commands]


@pytest.mark.parametrize(("flag", "command"), DECLARED, ids=[f"{f.tool}:{f.names[0]}:{c}" for f, c in DECLARED])
def test_every_flag_and_env_var_is_taken_and_the_flag_beats_the_env_var(flag: UpstreamFlag, command: str) -> None:
    args, value = sample(flag)
    for name in flag.names:
        assert parsed(command, [name, *args[1:]] if len(args) > 1 else [args[0].replace(flag.names[0], name, 1)]
                      )[flag.dest] == value, name
    for env in flag.env:
        text = ",".join(value) if isinstance(value, tuple) else str(value).lower() if value is True else str(value)
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
          "labeller.labels.firmware": (False, True), "labeller.amd.resourceNamingStrategy": ("single", "mixed"),
          "flags.plugin.sharedDevicesAllocationPolicy": ("distributed", "packed")}


def test_every_config_key_a_flag_sets_has_two_values_to_try() -> None:
    assert {flag.key for flag in KEYED} == set(VALUES)


@pytest.mark.parametrize("flag", KEYED, ids=[f"{f.tool}:{f.shown}" for f in KEYED])
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
    assert load_config(path, RESOURCE_NAMES).section(NvidiaSettings).timestamp_label


@pytest.mark.parametrize("interval", ["10", "0s", "5ms", "ten", "[1]", "true"])
def test_a_bad_sleep_interval_names_the_key(tmp_path: Path, interval: str) -> None:
    from labeller.model.config import ConfigError

    path = Path(config_file(tmp_path, f"flags: {{gfd: {{sleepInterval: {interval}}}}}\n"))
    with pytest.raises(ConfigError, match="flags.gfd.sleepInterval: must be a duration of at least 10ms"):
        load_config(path, RESOURCE_NAMES)


def test_a_bare_sleep_interval_is_nanoseconds_as_in_gfd(tmp_path: Path) -> None:
    path = Path(config_file(tmp_path, "flags: {gfd: {sleepInterval: 60000000000}}\n"))
    assert load_config(path, RESOURCE_NAMES).gfd.sleep_interval_s == 60.0


def test_run_takes_gfds_interval_oneshot_and_output_file_where_its_own_options_are_not_given() -> None:
    from labeller.model.config import GfdFlags
    from labeller.apps.daemon.run import DEFAULT_FEATURES_FILE, _gfd_settings

    gfd = GfdFlags(oneshot=True, sleep_interval_s=10.0, output_file="/out/gfd")
    assert _gfd_settings(GfdFlags(), False, None, None, "node") == (False, 60.0, DEFAULT_FEATURES_FILE)
    assert _gfd_settings(gfd, False, None, None, "features-file") == (True, 10.0, Path("/out/gfd"))
    assert _gfd_settings(gfd, False, 5.0, Path("/mine"), "features-file") == (True, 5.0, Path("/mine"))


def test_each_unhonoured_key_of_nvidias_format_is_named() -> None:
    unhonoured_keys = config_table(RESOURCE_NAMES).warnings
    raw = {"version": "v1", "flags": {"deviceDiscoveryStrategy": "tegra", "useNodeFeatureAPI": False,
                                      "plugin": {"containerDriverRoot": "/driver-root"}},
           "imex": {"channelIDs": [0]}, "resources": {"gpus": []}}
    assert [line.split(":")[0] for line in unhonoured_keys(raw)] == [
        "flags.deviceDiscoveryStrategy", "flags.plugin.containerDriverRoot", "resources", "imex"]
    assert unhonoured_keys({"version": "v1", "flags": {"deviceDiscoveryStrategy": "auto"}}) == []


# --- AMD's device plugin, glog, gpushare: Go's single-dash flags ---------------------------------

AMD_MIXED = "mi300x-x8-cpx-mixed"  # an AMD node partitioned CPX, its profile config naming resources mixed


@pytest.mark.parametrize("given", [["-resource_naming_strategy", "single"], ["-resource_naming_strategy=single"],
                                   ["--resource_naming_strategy", "single"], ["--resource_naming_strategy=single"]])
def test_amds_resource_naming_strategy_in_every_go_spelling(given: list[str]) -> None:
    """AMD's device plugin takes -resource_naming_strategy (as Go's flag package, also with two dashes
    and with =); here it sets labeller.amd.resourceNamingStrategy over the config."""
    mixed = invoke("resources", "--simulate", AMD_MIXED)
    assert mixed.exit_code == 0 and mixed.stdout.startswith("amd.com/cpx_nps4: ")
    single = invoke("resources", "--simulate", AMD_MIXED, *given)
    assert single.exit_code == 0, single.output
    assert single.stdout.startswith("amd.com/gpu: ") and "cpx_nps4" not in single.stdout


def plugin_stopped_at_start(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """``gpu-labeller device-plugin ARGS`` stopped right after its flags are taken (its socket directory
    has no parent): the lines it logged, its error line last."""
    result = invoke("device-plugin", "--simulate", AMD_MIXED, *args, "--socket-dir", "/no/such/dir/plugins",
                    env=env)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert lines[-1] == "Error: --socket-dir /no/such/dir/plugins: directory /no/such/dir does not exist", lines
    return lines[:-1]


def test_amds_device_plugin_manifest_args_are_taken_and_only_a_request_not_honoured_warns() -> None:
    """k8s-ds-amdgpu-dp-health.yaml's args (AMD's plugin, glog): health polling every 10 s and glog to stderr
    ask for what gpu-labeller does; -pulse=0 turns AMD's health checks off, which is not honoured."""
    assert plugin_stopped_at_start("-logtostderr=true", "-stderrthreshold=INFO", "-pulse=10") == []
    [line] = plugin_stopped_at_start("-pulse", "0")
    assert "-pulse=0 (AMD's device plugin) is not honoured by gpu-labeller: gpu-labeller always checks" in line


def test_gpushares_device_plugin_args_are_taken_and_each_unhonoured_one_warns_once() -> None:
    """device-plugin-ds.yaml of gpushare: `-logtostderr --v=5 --memory-unit=GiB`."""
    lines = plugin_stopped_at_start("-logtostderr", "--v=5", "--memory-unit=GiB")
    assert len(lines) == 2, lines
    assert "-v=5 (glog, in AMD's and gpushare's device plugins) is not honoured" in lines[0]
    assert "-memory-unit=GiB (gpushare's device plugin) is not honoured" in lines[1]
    assert "sharing.memory" in lines[1]
    [verbose] = plugin_stopped_at_start("-v=4")  # a one-letter Go flag with its value attached
    assert "-v=4 " in verbose


def test_nvidias_kubelet_socket_path_is_taken_when_it_is_in_the_socket_directory(sock_dir: Path) -> None:
    """NVIDIA's plugin takes the kubelet's socket as a path; gpu-labeller's as a name in --socket-dir."""
    lines = plugin_stopped_at_start("--kubelet-socket", "/no/such/dir/plugins/kubelet.sock")
    assert lines == []  # taken: the run stops later, at the missing socket directory
    result = invoke("device-plugin", "--simulate", AMD_MIXED, "--socket-dir", str(sock_dir),
                    "--kubelet-socket", "/elsewhere/kubelet.sock")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1].startswith("Error: --kubelet-socket /elsewhere/kubelet.sock: not in "
                                                     f"--socket-dir {sock_dir}")


def test_gpushares_extender_env_vars_and_kubectl_plugin_switch() -> None:
    """gpushare's extender reads PORT and LOG_LEVEL; its kubectl plugin takes -d before the node."""
    assert parsed("scheduler-extender", [], {"PORT": "12345"})["port"] == 12345
    params = parsed("inspect", ["-d", "node-1"])
    assert params["node"] == "node-1" and params["upstream_gpushare_inspect_d"] is True
    by_env = {f.env[0]: f for f in UPSTREAM_FLAGS if f.tool == "gpushare-extender" and not f.names}
    _, [line] = overrides_and_warnings({by_env["LOG_LEVEL"]: "debug"})
    assert line.startswith("LOG_LEVEL=debug (gpushare's scheduler extender) is not honoured by gpu-labeller: give "
                           "the root option --log-level debug")


def test_the_dra_drivers_directory_flags_are_dra_plugins_own_options() -> None:
    """NVIDIA's and AMD's DRA drivers name the kubelet's directories and the CDI root differently."""
    params = parsed("dra-plugin", ["--cdi-root", "/etc/cdi", "--kubelet-plugins-directory-path", "/k/plugins"],
                    {"KUBELET_REGISTRAR_DIRECTORY_PATH": "/k/registry"})
    assert (params["cdi_spec_dir"], params["plugins_dir"], params["registry_dir"]) == (
        Path("/etc/cdi"), Path("/k/plugins"), Path("/k/registry"))
    assert parsed("dra-plugin", [], {"CDI_ROOT": "/var/run/cdi"})["cdi_spec_dir"] == Path("/var/run/cdi")
    assert parsed("dra-plugin", ["-v", "4"])["upstream_klog_v"] == 4  # the drivers' charts pass -v $(LOG_VERBOSITY)


def test_the_namespace_the_charts_give_the_dra_plugin_is_context_not_a_request() -> None:
    """Our chart, like NVIDIA's, sets NAMESPACE on every container: it never warns."""
    namespace = next(f for f in UPSTREAM_FLAGS if f.tool == "nvidia-dra" and f.names[0] == "--namespace")
    assert overrides_and_warnings({namespace: "gpu-labeller"}) == ((), [])


# --- "did you mean" ----------------------------------------------------------------------------

def command_names() -> list[str]:
    return [name for name in main.list_commands(click.Context(main)) if name != "completion"]


@pytest.mark.parametrize("name", command_names())
def test_did_you_mean_never_offers_a_hidden_upstream_flag(name: str) -> None:
    """A typo of any flag (here: each hidden one with a letter doubled) suggests only options --help shows."""
    command = main.get_command(click.Context(main), name)
    assert command is not None
    hidden = {opt for p in command.params if isinstance(p, click.Option) and p.hidden for opt in p.opts if len(opt) > 2}
    shown = {opt for p in command.params if isinstance(p, click.Option) and not p.hidden
             for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
    for opt in sorted(hidden):
        typo = opt[:3] + opt[2] + opt[3:]
        result = invoke(name, typo)
        assert result.exit_code == 2
        if "No such option" not in result.stderr:  # "-vmmodule" is glog's -v with the value "mmodule"
            continue
        suggested = set(re.findall(r"'(-[^']+)'", result.stderr.split("No such option", 1)[-1])[1:])
        assert suggested <= shown, (typo, suggested - shown)


def test_a_typo_of_format_suggests_format_not_amds_firmware() -> None:
    result = invoke("labels", "--fromat", "json")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == "Error: No such option '--fromat'. Did you mean '--format'?"


# --- an environment variable's bad value names the variable --------------------------------------

def test_a_bad_mig_strategy_from_the_environment_names_the_variable() -> None:
    result = invoke("labels", "--simulate", MIG_PROFILE, env={"MIG_STRATEGY": "bogus"})
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "Error: MIG_STRATEGY=bogus (for --mig-strategy): 'bogus' is not one of 'none', 'single', 'mixed'."]


def bad_value(param: click.Parameter, tmp_path: Path) -> str | None:
    """A value ``param``'s type refuses, None when it takes any."""
    kind = param.type
    if isinstance(kind, click.Choice):
        return "bogus"
    if isinstance(kind, (click.types.IntParamType, click.types.BoolParamType, click.types.FloatParamType)) \
            or kind.name in ("duration", "integer"):
        return "x7"
    if isinstance(kind, click.Path):
        if not kind.dir_okay:
            return str(tmp_path)  # a directory where a file is wanted
        if not kind.file_okay:
            (tmp_path / "file").write_text("")
            return str(tmp_path / "file")
    return None


def env_options() -> list[tuple[str, str]]:
    """(command, option name) of every option of every command that reads an environment variable."""
    found = []
    for name in command_names():
        command = main.get_command(click.Context(main), name)
        assert command is not None
        found += [(name, p.name) for p in command.params if isinstance(p, click.Option) and p.envvar and p.name]
    return found


@pytest.mark.parametrize(("name", "param_name"), env_options(), ids=[f"{c}:{p}" for c, p in env_options()])
def test_every_environment_variable_a_command_reads_is_named_when_its_value_is_bad(name: str, param_name: str,
                                                                                    tmp_path: Path) -> None:
    command = main.get_command(click.Context(main), name)
    assert command is not None
    param = next(p for p in command.params if p.name == param_name)
    value = bad_value(param, tmp_path)
    if value is None:  # a string: any value parses (its use names it, e.g. a config file's path)
        return
    variables = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    for variable in variables:
        result = invoke(name, env={variable: value})
        assert result.exit_code == 2, (variable, result.output)
        [line] = result.stderr.splitlines()
        assert line.startswith(f"Error: {variable}={value} (for {param.opts[0]}): "), line


def test_the_automatic_environment_variables_are_named_too() -> None:
    result = invoke("labels", env={"GPU_LABELLER_LABELS_FMT": "bogus"})
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0].startswith("Error: GPU_LABELLER_LABELS_FMT=bogus (for --format): ")


def test_a_value_from_the_environment_refused_after_parsing_is_named_as_it_was_given(tmp_path: Path) -> None:
    """Checked once the command runs (a path that is not there, a profile that does not exist): the
    line names the variable the value came from, not a flag the user never typed."""
    def error(*args: str, env: dict[str, str]) -> str:
        result = invoke(*args, env=env)
        assert result.exit_code == 2, result.output
        return result.stderr.splitlines()[-1]

    assert error("device-plugin", "--simulate", AMD_MIXED, env={"KUBELET_SOCKET": "/run/kubelet.sock"}) == (
        "Error: KUBELET_SOCKET=/run/kubelet.sock: not in --socket-dir /var/lib/kubelet/device-plugins (the kubelet's "
        "registration socket is a file name in --socket-dir, or its path there)")
    assert error("device-plugin", "--simulate", AMD_MIXED, env={"DP_SOCKET_DIR": "/no/such/dir/plugins"}) == (
        "Error: DP_SOCKET_DIR=/no/such/dir/plugins: directory /no/such/dir does not exist")
    missing = tmp_path / "configs"
    assert error("labels", "--simulate", MIG_PROFILE, env={"CONFIG_DIR": str(missing)}) == (
        f"Error: CONFIG_DIR={missing}: --config-dir: not a directory")
    assert error("labels", env={"GPU_LABELLER_SIMULATE": "dgx-h1OO"}).startswith(
        "Error: GPU_LABELLER_SIMULATE=dgx-h1OO: no such profile file or built-in profile")
    assert error("labels", "--simulate", "dgx-h1OO", env={}).startswith("Error: dgx-h1OO: no such profile")


# --- GFD's -o/--output-file: the features file at that path ---------------------------------------

def outside_a_cluster(tmp_path: Path) -> dict[str, str | None]:
    """No node name, no kubeconfig anywhere, no service account: what GFD needs to write its file."""
    return {"NODE_NAME": None, "KUBECONFIG": None, "KUBERNETES_SERVICE_HOST": None,
            "KUBERNETES_SERVICE_PORT": None, "HOME": str(tmp_path)}


def run_once(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--log-format", "console", "run", "--simulate", MIG_PROFILE, "--start-jitter",
                                     "0", "--metrics-port", "0", *args],
                              env={**outside_a_cluster(tmp_path), **(env or {})})


@pytest.mark.parametrize("given", [["-o", "{path}"], ["-o{path}"], ["--output-file", "{path}"],
                                   ["--output-file={path}"]])
def test_gfds_output_file_flag_writes_the_features_file_there_with_no_credentials(tmp_path: Path,
                                                                                  given: list[str]) -> None:
    """`gpu-feature-discovery --oneshot -o PATH` writes its labels to PATH and needs neither credentials
    nor a node name; so does run."""
    path = tmp_path / "features.d" / "gfd"
    path.parent.mkdir()
    result = run_once(tmp_path, "--oneshot", *(arg.format(path=path) for arg in given))
    assert result.exit_code == 0, result.output
    assert "nvidia.com/gpu.present=true" in path.read_text().splitlines()


def test_gfds_output_file_from_its_env_var_and_the_config_file(tmp_path: Path) -> None:
    from_env = tmp_path / "from-env"
    result = run_once(tmp_path, env={"GFD_ONESHOT": "true", "GFD_OUTPUT_FILE": str(from_env)})
    assert result.exit_code == 0, result.output
    assert "nvidia.com/gpu.present=true" in from_env.read_text().splitlines()
    from_config = tmp_path / "from-config"
    config = config_file(tmp_path, f"flags: {{gfd: {{oneshot: true, outputFile: {from_config}}}}}\n")
    result = run_once(tmp_path, "--config", config)
    assert result.exit_code == 0, result.output
    assert "nvidia.com/gpu.present=true" in from_config.read_text().splitlines()


def test_an_explicit_output_beats_gfds_output_file_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    result = run_once(tmp_path, "--once", "-o", str(path), "--output", "node", "--node-name", "n1")
    assert result.exit_code == 2 and not path.exists()
    assert "flags.gfd.outputFile is the path of --output features-file, and --output sends the labels elsewhere" \
        in result.stderr
    assert result.stderr.splitlines()[-1].startswith("Error: no Kubernetes credentials")
