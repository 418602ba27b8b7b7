"""The config file: NVIDIA device-plugin config v1 plus gpu-labeller's section."""

import re
from pathlib import Path

import pytest

from labeller.config import ConfigError, load_config, parse_config, parse_document

NVIDIA_EXAMPLE = """
version: v1
flags:
  migStrategy: mixed
  failOnInitError: true
  nvidiaDriverRoot: /run/nvidia/driver
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, cdi-cri]
    deviceIDStrategy: index
  gfd:
    oneshot: false
    noTimestamp: true
    sleepInterval: 60s
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""


def test_nvidia_device_plugin_config_is_read_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(NVIDIA_EXAMPLE)
    config = load_config(path)
    assert config.mig_strategy == "mixed"
    assert config.plugin.device_id_strategy == "index"
    assert config.plugin.device_list_strategy == ("envvar", "cdi-cri")
    assert config.plugin.nvidia_dev_root == "/run/nvidia/driver"
    assert config.sharing.strategy == "time-slicing"
    assert config.sharing.replicas_for("nvidia.com/gpu") == 10
    assert config.sharing.replicas_for("amd.com/gpu") == 1
    assert config.sharing.advertised_name("nvidia.com/gpu") == "nvidia.com/gpu.shared"


def test_short_resource_names_get_the_nvidia_prefix_and_amd_is_allowed() -> None:
    config = parse_config({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 2}, {"name": "amd.com/gpu", "replicas": 4}]}}})
    assert config.sharing.replicas_for("nvidia.com/gpu") == 2
    assert config.sharing.replicas_for("amd.com/gpu") == 4


def test_mps_is_refused_until_the_plugin_serves_it() -> None:
    # Labels saying sharing-strategy=mps over replicas that are really time-sliced would lie.
    for extra in ({}, {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}):
        with pytest.raises(ConfigError, match=r"^sharing\.mps: MPS is not served yet .* use sharing\.timeSlicing"):
            parse_config({"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}, **extra}})


def test_label_groups() -> None:
    config = parse_config({"labeller": {"labels": {"amdBeta": False, "timestamp": True}}})
    assert config.labels.amd_beta is False and config.labels.timestamp is True and config.labels.nvidia is True


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"flagz": {}}, "flagz: unknown key"),
        ({"flags": {"migStrategy": "both"}}, "flags.migStrategy: must be one of none, single, mixed"),
        ({"flags": {"plugin": {"passDeviceSpecs": "yes"}}}, "flags.plugin.passDeviceSpecs: must be true or false"),
        ({"version": "v2"}, "version: must be one of v1"),
        ({"sharing": {"timeSlicing": {"resources": []}}}, "sharing.timeSlicing.resources: must be a non-empty list"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 1}]}}},
         "sharing.timeSlicing.resources[0].replicas: must be at least 2"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": "4"}]}}},
         "sharing.timeSlicing.resources[0].replicas: required integer"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "colour": 1}]}}},
         "sharing.timeSlicing.resources[0].colour: unknown key"),
        # Replicating every GPU where the config lists some, or under another name than the one
        # asked for, would advertise what the config says is not there: refused until served.
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": [0, 1]}]}}},
         "sharing.timeSlicing.resources[0].devices: sharing a subset of a resource's devices is not served yet"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": 4}]}}},
         "sharing.timeSlicing.resources[0].devices: sharing a subset"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": "some"}]}}},
         "sharing.timeSlicing.resources[0].devices: must be 'all', a positive count, or a list"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "rename": "gpu-ts"}]}}},
         "sharing.timeSlicing.resources[0].rename: not served yet"),
        ({"labeller": {"labels": {"intel": True}}}, "labeller.labels.intel: unknown key"),
        ([1, 2], "must be a mapping"),
    ],
)
def test_bad_config_gives_one_line_naming_the_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("flags: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not valid YAML at line"):
        load_config(broken)


@pytest.mark.parametrize(("raw", "message"), [
    ({"flags": {"migStrategy": "single"}}, "version: required; add 'version: v1'"),
    (None, "must be a mapping that starts with 'version: v1', got an empty document"),
    ("v1", "got a str"),
    ({"version": "v2"}, "version: must be one of v1"),
])
def test_a_whole_document_needs_version_v1(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_document(raw)
    assert parse_document({"version": "v1"}) == parse_config(None)


def test_a_file_without_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags:\n  migStrategy: mixed\n")
    with pytest.raises(ConfigError, match=r"config.yaml: version: required"):
        load_config(path)


def test_a_key_given_twice_is_an_error_naming_key_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\nflags:\n  migStrategy: mixed\n  failOnInitError: false\n  migStrategy: none\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: not valid YAML at line 5: duplicate key 'migStrategy'"


def test_yaml_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    # the anchor sits under `imex`, a key that is accepted and ignored
    path.write_text("version: v1\nimex: &groups {nvidia: false, amd: false}\n"
                    "labeller:\n  labels:\n    <<: *groups\n    amd: true\n")
    config = load_config(path)
    assert config.labels.nvidia is False and config.labels.amd is True


def test_a_binary_file_is_named_not_decoded(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"version: v1\n\xff\xfe\x00garbage")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: not a config file: not UTF-8 text (byte 0xff at offset 12)"
