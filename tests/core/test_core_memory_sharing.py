"""Sharing by memory (``sharing.memory``, gpushare's model) is one more case of the offer: the GPUs of
``nvidia.com/gpu`` become ``aliyun.com/gpu-mem`` (one device per unit of each GPU's memory) and
``aliyun.com/gpu-count``, and the labels say so from the same objects."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from labeller.model.gpushare import RESOURCE_COUNT as COUNT_RESOURCE, RESOURCE_MEM as MEMORY_RESOURCE
from tests.builders import label_set_of, nvidia, nvidia_gpu, offer_of
from tests.core.cli import in_process

GIB = 1 << 30
MEMORY = {"sharing": {"memory": {}}}


def test_every_gpu_offers_its_memory_floored_to_whole_units_and_nothing_as_nvidia_gpu() -> None:
    inventory = nvidia(nvidia_gpu(0), replace(nvidia_gpu(1), memory_bytes=15843721216))  # 40 GiB, a T4's 14.75
    offer = offer_of(inventory, MEMORY)
    assert [r.name for r in offer.resources] == [MEMORY_RESOURCE, COUNT_RESOURCE]
    assert offer.resource("nvidia.com/gpu") is not None  # the base the labels describe...
    assert all(r.name != "nvidia.com/gpu" for r in offer.resources)  # ...but never advertised under that name
    memory = offer.resources[0]
    ids = [d.id for d in memory.devices]
    assert len(ids) == 40 + 14 and ids[0] == "GPU-0::0" and ids[39] == "GPU-0::39" and ids[-1] == "GPU-1::13"
    assert {d.physical.health_key for d in memory.devices} == {"GPU-0", "GPU-1"}  # each unit names its GPU
    assert [d.id for d in offer.resources[1].devices] == ["GPU-0", "GPU-1"]
    # MiB units of both GPUs (56,069) are more than the kubelet takes (test_core_config_limits); the T4's fit
    t4 = nvidia(replace(nvidia_gpu(1), memory_bytes=15843721216))
    mib = offer_of(t4, {"sharing": {"memory": {"unit": "MiB"}}}).resources[0]
    assert len(mib.devices) == 15109


def test_index_strategy_names_units_by_gpu_index() -> None:
    offer = offer_of(nvidia(nvidia_gpu(0), nvidia_gpu(1)),
                     {**MEMORY, "flags": {"plugin": {"deviceIDStrategy": "index"}}})
    assert offer.resources[0].devices[40].id == "1::0"
    assert [d.id for d in offer.resources[1].devices] == ["0", "1"]


def test_a_mig_enabled_gpu_is_held_with_the_reason_and_the_others_are_shared() -> None:
    offer = offer_of(nvidia(nvidia_gpu(0), nvidia_gpu(1, mig=("1g.5gb",))), MEMORY)
    assert [d.id for d in offer.resources[1].devices] == ["GPU-0"]
    (held,) = offer.held
    assert held.resource.name == "nvidia.com/gpu" and not held.waiting
    assert held.reason == "not shared by memory: GPU-1: MIG is enabled (memory sharing offers whole GPUs only)"
    labels = label_set_of(nvidia(nvidia_gpu(0), nvidia_gpu(1, mig=("1g.5gb",))), MEMORY).labels
    assert labels["nvidia.com/gpu.count"] == "1"


def test_a_gpu_whose_memory_is_unknown_is_held() -> None:
    offer = offer_of(nvidia(replace(nvidia_gpu(0), memory_bytes=0)), MEMORY)
    assert offer.resources == ()
    assert offer.held[0].reason == "not shared by memory: GPU-0: its memory is unknown or less than one GiB"
    assert "gpushare" not in label_set_of(nvidia(replace(nvidia_gpu(0), memory_bytes=0)), MEMORY).labels


def test_labels_say_memory_sharing_and_match_the_advertised_capacity() -> None:
    inventory = nvidia(*(nvidia_gpu(i) for i in range(4)))
    offer, labels = offer_of(inventory, MEMORY), label_set_of(inventory, MEMORY).labels
    assert labels["gpushare"] == "true"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "memory"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"  # renamed: no -SHARED
    assert "nvidia.com/gpu.shared-count" not in labels
    count, replicas = int(labels["nvidia.com/gpu.count"]), int(labels["nvidia.com/gpu.replicas"])
    assert count == len(offer.resources[1].devices) == 4
    assert count * replicas == len(offer.resources[0].devices) == 160
    assert labels["nvidia.com/gpu.memory"] == str(40 * 1024)


def test_replicas_describe_the_model_the_labels_name_on_a_mixed_node() -> None:
    small = replace(nvidia_gpu(2), name="NVIDIA L4", memory_bytes=22 * GIB)
    labels = label_set_of(nvidia(nvidia_gpu(0), nvidia_gpu(1), small), MEMORY).labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB" and labels["nvidia.com/gpu.replicas"] == "40"
    assert labels["nvidia.com/gpu.count"] == "3"


def test_gpushare_is_written_only_while_gpus_are_offered_by_memory() -> None:
    inventory = nvidia(nvidia_gpu(0))
    assert "gpushare" not in label_set_of(inventory, None).labels
    assert "gpushare" not in label_set_of(inventory, {"sharing": {"timeSlicing": {
        "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}).labels
    assert label_set_of(inventory, MEMORY).labels["gpushare"] == "true"


def test_amd_gpus_on_the_node_stay_amd_com_gpu() -> None:
    with_amd = offer_of(_profile_inventory("mixed-l40s-mi210"), MEMORY)
    assert {r.name for r in with_amd.resources} == {MEMORY_RESOURCE, COUNT_RESOURCE, "amd.com/gpu"}


def _profile_inventory(profile: str) -> Any:
    from labeller.host.machine import NodeOptions, open_host

    with open_host(NodeOptions(simulate=profile)) as node:
        return node.probe()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return in_process(*args)


def test_the_resources_and_labels_commands_agree_on_the_gpushare_profile() -> None:
    labels = json.loads(run_cli("labels", "--simulate", "t4-x4-gpushare", "--format", "json").stdout)
    resources = {r["name"]: r for r in json.loads(
        run_cli("resources", "--simulate", "t4-x4-gpushare", "--format", "json").stdout)["resources"]}
    assert set(resources) == {MEMORY_RESOURCE, COUNT_RESOURCE}
    assert resources[MEMORY_RESOURCE]["count"] == 4 * 14  # a T4's 15109 MiB is 14 whole GiB
    assert resources[MEMORY_RESOURCE]["sharing"] == resources[COUNT_RESOURCE]["sharing"] == "memory"
    assert int(labels["nvidia.com/gpu.count"]) == resources[COUNT_RESOURCE]["count"] == 4
    assert int(labels["nvidia.com/gpu.count"]) * int(labels["nvidia.com/gpu.replicas"]) == \
        resources[MEMORY_RESOURCE]["count"]
    assert labels["nvidia.com/gpu.sharing-strategy"] == "memory" and labels["gpushare"] == "true"


def test_resources_text_says_how_many_memory_units_each_gpu_offers() -> None:
    lines = run_cli("resources", "--simulate", "t4-x4-gpushare").stdout.splitlines()
    assert lines[0] == "aliyun.com/gpu-mem: 56 devices (4 physical, 14 memory units each), socket aliyun-gpu-mem.sock"
    assert "aliyun.com/gpu-count: 4 devices (4 physical), socket aliyun-gpu-count.sock" in lines


def test_a_bad_memory_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\nflags: {migStrategy: mixed}\nsharing: {memory: {unit: GiB}}\n")
    for command in ("labels", "resources"):
        result = run_cli(command, "--simulate", "t4-x4-gpushare", "--config", str(path))
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip().splitlines() == [
            f"Error: {path}: sharing.memory: cannot be combined with flags.migStrategy: mixed; memory sharing offers "
            "whole GPUs by their memory (use migStrategy none, or MIG without sharing.memory)"]
