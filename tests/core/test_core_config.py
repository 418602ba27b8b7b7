"""The config file: NVIDIA device-plugin config v1 plus gpu-labeller's section."""

import re
from pathlib import Path

import pytest

from labeller.model.config import ConfigError, load_config, parse_config, parse_document
from vendors import RESOURCE_NAMES
from vendors.amd.settings import AmdSettings
from vendors.nvidia.settings import NvidiaSettings

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
    config = load_config(path, RESOURCE_NAMES)
    assert config.mig_strategy == "mixed"
    assert config.section(NvidiaSettings).device_id_strategy == "index"
    assert config.plugin.device_list_strategy == ("envvar", "cdi-cri")
    assert config.section(NvidiaSettings).dev_root == "/run/nvidia/driver"
    assert config.sharing.strategy == "time-slicing"
    assert config.sharing.replicas_for("nvidia.com/gpu") == 10
    assert config.sharing.replicas_for("amd.com/gpu") == 1
    assert config.sharing.advertised_name("nvidia.com/gpu") == "nvidia.com/gpu.shared"


def test_short_resource_names_get_the_nvidia_prefix_and_amd_is_allowed() -> None:
    config = parse_config({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 2}, {"name": "amd.com/gpu", "replicas": 4}]}}}, RESOURCE_NAMES)
    assert config.sharing.replicas_for("nvidia.com/gpu") == 2
    assert config.sharing.replicas_for("amd.com/gpu") == 4


def test_mps_is_read_as_nvidia_reads_it() -> None:
    config = parse_config({"flags": {"mpsRoot": "/run/nvidia/mps/"},
                           "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 4}]}}}, RESOURCE_NAMES)
    assert config.sharing.strategy == "mps"
    assert config.sharing.fail_requests_greater_than_one is True  # NVIDIA's default under MPS
    assert config.plugin.mps_root == "/run/nvidia/mps"
    relaxed = parse_config({"sharing": {"mps": {"failRequestsGreaterThanOne": False,
                                                "resources": [{"name": "gpu", "replicas": 4}]}}}, RESOURCE_NAMES)
    assert relaxed.sharing.fail_requests_greater_than_one is False
    assert relaxed.plugin.mps_root == "/run/nvidia/mps"  # the GPU Operator's and NVIDIA's chart's default


def test_devices_and_rename_are_read() -> None:
    config = parse_config({"sharing": {"timeSlicing": {"resources": [
        {"name": "gpu", "replicas": 2, "devices": [0, "1:0", "GPU-8f3a9c1e-6b2d-4e7f-a5c8-1d2e3f4a5b6c"],
         "rename": "gpu-ts"},
        {"name": "amd.com/gpu", "replicas": 3, "devices": 2, "rename": "gpu-ts"}]}}}, RESOURCE_NAMES)
    nvidia, amd = config.sharing.resources
    assert nvidia.devices.refs == ("0", "1:0", "GPU-8f3a9c1e-6b2d-4e7f-a5c8-1d2e3f4a5b6c")
    assert config.sharing.advertised_name("nvidia.com/gpu") == "nvidia.com/gpu-ts"
    assert amd.devices.count == 2
    assert config.sharing.advertised_name("amd.com/gpu") == "amd.com/gpu-ts"  # the name's own domain
    by_default = parse_config({"sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "gpu", "replicas": 2, "devices": ["0000:05:00.1"]}]}}}, RESOURCE_NAMES)
    assert by_default.sharing.advertised_name("nvidia.com/gpu") == "nvidia.com/gpu.shared"


def test_memory_sharing_is_read_with_gib_by_default() -> None:
    config = parse_config({"sharing": {"memory": {}}}, RESOURCE_NAMES)
    assert config.sharing.strategy == "memory" and config.sharing.resources == ()
    assert config.sharing.memory is not None and config.sharing.memory.unit == "GiB"
    assert config.sharing.memory.unit_bytes == 1 << 30
    mib = parse_config({"sharing": {"memory": {"unit": "MiB"}}}, RESOURCE_NAMES).sharing.memory
    assert mib is not None and mib.unit_bytes == 1 << 20
    assert parse_config({}, RESOURCE_NAMES).sharing.memory is None


def test_amd_resource_naming_strategy() -> None:
    assert parse_config(None, RESOURCE_NAMES).section(AmdSettings).resource_naming == "single"
    mixed = parse_config({"labeller": {"amd": {"resourceNamingStrategy": "mixed"}}}, RESOURCE_NAMES)
    assert mixed.section(AmdSettings).resource_naming == "mixed"


def test_label_groups() -> None:
    config = parse_config({"labeller": {"labels": {"amdBeta": False, "timestamp": True}}}, RESOURCE_NAMES)
    nvidia, amd = config.section(NvidiaSettings), config.section(AmdSettings)
    assert amd.beta_labels is False and nvidia.timestamp_label is True and nvidia.labels is True


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
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": [0, 1]}]}}},
         "sharing.timeSlicing.resources[0].devices: sharing some devices under the resource's own name "
         "(nvidia.com/gpu) would mix whole devices and replicas in one resource; add rename, or renameByDefault: true"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": 4}]}}},
         "sharing.timeSlicing.resources[0].devices: sharing some devices under the resource's own name"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": "some"}]}}},
         "sharing.timeSlicing.resources[0].devices: must be 'all', a positive count, or a list"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": 0}]}}},
         "sharing.timeSlicing.resources[0].devices: must be 'all', a positive count"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "rename": "x",
                                                     "devices": ["gpu0"]}]}}},
         "sharing.timeSlicing.resources[0].devices[0]: 'gpu0' is not a GPU index (0), a MIG index (0:1), "
         "a GPU-/MIG- UUID"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "rename": "x",
                                                     "devices": [1, "1"]}]}}},
         "sharing.timeSlicing.resources[0].devices: 1 is listed twice"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "rename": "gpu"}]}}},
         "sharing.timeSlicing.resources[0].rename: nvidia.com/gpu is the resource's own name"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "rename": "mig-1g.5gb"}]}}},
         "sharing.timeSlicing.resources[0].rename: nvidia.com/mig-1g.5gb is a name the plugin advertises itself"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "amd.com/gpu", "replicas": 2, "rename": "cpx_nps4"}]}}},
         "sharing.timeSlicing.resources[0].rename: amd.com/cpx_nps4 is a name the plugin advertises itself"),
        ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "rename": "s"},
                                                    {"name": "mig-1g.5gb", "replicas": 2, "rename": "s"}]}}},
         "sharing.timeSlicing.resources[1].rename: nvidia.com/s is already the name of another resource"),
        ({"sharing": {"mps": {"resources": [{"name": "amd.com/gpu", "replicas": 2}]}}},
         "sharing.mps.resources[0].name: amd.com/gpu cannot be shared by MPS"),
        ({"sharing": {"mps": {"resources": [{"name": "mig-1g.5gb", "replicas": 2}]}}},
         "sharing.mps.resources[0].name: nvidia.com/mig-1g.5gb cannot be shared by MPS"),
        ({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 49}]}}},
         "sharing.mps.resources[0].replicas: 49 is more than the 48 clients an MPS server accepts"),
        ({"flags": {"migStrategy": "mixed"}, "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}}},
         "sharing.mps: MPS cannot be combined with flags.migStrategy: mixed"),
        ({"flags": {"mpsRoot": "run/mps"}}, "flags.mpsRoot: must be an absolute path"),
        ({"sharing": {"memory": {"unit": "KiB"}}}, "sharing.memory.unit: must be one of GiB, MiB, got 'KiB'"),
        ({"sharing": {"memory": {"unit": "GiB", "replicas": 2}}}, "sharing.memory.replicas: unknown key"),
        ({"sharing": {"memory": None}}, "sharing.memory: must be a mapping"),
        ({"sharing": {"memory": {}, "timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}},
         "sharing: memory and timeSlicing are both set; a node shares its GPUs one way"),
        ({"sharing": {"memory": {}, "mps": {"resources": [{"name": "gpu", "replicas": 2}]}}},
         "sharing: memory and mps are both set"),
        ({"flags": {"migStrategy": "single"}, "sharing": {"memory": {}}},
         "sharing.memory: cannot be combined with flags.migStrategy: single"),
        ({"flags": {"migStrategy": "mixed"}, "sharing": {"memory": {"unit": "MiB"}}},
         "sharing.memory: cannot be combined with flags.migStrategy: mixed"),
        ({"labeller": {"amd": {"resourceNamingStrategy": "per-gpu"}}},
         "labeller.amd.resourceNamingStrategy: must be one of single, mixed"),
        ({"labeller": {"labels": {"intel": True}}}, "labeller.labels.intel: unknown key"),
        ([1, 2], "must be a mapping"),
    ],
)
def test_bad_config_gives_one_line_naming_the_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, RESOURCE_NAMES)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml", RESOURCE_NAMES)
    broken = tmp_path / "broken.yaml"
    broken.write_text("flags: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not valid YAML at line"):
        load_config(broken, RESOURCE_NAMES)


