"""The cluster as the extender sees it: shared nodes, the pods placed on their GPUs, unhealthy GPUs.

Fed by ``feed`` (list, then watch) and by the binder's own writes, so a placement counts from the
moment it is decided, before the watch reports it. All state sits behind one lock; each node's free
memory per GPU is kept up to date on every change, so a filter over 1,000 nodes reads numbers
instead of adding up pods.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from labeller.model import gpushare, quantity
from labeller.apps.extender import placement
from labeller.apps.extender.placement import Gpus
from labeller.base.log import get_logger

Obj = dict[str, Any]
UNHEALTHY_PREFIX = "unhealthy-gpu-"  # gpushare's ConfigMap kube-system/unhealthy-gpu-<node>, key "gpus"
UNHEALTHY_KEY = "gpus"
# An assume time further ahead than this is not believed: the pod counts as assumed when first seen.
CLOCK_SKEW_NS = 60 * 10**9

log = get_logger("gpu_labeller.extender")


@dataclass(frozen=True)
class Placed:
    """A pod holding memory on one GPU of a node."""

    namespace: str
    name: str
    uid: str
    node: str
    gpu: int
    units: int
    assumed: bool  # bound to its GPU by the extender, not yet allocated by the device plugin
    assume_ns: int  # when it was bound (its annotation), else when this cache first saw it assumed

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def node_gpus(node: Obj) -> tuple[int, int] | None:
    """(GPU count, units per GPU) from a Node's capacity (gpushare's rule: gpu-mem / gpu-count), or None."""
    capacity = (node.get("status") or {}).get("capacity") or {}
    memory, count = (quantity.whole(capacity.get(gpushare.RESOURCE_MEM)),
                     quantity.whole(capacity.get(gpushare.RESOURCE_COUNT)))
    return (count, memory // count) if count > 0 and memory > 0 else None


def unhealthy_gpus(config_map: Obj) -> frozenset[int]:
    """The GPU indices a ``unhealthy-gpu-<node>`` ConfigMap lists ("0,2"); words that are not indices are skipped."""
    text = str(((config_map.get("data") or {}).get(UNHEALTHY_KEY)) or "")
    return frozenset(int(word) for word in text.replace(" ", "").split(",") if word.isdigit())


def _rv(obj: Obj) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class ShareCache:
    """What every shared node holds. A pod's GPU and size are the first assignment seen for it (its
    uid): its owner can edit the annotations later, but the edits move, hide or resize nothing."""

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self.lock = threading.Condition()
        self._shape: dict[str, tuple[int, int]] = {}  # node -> (count, units)
        self._unhealthy: dict[str, frozenset[int]] = {}
        self._used: dict[str, dict[int, int]] = {}  # node -> GPU index -> units placed on it
        self._free: dict[str, list[int | None]] = {}  # shared nodes only
        self._best: dict[str, int] = {}  # shared node -> most free units on one healthy GPU (-1: none)
        self._pods: dict[str, Placed] = {}
        self._on_node: dict[str, set[str]] = {}  # node -> keys of the pods placed on it
        self._seen_rv: dict[str, int] = {}  # pod key -> newest resourceVersion applied
        self._binding: dict[str, str] = {}  # pod key -> node, from the binder's decision until the pod shows it
        self.synced: set[str] = set()

    # -- what a node is
    def gpus(self, node: str) -> Gpus | None:
        shape = self._shape.get(node)
        return None if shape is None else Gpus(shape[0], shape[1], self._unhealthy.get(node, frozenset()))

    def _refresh(self, node: str) -> None:
        gpus = self.gpus(node)
        if gpus is None:
            self._free.pop(node, None)
            self._best.pop(node, None)
        else:
            used = self._used.get(node, {})
            free = placement.free_memory(gpus, [used.get(index, 0) for index in range(gpus.count)])
            self._free[node] = free
            self._best[node] = max((units for units in free if units is not None), default=-1)
        self.lock.notify_all()

    # -- nodes
    def node_changed(self, node: Obj) -> None:
        name = str(node["metadata"]["name"])
        shape = node_gpus(node)
        with self.lock:
            if shape == self._shape.get(name):
                return
            if shape is None:
                self._shape.pop(name, None)
            else:
                self._shape[name] = shape
            self._refresh(name)

    def node_deleted(self, node: Obj) -> None:
        name = str(node["metadata"]["name"])
        with self.lock:
            self._shape.pop(name, None)
            self._refresh(name)

    def replace_nodes(self, nodes: Iterable[Obj]) -> None:
        with self.lock:
            listed = {str(node["metadata"]["name"]): node_gpus(node) for node in nodes}
            for name in set(self._shape) | set(listed):
                shape = listed.get(name)
                if shape != self._shape.get(name):
                    if shape is None:
                        self._shape.pop(name, None)
                    else:
                        self._shape[name] = shape
                    self._refresh(name)
            self.synced.add("nodes")

    # -- unhealthy GPUs (ConfigMaps of kube-system)
    def config_map_changed(self, config_map: Obj, deleted: bool = False) -> None:
        name = str(config_map["metadata"]["name"])
        if not name.startswith(UNHEALTHY_PREFIX):
            return
        node = name[len(UNHEALTHY_PREFIX):]
        with self.lock:
            if deleted:
                self._unhealthy.pop(node, None)
            else:
                self._unhealthy[node] = unhealthy_gpus(config_map)
            self._refresh(node)

    def replace_config_maps(self, config_maps: Iterable[Obj]) -> None:
        with self.lock:
            before = set(self._unhealthy)
            self._unhealthy = {str(cm["metadata"]["name"])[len(UNHEALTHY_PREFIX):]: unhealthy_gpus(cm)
                               for cm in config_maps if str(cm["metadata"]["name"]).startswith(UNHEALTHY_PREFIX)}
            for node in before | set(self._unhealthy):
                self._refresh(node)
            self.synced.add("configmaps")

    # -- pods
    def _placed(self, pod: Obj) -> Placed | None:
        """What the pod holds, or None: no gpu-mem, no GPU chosen, finished, or on no node. A pod
        already counted keeps its GPU and size whatever its annotations say now."""
        if gpushare.is_finished(pod):
            return None
        metadata = pod["metadata"]
        key = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
        uid = str(metadata.get("uid", ""))
        old = self._pods.get(key)
        if old is not None and old.uid == uid:
            return self._kept(old, pod)
        units = gpushare.pod_request(pod)
        gpu = gpushare.assigned_gpu(pod)
        node = (pod.get("spec") or {}).get("nodeName") or self._binding.get(key)
        if not units or gpu is None or not node:
            return None
        shape = self._shape.get(str(node))
        if shape is not None and gpu >= shape[0]:
            log.warning("pod names a GPU its node does not have; not counted", reason="gpu-index-out-of-range",
                        pod=key, node=node, device=gpu, gpus=shape[0])
            return None
        assumed = gpushare.is_assumed(pod)
        return Placed(str(metadata.get("namespace", "")), str(metadata.get("name", "")), uid, str(node), gpu, units,
                      assumed, self._assume_ns(pod, None))

    def _kept(self, old: Placed, pod: Obj) -> Placed:
        """``old`` with the pod's allocation state now; an edited GPU index or size is logged and ignored."""
        gpu, units = gpushare.assigned_gpu(pod), gpushare.pod_request(pod)
        if (gpu, units) != (old.gpu, old.units):
            log.warning("pod's GPU annotations changed after placement; keeping the first", reason="placement-edited",
                        pod=old.key, node=old.node, device=old.gpu, units=old.units, annotated_device=gpu,
                        annotated_units=units)
        assumed = gpu is not None and gpushare.is_assumed(pod)
        return dataclasses.replace(old, assumed=assumed, assume_ns=self._assume_ns(pod, old))

    def _assume_ns(self, pod: Obj, old: Placed | None) -> int:
        """The pod's assume time when it is believable, else the one already known, else now."""
        now = self._clock_ns()
        annotated = gpushare.assume_time(pod)
        if annotated is not None and 0 < annotated <= now + CLOCK_SKEW_NS:
            return annotated
        return old.assume_ns if old is not None else now

    def _put(self, key: str, placed: Placed | None) -> None:
        old = self._pods.pop(key, None)
        if old is not None:
            self._used[old.node][old.gpu] -= old.units
            self._on_node[old.node].discard(key)
            if not self._on_node[old.node]:
                del self._on_node[old.node], self._used[old.node]
        if placed is not None:
            self._pods[key] = placed
            used = self._used.setdefault(placed.node, {})
            used[placed.gpu] = used.get(placed.gpu, 0) + placed.units
            self._on_node.setdefault(placed.node, set()).add(key)
        for node in {n.node for n in (old, placed) if n is not None}:
            self._refresh(node)

    def pod_changed(self, pod: Obj) -> None:
        key = gpushare.pod_key(pod)
        rv = _rv(pod)
        with self.lock:
            if rv and rv < self._seen_rv.get(key, 0):
                return  # older than what the binder already wrote
            if (pod.get("spec") or {}).get("nodeName"):
                self._binding.pop(key, None)
            placed = self._placed(pod)
            if placed is None and key not in self._pods:
                self._seen_rv.pop(key, None)
                return
            self._seen_rv[key] = rv
            self._put(key, placed)

    def pod_deleted(self, pod: Obj) -> None:
        key = gpushare.pod_key(pod)
        with self.lock:
            self._seen_rv.pop(key, None)
            self._binding.pop(key, None)
            if key in self._pods:
                self._put(key, None)

    def replace_pods(self, pods: Iterable[Obj], list_rv: str) -> None:
        """The listed pods are the truth, except what was written after the list was taken."""
        try:
            since = int(list_rv)
        except ValueError:
            since = 0
        with self.lock:
            listed = set()
            for pod in pods:
                listed.add(gpushare.pod_key(pod))
                self.pod_changed(pod)
            for key in [k for k in self._pods if k not in listed and self._seen_rv.get(k, 0) <= since]:
                self._seen_rv.pop(key, None)
                self._put(key, None)
            self.synced.add("pods")

    # -- the binder's own writes
    def place(self, pod: Obj, node: str) -> None:
        """Count the pod (its placement annotations just written) on ``node`` before it is bound."""
        with self.lock:
            self._binding[gpushare.pod_key(pod)] = node
            self.pod_changed(pod)

    def release(self, key: str) -> None:
        """The binding failed: the pod holds nothing until it is placed again."""
        with self.lock:
            if self._binding.pop(key, None) is not None and key in self._pods:
                self._put(key, None)

    # -- questions
    def free(self, node: str) -> list[int | None] | None:
        with self.lock:
            free = self._free.get(node)
            return None if free is None else list(free)

    def filter(self, nodes: Iterable[str], request: int) -> tuple[list[str], dict[str, str]]:
        """The nodes where one GPU has ``request`` units free, and why each other node fails."""
        passed: list[str] = []
        failed: dict[str, str] = {}
        with self.lock:
            best = self._best
            for node in nodes:
                if best.get(node, -1) >= request:
                    passed.append(node)
                else:
                    failed[node] = (placement.unfit_reason(self.gpus(node), self._free.get(node, ()), request)
                                    or "no fit")
        return passed, failed

    def scores(self, nodes: Iterable[str], request: int, policy: str) -> list[tuple[str, int]]:
        with self.lock:
            return [(node, placement.score(self._free.get(node, ()), request, self._shape.get(node, (0, 0))[1], policy))
                    for node in nodes]

    def unfit(self, node: str, request: int) -> str | None:
        """Why ``request`` units fit on no GPU of ``node`` now, or None."""
        with self.lock:
            return placement.unfit_reason(self.gpus(node), self._free.get(node, ()), request)

    def choose(self, node: str, request: int, policy: str) -> tuple[int, int] | str:
        """(GPU index, units of one GPU) for the pod on ``node``, or why it does not fit."""
        with self.lock:
            gpus, free = self.gpus(node), self._free.get(node, [])
            index = placement.choose(free, request, policy)
            if gpus is None or index is None:
                return placement.unfit_reason(gpus, free, request) or "no fit"
            return index, gpus.units

    def assumed_on(self, node: str, except_key: str, now_ns: int, stale_ns: int) -> Placed | None:
        """A pod on ``node`` that still waits for the device plugin's Allocate (not stale), or None."""
        with self.lock:
            for key in self._on_node.get(node, ()):
                placed = self._pods[key]
                if key != except_key and placed.assumed and now_ns - placed.assume_ns < stale_ns:
                    return placed
        return None

    def wait(self, timeout_s: float) -> None:
        """Until the next change, or ``timeout_s``."""
        with self.lock:
            self.lock.wait(timeout_s)

    @property
    def counts(self) -> tuple[int, int]:
        """(shared nodes, placed pods)."""
        with self.lock:
            return len(self._shape), len(self._pods)

    def inspect(self, node: str | None = None) -> list[Obj]:
        """Per shared node and GPU: total, used, free and the pods (gpushare's inspect shape plus
        ``freeGPU`` and ``healthy``); units are the plugin's (GiB by default)."""
        with self.lock:
            names = sorted(self._shape) if node is None else [node] if node in self._shape else []
            return [self._inspect_node(name) for name in names]

    def _inspect_node(self, name: str) -> Obj:
        gpus = self.gpus(name)
        assert gpus is not None
        pods = sorted((self._pods[key] for key in self._on_node.get(name, ())), key=lambda p: p.key)
        devices = []
        for index, free in enumerate(self._free[name]):
            on_gpu = [p for p in pods if p.gpu == index]
            used = sum(p.units for p in on_gpu)
            devices.append({"id": index, "totalGPU": gpus.units, "usedGPU": used,
                            "freeGPU": 0 if free is None else free, "healthy": free is not None,
                            "pods": [{"name": p.name, "namespace": p.namespace, "usedGPU": p.units,
                                      "assumed": p.assumed} for p in on_gpu]})
        return {"name": name, "totalGPU": gpus.units * gpus.count, "usedGPU": sum(p.units for p in pods),
                "devs": devices}
