"""Bind: choose the GPU, write gpushare's annotations, create the Binding; one pod per node at a time
awaits the device plugin.

The kubelet's Allocate call does not say which pod it serves. So that the plugin can always tell,
the binder holds a per-node allocation lock: a gpu-mem pod is bound to node N only when no other
gpu-mem pod on N is still *assumed* (annotated, ``ALIYUN_COM_GPU_MEM_ASSIGNED=false``, not finished,
assumed less than ``stale_s`` ago). The plugin then has exactly one candidate when Allocate comes,
and marks it assigned, which releases the node. A bind that waits longer than ``wait_s`` fails with
an error naming the pod in the way; the scheduler tries again later. Binds to one node are also
serialised in this process, so two concurrent binds never take the same free memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from labeller import gpushare
from labeller.extender.cache import ShareCache
from labeller.cluster.kube import Conflict, Kube, KubeError

log = structlog.get_logger("gpu_labeller.extender")

Obj = gpushare.Obj


class BindError(Exception):
    """The pod was not bound; the message (one line) goes back to the scheduler."""


@dataclass(frozen=True)
class BindOptions:
    policy: str = "binpack"
    # How long a bind waits for the node's previous pod to be allocated: below the kube-scheduler's
    # default extender httpTimeout (5 s), so the scheduler hears the answer.
    wait_s: float = 4.0
    stale_s: float = 60.0  # an assumed pod older than this no longer holds the node
    attempts: int = 3  # annotation patches tried on resourceVersion conflicts


class Binder:
    def __init__(self, kube: Kube, cache: ShareCache, options: BindOptions = BindOptions(),
                 clock_ns: Callable[[], int] = time.time_ns,
                 observe_wait: Callable[[float], None] = lambda seconds: None) -> None:
        self.kube, self.cache, self.options = kube, cache, options
        self._clock_ns = clock_ns
        self._observe_wait = observe_wait
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _node_lock(self, node: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(node, threading.Lock())

    def _get(self, namespace: str, name: str, uid: str) -> Obj:
        try:
            pod = self.kube.get_pod(namespace, name)
        except KubeError as exc:
            raise BindError(f"pod {namespace}/{name}: cannot read it: {exc}") from None
        if uid and pod["metadata"].get("uid") != uid:
            raise BindError(f"pod {namespace}/{name}: its uid changed (deleted and created again); not bound")
        return pod

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind the pod to ``node`` (on a GPU of it when it asks gpu-mem); BindError says why not."""
        pod = self._get(namespace, name, uid)
        request = gpushare.pod_request(pod)
        if not request:
            self._create_binding(pod, node)
            return
        key = gpushare.pod_key(pod)
        started = time.monotonic()
        lock = self._node_lock(node)
        # One deadline for the queue of binds to this node and for the wait on the assumed pod, so that
        # the scheduler hears an answer within --bind-wait however many binds wait for the node.
        if not lock.acquire(timeout=self.options.wait_s):
            self._observe_wait(time.monotonic() - started)
            raise BindError(f"node {node}: other binds to this node are still waiting for the device plugin; "
                            "the scheduler will try again")
        try:
            waited_s = self._await_allocation(node, key, started)
            patched, gpu = self._annotate(pod, request, node)
            self.cache.place(patched, node)
            try:
                self._create_binding(patched, node)
            except BindError:
                self.cache.release(key)
                raise
        finally:
            lock.release()
        log.info("bound", reason="bind", pod=key, node=node, device=gpu, units=request, waited_ms=round(waited_s * 1000, 1))

    def _await_allocation(self, node: str, key: str, started: float) -> float:
        """Wait until no other pod on ``node`` awaits Allocate; the seconds waited since ``started``, or BindError."""
        deadline = started + self.options.wait_s
        stale_ns = int(self.options.stale_s * 1e9)
        while (waiting := self.cache.assumed_on(node, key, self._clock_ns(), stale_ns)) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                self._observe_wait(time.monotonic() - started)
                age = f", bound {(self._clock_ns() - waiting.assume_ns) / 1e9:.1f}s ago"
                raise BindError(f"node {node}: pod {waiting.key} still awaits its GPU from the device plugin{age}; "
                                f"one pod per node at a time awaits Allocate, the scheduler will try again")
            self.cache.wait(min(left, 0.5))
        waited = time.monotonic() - started
        self._observe_wait(waited)
        return waited

    def _annotate(self, pod: Obj, request: int, node: str) -> tuple[Obj, int]:
        """Write the placement with the pod's resourceVersion (retrying on conflicts); (pod, GPU)."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for _ in range(self.options.attempts):
            if (pod.get("spec") or {}).get("nodeName"):
                raise BindError(f"pod {namespace}/{name}: already bound to node {pod['spec']['nodeName']}")
            choice = self.cache.choose(node, request, self.options.policy)
            if isinstance(choice, str):
                raise BindError(f"node {node}: {choice}")
            gpu, units = choice
            annotations = gpushare.placement_annotations(gpu, request, units, self._clock_ns())
            try:
                patched = self.kube.patch_pod_annotations(namespace, name, annotations,
                                                          resource_version=str(pod["metadata"]["resourceVersion"]))
                return patched, gpu
            except Conflict:
                pod = self._get(namespace, name, str(pod["metadata"].get("uid", "")))
            except KubeError as exc:
                raise BindError(f"pod {namespace}/{name}: cannot write its GPU annotations: {exc}") from None
        raise BindError(f"pod {namespace}/{name}: changed under every one of {self.options.attempts} annotation writes")

    def _create_binding(self, pod: Obj, node: str) -> None:
        metadata = pod["metadata"]
        try:
            self.kube.bind_pod(metadata["namespace"], metadata["name"], str(metadata.get("uid", "")), node)
        except KubeError as exc:
            raise BindError(f"pod {metadata['namespace']}/{metadata['name']}: binding to node {node} failed: {exc}") from None
