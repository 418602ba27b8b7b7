"""GetPreferredAllocation: NVLink and XGMI topologies, NUMA, must_include, replicas, bad input."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from labeller.model.config import parse_config
from labeller.apps.plugin.preferred import preferred
from labeller.model.offer import Resource
from tests.builders import nvidia, nvidia_gpu, offer_of
from tests.plugin.conftest import simulated
from vendors import RESOURCE_NAMES


def islands() -> Resource:
    """8 GPUs: NVLink islands {0,2,4,6} and {1,3,5,7} (all-to-all inside), NUMA 0 = GPUs 0-3."""
    gpus = []
    for i in range(8):
        island = [j for j in range(i % 2, 8, 2) if j != i]
        gpus.append(nvidia_gpu(i, numa=0 if i < 4 else 1, peers=tuple(island)))
    return list(offer_of(nvidia(*gpus), parse_config(None, RESOURCE_NAMES)).resources)[0]


ALL8 = [f"GPU-{i}" for i in range(8)]


def test_nvlink_island_preferred() -> None:
    assert sorted(preferred(islands(), ALL8, [], 4)) == ["GPU-0", "GPU-2", "GPU-4", "GPU-6"]
    assert sorted(preferred(islands(), ALL8, ["GPU-3"], 4)) == ["GPU-1", "GPU-3", "GPU-5", "GPU-7"]


def test_nvlink_pair_prefers_same_numa() -> None:
    # GPU-1's NVLink peers are 3, 5, 7; only 3 shares its NUMA node
    assert sorted(preferred(islands(), ALL8, ["GPU-1"], 2)) == ["GPU-1", "GPU-3"]


def test_without_links_numa_decides() -> None:
    gpus = nvidia(*(nvidia_gpu(i, numa=i % 2) for i in range(4)))
    resource = offer_of(gpus, parse_config(None, RESOURCE_NAMES)).resources[0]
    assert sorted(preferred(resource, ["GPU-0", "GPU-1", "GPU-2", "GPU-3"], ["GPU-1"], 2)) == ["GPU-1", "GPU-3"]


@pytest.mark.parametrize(("available", "must", "size"), [
    (ALL8, [], 9), (ALL8, [], 0), (ALL8, ["GPU-9"], 2), (["GPU-0"], ["GPU-1"], 1),
    (ALL8, ["GPU-0", "GPU-1", "GPU-2"], 2), (["nope"], [], 1), ([], [], 1),
])
def test_infeasible_gives_empty(available: list[str], must: list[str], size: int) -> None:
    assert preferred(islands(), available, must, size) == []


def test_every_answer_is_a_valid_subset() -> None:
    resource = islands()
    for size in range(1, 9):
        for must in itertools.combinations(ALL8[:3], min(size, 2)):
            got = preferred(resource, ALL8, list(must), size)
            assert len(got) == size == len(set(got)) and set(must) <= set(got) <= set(ALL8)


def test_xgmi_on_the_mi210_capture() -> None:
    with simulated("mi210-x8") as (inventory, config, _, _):
        (resource,) = list(offer_of(inventory, config).resources)
    ids = [d.id for d in resource.devices]
    by_id = {d.id: d.physical for d in resource.devices}
    got = preferred(resource, ids, [], 2)
    assert by_id[got[1]].gpu in by_id[got[0]].fabric_peers  # joined by an XGMI bridge
    four = preferred(resource, ids, [], 4)
    linked = sum(by_id[b].gpu in by_id[a].fabric_peers for a, b in itertools.combinations(four, 2))
    best = max(sum(by_id[b].gpu in by_id[a].fabric_peers for a, b in itertools.combinations(c, 2))
               for c in itertools.combinations(ids, 4))
    assert linked == best


def test_partitions_of_one_gpu_together() -> None:
    with simulated("mi300x-x8-cpx") as (inventory, config, _, _):
        (resource,) = list(offer_of(inventory, config).resources)
    ids = [d.id for d in resource.devices]
    got = preferred(resource, ids[3:], [], 4)  # greedy path: C(60, 4) is large
    assert len({resource.device(i).physical.gpu for i in got}) == 1  # type: ignore[union-attr]


def shared(policy: str = "distributed") -> tuple[Resource, str]:
    raw: dict[str, Any] = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    gpus = nvidia(nvidia_gpu(0), nvidia_gpu(1), nvidia_gpu(2))
    return offer_of(gpus, parse_config(raw, RESOURCE_NAMES)).resources[0], policy


def test_replicas_distributed_spread_over_gpus() -> None:
    resource, policy = shared()
    ids = [d.id for d in resource.devices]
    got = preferred(resource, ids, [], 3, policy)
    assert sorted(i.split("::")[0] for i in got) == ["GPU-0", "GPU-1", "GPU-2"]
    # GPU-0 already has two replicas in use: the next two go to the other GPUs
    available = [i for i in ids if i not in ("GPU-0::0", "GPU-0::1")]
    assert sorted(i.split("::")[0] for i in preferred(resource, available, [], 2, policy)) == ["GPU-1", "GPU-2"]


def test_replicas_packed_fill_one_gpu() -> None:
    resource, _ = shared()
    ids = [d.id for d in resource.devices]
    available = [i for i in ids if i != "GPU-1::0"]
    got = preferred(resource, available, [], 3, "packed")
    assert {i.split("::")[0] for i in got} == {"GPU-1"}
    got = preferred(resource, ids, ["GPU-2::3"], 2, "packed")
    assert got[0] == "GPU-2::3" and got[1].startswith("GPU-2::")
