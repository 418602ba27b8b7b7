"""Bind: choose the GPU, write gpushare's annotations, create the Binding; one pod per node at a time
awaits the device plugin.

The kubelet's Allocate call does not say which pod it serves. So that the plugin can always tell,
the binder holds a per-node allocation lock: a gpu-mem pod is bound to node N only when no other
gpu-mem pod on N is still *assumed* (annotated, ``ALIYUN_COM_GPU_MEM_ASSIGNED=false``, not finished,
assumed less than ``stale_s`` ago). The plugin then has exactly one candidate when Allocate comes,
and marks it assigned, which releases the node. A bind that waits longer than ``wait_s`` fails with
an error naming the pod in the way; the scheduler tries again later. Binds to one node are also
serialised in this process, so two concurrent binds never take the same free memory, and so are binds
of one pod, so a pod bound to two nodes at once is charged to one.

Whoever reaches ``/bind`` could otherwise bind any pod anywhere: the binder binds only what the
scheduler itself would ask for, a pending, unbound pod of one of ``scheduler_names`` that asks
gpu-mem, onto a node the cache knows to share GPU memory and where the pod fits now.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from labeller.model import gpushare
from labeller.apps.extender.cache import ShareCache
from labeller.cluster.kube import Conflict, Kube, KubeError
from labeller.base.log import get_logger

log = get_logger("gpu_labeller.extender")

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
    scheduler_names: tuple[str, ...] = ("default-scheduler",)  # the pods' schedulerName this extender binds for


class KeyedLocks:
    """One lock per key (a node, a pod), kept only while a bind holds or awaits it: the map never
    grows with the names callers made up."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}  # key -> (lock, binds holding or awaiting it)

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)

    @contextmanager
    def held(self, key: str, timeout_s: float) -> Iterator[bool]:
        """Holds ``key``'s lock within the block; yields False when it was not free within ``timeout_s``."""
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        acquired = lock.acquire(timeout=timeout_s)
        try:
            yield acquired
        finally:
            if acquired:
                lock.release()
            with self._guard:
                users = self._locks[key][1] - 1
                if users:
                    self._locks[key] = (lock, users)
                else:
                    del self._locks[key]


class Binder:
    def __init__(self, kube: Kube, cache: ShareCache, options: BindOptions = BindOptions(),
                 clock_ns: Callable[[], int] = time.time_ns,
                 observe_wait: Callable[[float], None] = lambda seconds: None) -> None:
        self.kube, self.cache, self.options = kube, cache, options
        self._clock_ns = clock_ns
        self._observe_wait = observe_wait
        self._node_locks = KeyedLocks()
        self._pod_locks = KeyedLocks()

    @property
    def locked_nodes(self) -> int:
        """Nodes with a bind holding or awaiting their lock now."""
        return len(self._node_locks)

    def _get(self, namespace: str, name: str, uid: str) -> Obj:
        try:
            pod = self.kube.get_pod(namespace, name)
        except KubeError as exc:
            raise BindError(f"pod {namespace}/{name}: cannot read it: {exc}") from None
        if uid and pod["metadata"].get("uid") != uid:
            raise BindError(f"pod {namespace}/{name}: its uid changed (deleted and created again); not bound")
        return pod

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind the pod to ``node`` on a GPU of it; BindError says why not."""
        started = time.monotonic()
        with self._pod_locks.held(f"{namespace}/{name}", self.options.wait_s) as free:
            if not free:
                raise BindError(f"pod {namespace}/{name}: another bind of this pod is under way; not bound")
            pod = self._get(namespace, name, uid)
            request = self._bindable(pod)
            if self.cache.gpus(node) is None:
                raise BindError(f"node {node}: not a node this extender knows to share GPU memory; not bound")
            if (unfit := self.cache.unfit(node, request)) is not None:
                raise BindError(f"node {node}: {unfit}")
            self._bind_on_gpu(pod, request, node, started)

    def _bindable(self, pod: Obj) -> int:
        """The pod's gpu-mem units when the scheduler could be asking to bind it, else BindError."""
        key, spec = gpushare.pod_key(pod), pod.get("spec") or {}
        if spec.get("nodeName"):
            raise BindError(f"pod {key}: already bound to node {spec['nodeName']}; not bound")
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase != "Pending":
            raise BindError(f"pod {key}: not pending (phase {phase}); not bound")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise BindError(f"pod {key}: being deleted; not bound")
        scheduler = spec.get("schedulerName") or "default-scheduler"
        if scheduler not in self.options.scheduler_names:
            raise BindError(f'pod {key}: its schedulerName is "{scheduler}", not one of this extender\'s '
                            f"({', '.join(self.options.scheduler_names)}); not bound")
        request = gpushare.pod_request(pod)
        if not request:
            raise BindError(f"pod {key}: asks no {gpushare.RESOURCE_MEM}; not bound")
        return request

    def _bind_on_gpu(self, pod: Obj, request: int, node: str, started: float) -> None:
        key = gpushare.pod_key(pod)
        # One deadline for the queue of binds to this node and for the wait on the assumed pod, so that
        # the scheduler hears an answer within --bind-wait however many binds wait for the node.
        with self._node_locks.held(node, max(0.0, started + self.options.wait_s - time.monotonic())) as free:
            if not free:
                self._observe_wait(time.monotonic() - started)
                raise BindError(f"node {node}: other binds to this node are still waiting for the device plugin; "
                                "the scheduler will try again")
            waited_s = self._await_allocation(node, key, started)
            patched, gpu = self._annotate(pod, request, node)
            self.cache.place(patched, node)
            try:
                self._create_binding(patched, node)
            except BindError:
                self.cache.release(key)
                raise
        log.info("bound", reason="bind", pod=key, node=node, device=gpu, units=request,
                 waited_ms=round(waited_s * 1000, 1))

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
            raise BindError(f"pod {metadata['namespace']}/{metadata['name']}: binding to node {node} "
                            f"failed: {exc}") from None
