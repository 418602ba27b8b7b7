"""gpushare's contract read from pod dicts: requests, placement annotations, assumed and finished pods."""

from __future__ import annotations

from typing import Any

from labeller.model import gpushare


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None, phase: str = "Pending",
        deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "ns", "annotations": annotations or {}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "spec": {"containers": list(containers)}, "status": {"phase": phase}}


def container(name: str, limits: dict[str, str] | None = None,
              requests: dict[str, str] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "resources": resources}


def test_requests_are_per_container_limits_with_requests_as_fallback() -> None:
    shared = pod(container("a", limits={gpushare.RESOURCE_MEM: "3", "cpu": "1"}),
                 container("b", requests={gpushare.RESOURCE_MEM: "2"}),
                 container("c", limits={"memory": "1Gi"}),
                 container("d", limits={gpushare.RESOURCE_MEM: "4"}, requests={gpushare.RESOURCE_MEM: "1"}))
    assert gpushare.container_requests(shared) == [("a", 3), ("b", 2), ("d", 4)]
    assert gpushare.pod_request(shared) == 9


def test_a_pod_without_gpu_mem_asks_nothing_and_garbage_counts_as_nothing() -> None:
    assert gpushare.pod_request(pod(container("a", limits={"cpu": "1"}))) == 0
    assert gpushare.pod_request({"metadata": {"name": "bare"}}) == 0
    assert gpushare.pod_request(pod(container("a", limits={gpushare.RESOURCE_MEM: "lots"}))) == 0
    # The API server refuses a fraction of an extended resource; were one read, it rounds up as Quantity.Value().
    assert gpushare.pod_request(pod(container("a", limits={gpushare.RESOURCE_MEM: "1.5"}))) == 2


def test_placement_annotations_round_trip_through_the_readers() -> None:
    written = gpushare.placement_annotations(gpu=3, pod_units=5, gpu_units=16, now_ns=1_700_000_000_000_000_000)
    assert written == {"ALIYUN_COM_GPU_MEM_IDX": "3", "ALIYUN_COM_GPU_MEM_POD": "5", "ALIYUN_COM_GPU_MEM_DEV": "16",
                       "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
                       "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1700000000000000000"}
    placed = pod(container("a"), annotations=written)
    assert gpushare.assigned_gpu(placed) == 3
    assert gpushare.is_assumed(placed)
    assert gpushare.assume_time(placed) == 1_700_000_000_000_000_000


def test_an_allocated_pod_is_placed_but_no_longer_assumed() -> None:
    allocated = pod(annotations={gpushare.ANN_IDX: "0", gpushare.ANN_ASSIGNED: "true"})
    assert gpushare.assigned_gpu(allocated) == 0
    assert not gpushare.is_assumed(allocated)


def test_unreadable_annotations_mean_not_placed() -> None:
    for value in ("", "x", "-1"):
        assert gpushare.assigned_gpu(pod(annotations={gpushare.ANN_IDX: value})) is None
    unplaced = pod(annotations={gpushare.ANN_ASSIGNED: "false", gpushare.ANN_ASSUME_TIME: "soon"})
    assert not gpushare.is_assumed(unplaced)
    assert gpushare.assume_time(unplaced) is None


def test_finished_pods_are_succeeded_failed_or_being_deleted() -> None:
    assert gpushare.is_finished(pod(phase="Succeeded"))
    assert gpushare.is_finished(pod(phase="Failed"))
    assert gpushare.is_finished(pod(phase="Running", deleting=True))
    assert not gpushare.is_finished(pod(phase="Running"))
    assert not gpushare.is_finished(pod(phase="Pending"))


def test_env_names_are_gpushares() -> None:
    assert (gpushare.ENV_IDX, gpushare.ENV_POD, gpushare.ENV_CONTAINER, gpushare.ENV_DEV) == (
        "ALIYUN_COM_GPU_MEM_IDX", "ALIYUN_COM_GPU_MEM_POD", "ALIYUN_COM_GPU_MEM_CONTAINER", "ALIYUN_COM_GPU_MEM_DEV")
    assert (gpushare.RESOURCE_MEM, gpushare.RESOURCE_COUNT) == ("aliyun.com/gpu-mem", "aliyun.com/gpu-count")
