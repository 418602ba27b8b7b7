"""Allocate for GPUs shared by memory (``aliyun.com/gpu-mem``, gpushare's model): the container gets
the GPU the scheduler extender chose at bind, never a guess.

The kubelet sends Allocate the N memory units it picked for one container, without saying which
pod it serves. The extender has written its choice on the pod before binding it
(``ALIYUN_COM_GPU_MEM_IDX``, ``_ASSIGNED=false``, ``_ASSUME_TIME``), so ``PodMatcher``:

1. lists the Pending pods bound to this node (one LIST, field selector ``spec.nodeName`` and
   ``status.phase=Pending``, as gpushare) and keeps the assumed ones: IDX set, ASSIGNED false, not
   being deleted;
2. keeps those with a gpu-mem container that has not been allocated yet (tracked in memory, per pod
   UID) and asks for exactly N units. gpu-labeller's extender binds at most one assumed pod per node
   at a time (its per-node lock, released when the pod is ASSIGNED), so there is normally exactly one.
   With several (gpushare's own extender has no lock) the oldest assume time wins, and it is logged;
3. none: Allocate fails with a message naming the node, the request and why (the kubelet fails the
   pod with it) instead of a fake device name;
4. answers with the GPU at position IDX of ``aliyun.com/gpu-count`` (``NVIDIA_VISIBLE_DEVICES`` from the
   vendor's allocator, UUID or index per deviceIDStrategy) and gpushare's env, and after the pod's
   last gpu-mem container patches the pod ``ASSIGNED=true`` and ``ASSIGN_TIME`` (UnixNano), with the
   pod's resourceVersion as precondition (a 409 reads the pod again and retries).

One lock serialises Allocate and GetPreferredAllocation, which prefers the units of the candidate
pod's GPU so that the kubelet's device accounting matches the real GPU. The cost: one pod LIST per
call, and containers on one node are allocated one at a time (docs/memory-sharing.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from labeller.model import gpushare
from labeller.model.offer import PhysicalDevice, Resource
from labeller.apps.plugin.allocate import RequestError, Unmatched, response
from labeller.apps.plugin.api import api_pb2 as pb
from labeller.apps.plugin.preferred import preferred
from labeller.model.vendor.plugin import Allocate
from labeller.base.log import get_logger

log = get_logger(__name__)

Pod = dict[str, Any]
PATCH_ATTEMPTS = 5


class PodApi(Protocol):
    """What the matcher needs of the API server (``labeller.cluster.kube.Kube`` has it)."""

    def list_pods(self, field_selector: str | None = None,
                  label_selector: str | None = None) -> tuple[list[Pod], str]: ...

    def get_pod(self, namespace: str, name: str) -> Pod: ...

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None],
                              resource_version: str | None = None) -> Pod: ...


@dataclass(frozen=True)
class Match:
    """The container an Allocate call serves: its pod, its name, and the GPU chosen at bind."""

    pod: Pod
    container: str
    units: int
    gpu_index: int


def _uid(pod: Pod) -> str:
    return str(pod["metadata"].get("uid", ""))


class PodMatcher:
    """The pods behind this node's Allocate calls (see the module docstring). One per plugin process:
    it outlives the allocators that a config change replaces."""

    def __init__(self, api: PodApi | None, node: str, clock: Callable[[], int] = time.time_ns,
                 problem: str | None = None) -> None:
        self._api, self.node, self._clock = api, node, clock
        self._problem = problem  # why pods cannot be read at all (no node name, no credentials)
        self.lock = threading.Lock()
        self._allocated: dict[str, set[str]] = {}  # pod UID -> its containers allocated so far
        self._unpatched: set[str] = set()  # pods fully allocated whose ASSIGNED patch failed

    def _assumed(self) -> list[Pod]:
        if self._api is None:
            raise Unmatched(f"node {self.node or '(unknown)'}: cannot read this node's pods: {self._problem}")
        try:
            # A pod waits for Allocate while Pending: running pods, most of a node's, are not listed.
            pods, _ = self._api.list_pods(field_selector=f"spec.nodeName={self.node},status.phase=Pending")
        except Exception as exc:  # noqa: BLE001 - any API failure fails this Allocate with its reason
            raise Unmatched(f"node {self.node}: cannot list the pods bound to this node to find the one this "
                            f"allocation is for: {exc}") from None
        assumed = [p for p in pods if gpushare.is_assumed(p) and not gpushare.is_finished(p)]
        live = {_uid(p) for p in assumed}
        for uid in set(self._allocated) - live:  # assigned, deleted or finished: forget it
            del self._allocated[uid]
        self._unpatched &= live
        for pod in assumed:  # an earlier ASSIGNED patch failed: try again
            if _uid(pod) in self._unpatched and self._mark_assigned(pod):
                self._unpatched.discard(_uid(pod))
        return assumed

    def _waiting(self, pod: Pod) -> list[tuple[str, int]]:
        """The pod's gpu-mem containers not allocated yet, in spec order: (name, units)."""
        done = self._allocated.get(_uid(pod), set())
        return [(name, units) for name, units in gpushare.container_requests(pod) if name not in done]

    def find(self, units: int, unit: str) -> Match:
        """The container that asks for ``units`` (the caller holds ``lock``); Unmatched when none does."""
        assumed = self._assumed()
        fitting = [(pod, next(name for name, n in self._waiting(pod) if n == units)) for pod in assumed
                   if any(n == units for _, n in self._waiting(pod))]
        if not fitting:
            raise Unmatched(self._why_none(f"{units} {unit}", assumed))
        fitting.sort(key=lambda found: gpushare.assume_time(found[0]) or 0)
        pod, container = fitting[0]
        if len(fitting) > 1:
            log.warning("several assumed pods wait for this allocation; taking the oldest assume time",
                        reason="ambiguous-allocation", node=self.node, units=units, chosen=gpushare.pod_key(pod),
                        candidates=[gpushare.pod_key(p) for p, _ in fitting])
        index = gpushare.assigned_gpu(pod)
        assert index is not None  # is_assumed
        return Match(pod, container, units, index)

    def _why_none(self, size: str, assumed: Sequence[Pod]) -> str:
        where = (f"node {self.node}: no pod bound to this node waits to start a container of {size} "
                 f"of {gpushare.RESOURCE_MEM}")
        if not assumed:
            return (f"{where}: no pod here carries the scheduler extender's assumption ({gpushare.ANN_IDX} set, "
                    f"{gpushare.ANN_ASSIGNED}=false); is the pod scheduled through the gpushare scheduler extender?")
        waiting = "; ".join(f"{gpushare.pod_key(p)} waits for {[n for _, n in self._waiting(p)] or 'nothing'}"
                            for p in assumed)
        return f"{where} (assumed pods: {waiting})"

    def done(self, match: Match) -> None:
        """Record the container as allocated; after the pod's last one, mark the pod ASSIGNED."""
        self._allocated.setdefault(_uid(match.pod), set()).add(match.container)
        if not self._waiting(match.pod) and not self._mark_assigned(match.pod):
            self._unpatched.add(_uid(match.pod))

    def _mark_assigned(self, pod: Pod) -> bool:
        """Patch ASSIGNED=true and ASSIGN_TIME, retrying on 409 with the pod read again."""
        assert self._api is not None
        meta = pod["metadata"]
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        version = meta.get("resourceVersion")
        annotations = {gpushare.ANN_ASSIGNED: "true", gpushare.ANN_ASSIGN_TIME: str(self._clock())}
        for _ in range(PATCH_ATTEMPTS):
            try:
                self._api.patch_pod_annotations(namespace, name, annotations, resource_version=version)
                return True
            except Exception as exc:  # noqa: BLE001 - conflicts retry; anything else is logged, not fatal
                from labeller.cluster.kube import Conflict  # loaded already: the API client made this call

                if isinstance(exc, Conflict):
                    try:
                        fresh = self._api.get_pod(namespace, name)
                    except Exception as again:  # noqa: BLE001
                        exc = again
                    else:
                        if _uid(fresh) != _uid(pod):
                            return True  # deleted and re-created: nothing of ours to mark
                        version = fresh["metadata"].get("resourceVersion")
                        continue
                log.error("cannot mark the pod assigned; the extender keeps it assumed", reason="pod-patch-failed",
                          node=self.node, pod=f"{namespace}/{name}", error=str(exc))
                return False
        log.error("cannot mark the pod assigned: it keeps changing", reason="pod-patch-failed", node=self.node,
                  pod=f"{namespace}/{name}", attempts=PATCH_ATTEMPTS)
        return False