@pytest.mark.parametrize(("raw", "message"), [
    ({"flags": {"migStrategy": "single"}}, "version: required; add 'version: v1'"),
    (None, "must be a mapping that starts with 'version: v1', got an empty document"),
    ("v1", "got a str"),
    ({"version": "v2"}, "version: must be one of v1"),
])
def test_a_whole_document_needs_version_v1(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_document(raw, RESOURCE_NAMES)
    assert parse_document({"version": "v1"}, RESOURCE_NAMES) == parse_config(None, RESOURCE_NAMES)


def test_a_file_without_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags:\n  migStrategy: mixed\n")
    with pytest.raises(ConfigError, match=r"config.yaml: version: required"):
        load_config(path, RESOURCE_NAMES)


def test_a_key_given_twice_is_an_error_naming_key_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\nflags:\n  migStrategy: mixed\n  failOnInitError: false\n  migStrategy: none\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, RESOURCE_NAMES)
    assert str(info.value) == f"{path}: not valid YAML at line 5: duplicate key 'migStrategy'"


def test_yaml_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    # the anchor sits under `imex`, a key that is accepted and ignored
    path.write_text("version: v1\nimex: &groups {nvidia: false, amd: false}\n"
                    "labeller:\n  labels:\n    <<: *groups\n    amd: true\n")
    config = load_config(path, RESOURCE_NAMES)
    assert config.section(NvidiaSettings).labels is False and config.section(AmdSettings).labels is True


def test_a_binary_file_is_named_not_decoded(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"version: v1\n\xff\xfe\x00garbage")
    with pytest.raises(ConfigError) as info:
        load_config(path, RESOURCE_NAMES)
    assert str(info.value) == f"{path}: not a config file: not UTF-8 text (byte 0xff at offset 12)"
