"""A config cannot make the node offer more than the kubelet takes, nor take long to check.

The kubelet reads each resource's devices in one ListAndWatch message of at most 4 MiB: 652,472
memory units (MiB on 8 H100s) made a 42 MB message the kubelet dropped, while the plugin said
"registered". The offer's size is counted from the config and the GPUs, before any device is built.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from labeller.model.config import MAX_DEVICE_REFS, MAX_REPLICAS, MAX_SHARED_RESOURCES, ConfigError, parse_config
from labeller.model.offer import MAX_DEVICES_PER_RESOURCE
from tests.builders import AT_ONCE_S, nvidia, nvidia_gpu, offer_of
from tests.core.cli import error_line, in_process
from vendors import RESOURCE_NAMES


def time_slicing(**entry: object) -> dict[str, object]:
    return {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True,
                                                         "resources": [{"name": "gpu", **entry}]}}}


def test_replicas_over_the_bound_are_refused_naming_it() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(time_slicing(replicas=1_000_000), RESOURCE_NAMES)
    assert str(refused.value) == (f"sharing.timeSlicing.resources[0].replicas: 1000000 is more than {MAX_REPLICAS}, "
                                  "the most replicas of one device")
    assert parse_config(time_slicing(replicas=MAX_REPLICAS), RESOURCE_NAMES).sharing.replicas_for("nvidia.com/gpu") \
        == MAX_REPLICAS


def test_a_device_count_over_the_bound_is_refused() -> None:
    with pytest.raises(ConfigError, match=rf"devices: 100000 is more than {MAX_DEVICE_REFS}, the most devices"):
        parse_config(time_slicing(replicas=2, devices=100_000), RESOURCE_NAMES)


def test_a_devices_list_of_100k_entries_is_refused_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        parse_config(time_slicing(replicas=2, devices=list(range(100_000))), RESOURCE_NAMES)
    assert time.monotonic() - started < AT_ONCE_S
    assert str(refused.value) == (f"sharing.timeSlicing.resources[0].devices: 100000 entries, more than "
                                  f"{MAX_DEVICE_REFS}, the most devices one entry may list")


def test_a_long_devices_list_is_checked_in_linear_time() -> None:
    # Every entry distinct and valid (UUIDs), the longest list allowed: a quadratic check of
    # duplicates (a count per entry) took seconds; a linear one takes milliseconds.
    refs = [f"GPU-{i:08d}" for i in range(MAX_DEVICE_REFS)]
    started = time.monotonic()
    for _ in range(20):
        parse_config(time_slicing(replicas=2, devices=refs), RESOURCE_NAMES)
    assert time.monotonic() - started < AT_ONCE_S
    with pytest.raises(ConfigError, match=r"devices: GPU-00000007 is listed twice"):
        parse_config(time_slicing(replicas=2, devices=[*refs[:-1], refs[7]]), RESOURCE_NAMES)


def test_too_many_shared_resources_are_refused() -> None:
    entries = [{"name": f"mig-{i}g.5gb", "replicas": 2} for i in range(MAX_SHARED_RESOURCES + 1)]
    with pytest.raises(ConfigError, match=rf"resources: {MAX_SHARED_RESOURCES + 1} entries, more than "
                                          rf"{MAX_SHARED_RESOURCES}"):
        parse_config({"sharing": {"timeSlicing": {"resources": entries}}}, RESOURCE_NAMES)


def test_replicas_that_would_overflow_the_kubelets_message_are_refused_before_they_are_built() -> None:
    gpus = nvidia(*(nvidia_gpu(i) for i in range(64)))
    with pytest.raises(ConfigError) as refused:
        offer_of(gpus, time_slicing(replicas=MAX_REPLICAS))
    assert str(refused.value) == (
        f"sharing.timeSlicing.resources[0]: nvidia.com/gpu.shared would be advertised as 65536 devices (64 x "
        f"{MAX_REPLICAS} replicas), more than the {MAX_DEVICES_PER_RESOURCE} the kubelet takes for one resource; "
        "lower replicas to 512 or less")
    assert len(offer_of(gpus, time_slicing(replicas=512)).resource("nvidia.com/gpu").devices) == 32768  # type: ignore[union-attr]


def test_memory_units_that_would_overflow_the_kubelets_message_are_refused() -> None:
    gpus = nvidia(nvidia_gpu(0), replace(nvidia_gpu(1), memory_bytes=15843721216))  # 40 GiB, a T4's 14.75 GiB
    with pytest.raises(ConfigError) as refused:
        offer_of(gpus, {"sharing": {"memory": {"unit": "MiB"}}})
    assert str(refused.value) == (
        f"sharing.memory.unit: aliyun.com/gpu-mem would be advertised as 56069 devices (one per MiB of 2 GPUs), "
        f"more than the {MAX_DEVICES_PER_RESOURCE} the kubelet takes for one resource; use unit: GiB")


def test_mib_memory_sharing_on_eight_h100s_is_one_line_not_a_dropped_registration(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  memory:\n    unit: MiB\n")
    result = in_process("resources", "--simulate", "dgx-h100", "--config", str(config))
    assert result.returncode == 2, result.stderr[-2000:]
    assert error_line(result) == (
        f"Error: {config}: sharing.memory.unit: aliyun.com/gpu-mem would be advertised as 652472 devices (one per "
        f"MiB of 8 GPUs), more than the {MAX_DEVICES_PER_RESOURCE} the kubelet takes for one resource; use unit: GiB")
