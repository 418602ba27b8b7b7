"""The placement rules (pure) and the cache's bookkeeping of pods on GPUs."""

from __future__ import annotations

from typing import Any

from labeller.model import gpushare
from labeller.apps.extender import placement
from labeller.apps.extender.cache import ShareCache, node_gpus, unhealthy_gpus
from labeller.apps.extender.placement import Gpus


def test_free_memory_is_per_gpu_minus_placed_and_none_for_unhealthy() -> None:
    gpus = Gpus(count=4, units=16, unhealthy=frozenset({2}))
    assert placement.free_memory(gpus, [8, 16, 0]) == [8, 0, None, 16]
    assert placement.free_memory(Gpus(1, 16), [20]) == [0]  # overcommitted by others: nothing free, never negative


def test_binpack_takes_the_fullest_gpu_that_fits_and_spread_the_emptiest() -> None:
    free = [16, 6, None, 9, 6]
    assert placement.choose(free, 5) == 1  # least free that fits; ties to the lowest index
    assert placement.choose(free, 7) == 3
    assert placement.choose(free, 5, "spread") == 0
    assert placement.choose(free, 17) is None
    assert placement.choose([None, None], 1) is None


def test_a_node_with_enough_memory_in_total_but_not_on_one_gpu_does_not_fit() -> None:
    gpus = Gpus(2, 16)
    free = placement.free_memory(gpus, [8, 8])
    assert placement.choose(free, 12) is None
    assert placement.unfit_reason(gpus, free, 12) == ("no GPU has 12 aliyun.com/gpu-mem free "
                                                      "(most free on one GPU: 8 of 16)")
    assert placement.unfit_reason(gpus, free, 8) is None


def test_reasons_name_a_pod_larger_than_one_gpu_and_nodes_that_do_not_share() -> None:
    gpus = Gpus(8, 16)
    assert placement.unfit_reason(gpus, [16] * 8, 20) == ("pod asks 20 aliyun.com/gpu-mem but one GPU of this node "
                                                          "has 16: a pod's GPU memory must fit on a single GPU")
    assert placement.unfit_reason(None, [], 1) == "node does not share GPU memory (no aliyun.com/gpu-mem capacity)"
    assert placement.unfit_reason(Gpus(2, 16, frozenset({0, 1})), [None, None], 1) == "all 2 GPUs are unhealthy"


def test_scores_favour_full_or_empty_nodes() -> None:
    assert placement.score([16], 16, 16, "binpack") == 10
    assert placement.score([16], 4, 16, "binpack") == 2
    assert placement.score([16], 4, 16, "spread") == 8
    assert placement.score([6, 16, None], 4, 16, "binpack") == 4  # (32 - 22 + 4) / 32 of the healthy GPUs
    assert placement.score([2], 4, 16, "binpack") == 0


def test_node_shape_is_gpushares_capacity_rule_and_unhealthy_list_is_read_leniently() -> None:
    node = {"metadata": {"name": "n"}, "status": {"capacity": {gpushare.RESOURCE_MEM: "62",
                                                              gpushare.RESOURCE_COUNT: "4"}}}
    assert node_gpus(node) == (4, 15)
    assert node_gpus({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "4"}}}) is None
    assert node_gpus({"status": {"capacity": {gpushare.RESOURCE_MEM: "8", gpushare.RESOURCE_COUNT: "0"}}}) is None
    assert unhealthy_gpus({"data": {"gpus": "0, 3,x,"}}) == frozenset({0, 3})
    assert unhealthy_gpus({}) == frozenset()


def pod(name: str, units: int, gpu: int | None, node: str | None = "n", rv: int = 1,
        **annotations: str) -> dict[str, Any]:
    notes = dict(annotations)
    if gpu is not None:
        notes[gpushare.ANN_IDX] = str(gpu)
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {gpushare.RESOURCE_MEM: str(units)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": str(rv),
                         "annotations": notes}, "spec": spec, "status": {"phase": "Running"}}


def shared_cache() -> ShareCache:
    cache = ShareCache()
    cache.replace_nodes([{"metadata": {"name": "n"}, "status": {"capacity": {gpushare.RESOURCE_MEM: "32",
                                                                            gpushare.RESOURCE_COUNT: "2"}}}])
    return cache


def test_cache_counts_placed_pods_and_forgets_finished_and_deleted_ones() -> None:
    cache = shared_cache()
    cache.replace_pods([pod("a", 4, 0), pod("b", 6, 1), pod("unplaced", 3, None), pod("c", 2, 1, node=None)], "10")
    assert cache.free("n") == [12, 10]
    finished = pod("a", 4, 0, rv=11)
    finished["status"]["phase"] = "Succeeded"
    cache.pod_changed(finished)
    assert cache.free("n") == [16, 10]
    cache.pod_deleted(pod("b", 6, 1, rv=12))
    assert cache.free("n") == [16, 16]


def test_an_older_event_does_not_undo_a_newer_write() -> None:
    cache = shared_cache()
    cache.place(pod("a", 4, 1, node=None, rv=20), "n")
    assert cache.free("n") == [16, 12]
    cache.pod_changed(pod("a", 4, None, node=None, rv=19))  # the watch catching up with an older version
    assert cache.free("n") == [16, 12]
    cache.release("ns/a")
    assert cache.free("n") == [16, 16]


def test_a_relist_drops_pods_gone_meanwhile_but_keeps_newer_writes() -> None:
    cache = shared_cache()
    cache.replace_pods([pod("a", 4, 0, rv=5), pod("b", 4, 1, rv=6)], "6")
    cache.place(pod("c", 8, 1, node=None, rv=9), "n")
    cache.replace_pods([pod("b", 4, 1, rv=6)], "8")  # a deleted; c written after the list was taken
    assert cache.free("n") == [16, 4]


def test_unhealthy_gpus_offer_nothing_until_the_config_map_goes() -> None:
    cache = shared_cache()
    config_map = {"metadata": {"name": "unhealthy-gpu-n"}, "data": {"gpus": "1"}}
    cache.config_map_changed(config_map)
    assert cache.free("n") == [16, None]
    assert cache.filter(["n"], 16) == (["n"], {})
    cache.config_map_changed({"metadata": {"name": "unhealthy-gpu-n"}, "data": {"gpus": "0,1"}})
    assert cache.filter(["n"], 1) == ([], {"n": "all 2 GPUs are unhealthy"})
    cache.config_map_changed(config_map, deleted=True)
    assert cache.free("n") == [16, 16]
    cache.config_map_changed({"metadata": {"name": "other"}, "data": {"gpus": "0"}})
    assert cache.free("n") == [16, 16]


def test_assumed_pods_hold_the_node_until_assigned_or_stale() -> None:
    cache = shared_cache()
    now = 1_000_000_000_000
    cache.pod_changed(pod("a", 4, 0, **{gpushare.ANN_ASSIGNED: "false", gpushare.ANN_ASSUME_TIME: str(now)}))
    holder = cache.assumed_on("n", "ns/b", now + 1, stale_ns=10**9)
    assert holder is not None and holder.key == "ns/a"
    assert cache.assumed_on("n", "ns/a", now + 1, stale_ns=10**9) is None  # a retry of the same pod
    assert cache.assumed_on("n", "ns/b", now + 2 * 10**9, stale_ns=10**9) is None  # stale
    cache.pod_changed(pod("a", 4, 0, rv=2, **{gpushare.ANN_ASSIGNED: "true"}))
    assert cache.assumed_on("n", "ns/b", now + 1, stale_ns=10**9) is None