class MemoryAllocator:
    """Allocate and GetPreferredAllocation for ``aliyun.com/gpu-mem``; the plugin's service calls it
    like ``labeller.apps.plugin.allocate.Allocator``."""

    def __init__(self, resource: Resource, allocate: Allocate, matcher: PodMatcher, unit: str):
        self.resource, self._allocate, self._matcher, self._unit = resource, allocate, matcher, unit
        self._gpus: tuple[PhysicalDevice, ...] = resource.physical_devices  # position = ALIYUN_COM_GPU_MEM_IDX
        self._units = {p.health_key: sum(1 for d in resource.devices if d.physical.health_key == p.health_key)
                       for p in self._gpus}

    def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        if not request.container_requests:
            raise RequestError(f"{self.resource.name}: an Allocate request with no container requests")
        with self._matcher.lock:
            return pb.AllocateResponse(container_responses=[self.container(list(c.devices_ids))
                                                            for c in request.container_requests])

    def container(self, ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        started = time.perf_counter()
        self._check(ids)
        match = self._matcher.find(len(ids), self._unit)
        gpu = self._gpu(match)
        edits = self._allocate([gpu])
        edits.envs.update({gpushare.ENV_POD: str(gpushare.pod_request(match.pod)),
                           **gpushare.share_environment(match.gpu_index, match.units, self._units[gpu.health_key])})
        pod, node = gpushare.pod_key(match.pod), self._matcher.node
        picked = {d.physical.health_key for i in ids if (d := self.resource.device(i)) is not None}
        if picked != {gpu.health_key}:
            log.info("the kubelet's units name another GPU; the container gets the GPU chosen at bind",
                     node=node, pod=pod, device=gpu.visible_id, kubelet_units=sorted(ids)[:4])
        self._matcher.done(match)
        log.info("allocated by memory", node=node, pod=pod, container=match.container, units=match.units,
                 unit=self._unit, device=gpu.visible_id, index=match.gpu_index,
                 took_ms=round((time.perf_counter() - started) * 1000, 2))
        return response(edits)

    def _check(self, ids: Sequence[str]) -> None:
        if not ids:
            raise RequestError(f"{self.resource.name}: a container request with no device IDs")
        unknown = [i for i in ids if self.resource.device(i) is None]
        if unknown or len(set(ids)) != len(ids):
            raise RequestError(f"{self.resource.name}: unknown or repeated device ID(s): {', '.join(ids[:5])}")

    def _gpu(self, match: Match) -> PhysicalDevice:
        """The GPU the pod was bound to; Unmatched when this node has no such GPU or it is too small
        for the pod (an extender that took gpu-mem / gpu-count for every GPU of a node with mixed sizes)."""
        pod, node = gpushare.pod_key(match.pod), self._matcher.node
        if not 0 <= match.gpu_index < len(self._gpus):
            raise Unmatched(f"node {node}: pod {pod} was bound to GPU index {match.gpu_index} ({gpushare.ANN_IDX}), "
                            f"but this node shares {len(self._gpus)} GPU(s) by memory")
        gpu = self._gpus[match.gpu_index]
        wanted, has = gpushare.pod_request(match.pod), self._units[gpu.health_key]
        if wanted > has:
            raise Unmatched(f"node {node}: pod {pod} asks for {wanted} {self._unit} of {gpushare.RESOURCE_MEM} on GPU "
                            f"{match.gpu_index} ({gpu.visible_id}), which has {has} {self._unit}")
        return gpu

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int, policy: str) -> list[str]:
        """Units of the GPU the waiting pod was bound to, when there are enough; else the generic choice."""
        with self._matcher.lock:
            try:
                match = self._matcher.find(size, self._unit)
                gpu = self._gpu(match)
            except RequestError:
                return preferred(self.resource, available, must_include, size, policy)
        on_gpu = [i for i in available if (d := self.resource.device(i)) is not None
                  and d.physical.health_key == gpu.health_key and i not in must_include]
        chosen = [*dict.fromkeys(must_include), *on_gpu][:size]
        return chosen if len(chosen) == size else preferred(self.resource, available, must_include, size, policy)


class CountAllocator:
    """``aliyun.com/gpu-count`` tells the scheduler extender how many GPUs share their memory; a
    container asking for it would get a GPU that gpu-mem also hands out, so Allocate refuses it."""

    def __init__(self, resource: Resource):
        self.resource = resource

    def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        raise Unmatched(f"{self.resource.name} counts the GPUs shared by memory for the scheduler extender and "
                        f"cannot be allocated; request {gpushare.RESOURCE_MEM} instead")

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int, policy: str) -> list[str]:
        return []
