"""gpushare's contract, as plain data: resource names, pod annotations, container env, and what a pod
dict says about them (pure: no Kubernetes client).

The scheduler extender writes the annotations at bind; the device plugin reads them at Allocate and
marks the pod assigned. Names and meanings are Aliyun gpushare's, so gpushare-era pods, configs and
``kubectl inspect gpushare`` keep working.
"""

from __future__ import annotations

from typing import Any

from labeller.model import quantity

Obj = dict[str, Any]

RESOURCE_MEM = "aliyun.com/gpu-mem"  # memory units (GiB by default, MiB by option)
RESOURCE_COUNT = "aliyun.com/gpu-count"  # GPUs on the node

# Pod annotations
ANN_IDX = "ALIYUN_COM_GPU_MEM_IDX"  # the chosen GPU's index
ANN_POD = "ALIYUN_COM_GPU_MEM_POD"  # the pod's total units
ANN_DEV = "ALIYUN_COM_GPU_MEM_DEV"  # the units of one GPU of the node
ANN_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"  # "false" at bind, "true" once the plugin allocated
ANN_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"  # bind time, Unix nanoseconds
ANN_ASSIGN_TIME = "ALIYUN_COM_GPU_MEM_ASSIGN_TIME"  # Allocate time, Unix nanoseconds
ANNOTATIONS = (ANN_IDX, ANN_POD, ANN_DEV, ANN_ASSIGNED, ANN_ASSUME_TIME, ANN_ASSIGN_TIME)

# Container environment given by the plugin
ENV_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ENV_POD = "ALIYUN_COM_GPU_MEM_POD"
ENV_CONTAINER = "ALIYUN_COM_GPU_MEM_CONTAINER"
ENV_DEV = "ALIYUN_COM_GPU_MEM_DEV"

FINISHED_PHASES = ("Succeeded", "Failed")


def _units(value: Any) -> int:
    """A quantity of gpu-mem units, read as the API server reads it ("4k" is 4000)."""
    return quantity.whole(value)


def container_requests(pod: Obj) -> list[tuple[str, int]]:
    """(container name, gpu-mem units) for each container asking for some: its limit, else its request
    (extended resources must have equal requests and limits; either may be written alone)."""
    found: list[tuple[str, int]] = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        amount = _units(limits.get(RESOURCE_MEM, requests.get(RESOURCE_MEM, 0)))
        if amount:
            found.append((str(container.get("name", "")), amount))
    return found


def pod_request(pod: Obj) -> int:
    """The pod's total gpu-mem units (0: the pod does not use memory sharing)."""
    return sum(amount for _, amount in container_requests(pod))


def pod_annotations(pod: Obj) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def assigned_gpu(pod: Obj) -> int | None:
    """The GPU index the extender chose for this pod, or None (not placed, or an unreadable annotation)."""
    value = pod_annotations(pod).get(ANN_IDX)
    if value is None:
        return None
    try:
        index = int(value)
    except ValueError:
        return None
    return index if index >= 0 else None


def is_assumed(pod: Obj) -> bool:
    """Placed by the extender and not yet allocated by the plugin."""
    return assigned_gpu(pod) is not None and pod_annotations(pod).get(ANN_ASSIGNED) == "false"


def assume_time(pod: Obj) -> int | None:
    """When the extender placed the pod, in Unix nanoseconds, or None."""
    try:
        return int(pod_annotations(pod)[ANN_ASSUME_TIME])
    except (KeyError, ValueError):
        return None


def is_finished(pod: Obj) -> bool:
    """The pod's containers no longer hold their GPU: it succeeded, failed or is being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES


def share_environment(gpu_index: int, container_units: int, gpu_units: int) -> dict[str, str]:
    """What gpushare's device plugin tells a container of its share: the GPU's index on the node, the
    container's units, the GPU's units (the pod's total is ``ENV_POD``)."""
    return {ENV_IDX: str(gpu_index), ENV_CONTAINER: str(container_units), ENV_DEV: str(gpu_units)}


def placement_annotations(gpu: int, pod_units: int, gpu_units: int, now_ns: int) -> dict[str, str]:
    """What the extender writes on a pod it binds (the plugin's side of the contract reads them)."""
    return {ANN_IDX: str(gpu), ANN_POD: str(pod_units), ANN_DEV: str(gpu_units), ANN_ASSIGNED: "false",
            ANN_ASSUME_TIME: str(now_ns)}


def pod_key(pod: Obj) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
