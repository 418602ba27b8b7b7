"""The advertised-resources model: names, sockets, IDs, MIG strategies, AMD partitions, replicas."""

from __future__ import annotations

from typing import Any

import pytest

from labeller.model.config import parse_config
from vendors.amd.devices import AmdDevice
from vendors.nvidia.devices import NvidiaDevice
from tests.builders import amd, amd_gpu, amd_node, bus, nvidia, nvidia_gpu, offer_of
from vendors import RESOURCE_NAMES


def names(inventory: Any, raw: dict[str, Any] | None = None) -> dict[str, list[str]]:
    offer = offer_of(inventory, parse_config(raw, RESOURCE_NAMES))
    return {r.name: [d.id for d in r.devices] for r in offer.resources}


def test_full_gpus_by_uuid_or_index() -> None:
    inventory = nvidia(nvidia_gpu(0), nvidia_gpu(1, numa=1))
    assert names(inventory) == {"nvidia.com/gpu": ["GPU-0", "GPU-1"]}
    assert names(inventory, {"flags": {"plugin": {"deviceIDStrategy": "index"}}}) == {"nvidia.com/gpu": ["0", "1"]}
    (resource,) = list(offer_of(inventory, parse_config(None, RESOURCE_NAMES)).resources)
    assert resource.socket_name == "nvidia-gpu.sock"
    assert [d.physical.numa_node for d in resource.devices] == [0, 1]


def test_time_slicing_replicas_and_rename() -> None:
    inventory = nvidia(nvidia_gpu(0), nvidia_gpu(1))
    sharing: dict[str, Any] = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}
    assert names(inventory, sharing)["nvidia.com/gpu"] == [f"GPU-{g}::{n}" for g in range(2) for n in range(3)]
    sharing["sharing"]["timeSlicing"]["renameByDefault"] = True
    (resource,) = list(offer_of(inventory, parse_config(sharing, RESOURCE_NAMES)).resources)
    assert resource.name == "nvidia.com/gpu.shared" and resource.socket_name == "nvidia-gpu.shared.sock"
    assert resource.replicas == 3 and len(resource.devices) == 6
    assert {d.physical.health_key for d in resource.devices} == {"GPU-0", "GPU-1"}


def test_mig_single_advertises_mig_devices_as_gpu() -> None:
    inventory = nvidia(nvidia_gpu(0, mig=("1g.5gb",) * 2), nvidia_gpu(1, mig=("1g.5gb",) * 2))
    got = names(inventory, {"flags": {"migStrategy": "single"}})
    assert got == {"nvidia.com/gpu": ["MIG-0-0", "MIG-0-1", "MIG-1-0", "MIG-1-1"]}
    got = names(inventory, {"flags": {"migStrategy": "single", "plugin": {"deviceIDStrategy": "index"}}})
    assert got == {"nvidia.com/gpu": ["0:0", "0:1", "1:0", "1:1"]}


@pytest.mark.parametrize("gpus", [
    (nvidia_gpu(0, mig=("1g.5gb",)), nvidia_gpu(1)),  # MIG and non-MIG
    (nvidia_gpu(0, mig=("1g.5gb", "2g.10gb")),),  # two profiles
    (nvidia_gpu(0, mig=()),),  # MIG enabled, no MIG devices
])
def test_mig_single_invalid_advertises_nothing(gpus: tuple[Any, ...]) -> None:
    # the labels say count=0 (-MIG-INVALID): advertising devices would contradict them
    assert names(nvidia(*gpus), {"flags": {"migStrategy": "single"}}) == {}


def test_mig_single_without_mig_is_none() -> None:
    assert names(nvidia(nvidia_gpu(0)), {"flags": {"migStrategy": "single"}}) == {"nvidia.com/gpu": ["GPU-0"]}


def test_mig_mixed_one_resource_per_profile() -> None:
    inventory = nvidia(nvidia_gpu(0), nvidia_gpu(1, mig=("1g.5gb", "1g.5gb", "2g.10gb+me")), nvidia_gpu(2, mig=()))
    resources = list(offer_of(inventory, parse_config({"flags": {"migStrategy": "mixed"}}, RESOURCE_NAMES)).resources)
    assert {r.name: [d.id for d in r.devices] for r in resources} == {
        "nvidia.com/gpu": ["GPU-0"],
        "nvidia.com/mig-1g.5gb": ["MIG-1-0", "MIG-1-1"],
        "nvidia.com/mig-2g.10gb.me": ["MIG-1-2"],
    }
    assert [r.socket_name for r in resources] == ["nvidia-gpu.sock", "nvidia-mig-1g.5gb.sock",
                                                  "nvidia-mig-2g.10gb.me.sock"]
    mig = resources[1].devices[0].physical
    assert isinstance(mig, NvidiaDevice)
    assert (mig.gpu, mig.nvml_gpu.uuid, mig.nvml_gpu.minor_number, mig.mig_ids) == (bus(1), "GPU-1", 1, (1, 0))
    assert mig.partition == "1g.5gb"


def test_amd_whole_gpus_and_partitions() -> None:
    inventory = amd(
        amd_gpu("0000:03:00.0", amd_node(2, 0x300, render=128, card=1, links=((3, 11), (0, 2)))),
        amd_gpu("0000:05:00.0", amd_node(3, 0x500, render=129, card=2), amd_node(4, 0x501, render=130, card=3), numa=1),
    )
    (resource,) = list(offer_of(inventory, parse_config(None, RESOURCE_NAMES)).resources)
    assert resource.name == "amd.com/gpu" and resource.socket_name == "amd-gpu.sock"
    assert [d.id for d in resource.devices] == ["0000:03:00.0", "0000:05:00.0", "0000:05:00.1"]
    first = resource.devices[0].physical
    assert isinstance(first, AmdDevice)
    assert first.fabric_peers == ("0000:05:00.0",)  # XGMI only; the PCIe link to the CPU node is not a peer
    assert (first.node.kfd_node, first.node.card, first.node.render_minor, first.health_key) == (2, 1, 128, "kfd:2")


def test_amd_time_slicing_uses_the_same_config_format() -> None:
    inventory = amd(amd_gpu("0000:03:00.0", amd_node(2, 0x300, render=128)))
    raw = {"sharing": {"timeSlicing": {"renameByDefault": True, "resources": [{"name": "amd.com/gpu", "replicas": 2}]}}}
    assert names(inventory, raw) == {"amd.com/gpu.shared": ["0000:03:00.0::0", "0000:03:00.0::1"]}


def test_no_devices_no_resources() -> None:
    assert list(offer_of(nvidia(), parse_config(None, RESOURCE_NAMES)).resources) == []
    assert list(offer_of(amd(), parse_config(None, RESOURCE_NAMES)).resources) == []
