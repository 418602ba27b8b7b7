"""The extender's accounting is its own: the annotations a pod's owner can edit do not move, hide or
inflate what the pod holds, and cannot keep a node's allocation lock forever."""

from __future__ import annotations

import tracemalloc
from typing import Any

from structlog.testing import capture_logs

from labeller.model import gpushare
from labeller.apps.extender.cache import ShareCache

Obj = dict[str, Any]
NOW_NS = 1_700_000_000_000_000_000


def running(name: str, units: int, gpu: str | None, rv: int, node: str = "n", **annotations: str) -> Obj:
    notes = dict(annotations)
    if gpu is not None:
        notes[gpushare.ANN_IDX] = gpu
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": str(rv),
                         "annotations": notes},
            "spec": {"nodeName": node,
                     "containers": [{"name": "c", "resources": {"limits": {gpushare.RESOURCE_MEM: str(units)}}}]},
            "status": {"phase": "Running"}}


def four_gpus(clock_ns: int = NOW_NS) -> ShareCache:
    cache = ShareCache(clock_ns=lambda: clock_ns)
    cache.replace_nodes([{"metadata": {"name": "n"}, "status": {"capacity": {gpushare.RESOURCE_MEM: "64",
                                                                            gpushare.RESOURCE_COUNT: "4"}}}])
    return cache


def test_a_pods_gpu_and_size_are_fixed_by_the_first_assignment_seen() -> None:
    cache = four_gpus()
    cache.pod_changed(running("r", 14, "0", rv=1))
    assert cache.free("n") == [2, 16, 16, 16]
    with capture_logs() as logs:
        cache.pod_changed(running("r", 14, "3", rv=2))  # the owner edits the index
    assert cache.free("n") == [2, 16, 16, 16]
    assert cache.choose("n", 14, "binpack") == (1, 16)  # the next 14-unit pod does not land on GPU 0
    assert any(entry.get("reason") == "placement-edited" and entry.get("pod") == "ns/r" for entry in logs)
    cache.pod_changed(running("r", 14, None, rv=3))  # the owner removes it
    assert cache.free("n") == [2, 16, 16, 16]
    assert [p["name"] for p in cache.inspect("n")[0]["devs"][0]["pods"]] == ["r"]
    cache.pod_deleted(running("r", 14, None, rv=4))
    assert cache.free("n") == [16, 16, 16, 16]


def test_an_index_outside_the_nodes_gpus_is_ignored_and_allocates_nothing_in_proportion() -> None:
    cache = four_gpus()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        with capture_logs() as logs:
            cache.pod_changed(running("huge", 4, "30000000", rv=1))
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before < 1 << 20 and after - before < 1 << 20
    assert cache.free("n") == [16, 16, 16, 16]
    assert any(entry.get("reason") == "gpu-index-out-of-range" and entry.get("pod") == "ns/huge" for entry in logs)


def test_an_assumed_pod_without_a_valid_assume_time_expires_like_any_other() -> None:
    stale_ns = 60 * 10**9
    for bad in ({}, {gpushare.ANN_ASSUME_TIME: "soon"}, {gpushare.ANN_ASSUME_TIME: str(NOW_NS * 10)}):
        cache = four_gpus()
        cache.pod_changed(running("a", 4, "0", rv=1, **{gpushare.ANN_ASSIGNED: "false"}, **bad))
        assert cache.assumed_on("n", "ns/b", NOW_NS + 1, stale_ns) is not None
        assert cache.assumed_on("n", "ns/b", NOW_NS + stale_ns + 1, stale_ns) is None, bad
