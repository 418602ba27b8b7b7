"""The own Node, as the processes on it see it: a cache of it kept true by a watch (``NodeCache``,
``NodeWatch``), its labels read once (``node_labels_reader``), and Events recorded on it
(``record_node_event``). The daemon and the config follower share them.

This module does not load the Kubernetes client: the adapter is imported where it is called.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from labeller.cluster.permissions import PermissionLog
from labeller.cluster.reflector import Obj, Reflector
from labeller.base.log import get_logger

if TYPE_CHECKING:
    from labeller.cluster.kube import Kube

log = get_logger("gpu_labeller.cluster")

Labels = Mapping[str, str]
LabelsObserver = Callable[[Labels | None], None]
V = TypeVar("V")


def _rv(obj: Mapping[str, Any]) -> int:
    text = str(obj.get("metadata", {}).get("resourceVersion") or "0")
    return int(text) if text.isdigit() else 0


def node_labels(obj: Mapping[str, Any]) -> dict[str, str]:
    """All of a Node's labels."""
    return dict(obj.get("metadata", {}).get("labels") or {})


class NodeCache(Generic[V]):
    """One Node as the watch (or the last write's answer) saw it, kept as ``view(node)``: what its
    holder cares about (the daemon: the labels it owns and who set them). Thread-safe. ``observers``
    get every newer view's labels (all of them, None when the Node is gone), in the order the views
    were stored, outside the lock that readers take."""

    def __init__(self, view: Callable[[Mapping[str, Any]], V], observers: Sequence[LabelsObserver] = ()) -> None:
        self.view = view
        self._lock = threading.Lock()
        # One put and its observers at a time. The watch's thread and the writer's (a write's answer)
        # both put: without it, a put preempted between storing and telling its observers could tell
        # them after a newer put had, and they would keep the older labels (the config follower then
        # kept a config the node no longer asked for).
        self._delivery = threading.Lock()
        self.synced = False
        self.exists = False
        self.live: V = view({})
        self.resource_version = 0
        self._synced = threading.Event()
        self.observers = tuple(observers)

    def put(self, obj: Mapping[str, Any] | None, *, gone_at: int = 0) -> bool:
        """Store a newer view of the node (None: it does not exist, as of resourceVersion ``gone_at``
        when known: a watch's DELETED, a list without it). True if its ``view`` changed (what the view
        leaves out, status and the like, does not count). A view older than the one stored, present
        or gone, is ignored: a write's answer can come back after the watch said the node was deleted."""
        with self._delivery:
            changed = self._put(obj, gone_at)
            if changed is None:
                return False
            labels = None if obj is None else node_labels(obj)
            for observer in self.observers:
                observer(labels)
        return changed

    def _put(self, obj: Mapping[str, Any] | None, gone_at: int) -> bool | None:
        """``put`` with the lock held; None when ``obj`` is older than what is stored."""
        with self._lock:
            self._synced.set()
            rv = gone_at if obj is None else _rv(obj)
            if self.synced and rv and rv < self.resource_version:
                return None
            if obj is None:
                changed = self.exists or not self.synced
                self.synced, self.exists, self.live = True, False, self.view({})
                self.resource_version = max(self.resource_version, rv)
                return changed
            live = self.view(obj)
            changed = not (self.synced and self.exists and live == self.live)
            self.synced, self.exists, self.live, self.resource_version = True, True, live, rv
            return changed

    def forget(self) -> None:
        """The view may be out of date (the watch failed): not synced until the next ``put``."""
        with self._lock:
            self.synced = False
            self._synced.clear()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    def snapshot(self) -> tuple[bool, bool, V]:
        """(synced, exists, view)."""
        with self._lock:
            return self.synced, self.exists, self.live


class NodeWatch(Generic[V]):
    """Keeps a NodeCache of the Node ``name`` current: a Reflector over a list with a field
    selector on the name, and the watch from there. ``notify`` whenever the view changes."""

    def __init__(self, kube: Kube, name: str, cache: NodeCache[V], stop: threading.Event,
                 permissions: PermissionLog, *, notify: Callable[[], None] = lambda: None,
                 watch_timeout_s: int = 300) -> None:
        self.name, self.cache, self.notify = name, cache, notify

        def list_node() -> tuple[list[Obj], str]:
            node, resource_version = kube.list_node(name)
            return ([] if node is None else [node]), resource_version

        self.reflector = Reflector("nodes", list_node, lambda rv, timeout_s: kube.watch_node(name, rv, timeout_s),
                                   replace=self._replace, changed=self._changed, stale=cache.forget, stop=stop,
                                   permissions=permissions, watch_timeout_s=watch_timeout_s, context={"node": name})

    def start(self) -> threading.Thread:
        return self.reflector.start(f"watch-{self.name}")

    def _replace(self, items: list[Obj], resource_version: str) -> None:
        gone_at = int(resource_version) if resource_version.isdigit() else 0
        if self.cache.put(items[0] if items else None, gone_at=gone_at):
            self.notify()

    def _changed(self, kind: str, obj: Obj) -> None:
        if self.cache.put(None, gone_at=_rv(obj)) if kind == "DELETED" else self.cache.put(obj):
            self.notify()


def node_labels_reader(kube: Kube, node: str) -> Callable[[], Labels]:
    """Reads the own Node's labels (none when the Node does not exist yet)."""
    from labeller.cluster.kube import NotFound

    def read() -> Labels:
        try:
            return node_labels(kube.get_node(node))
        except NotFound:
            return {}

    return read


def record_node_event(kube: Kube, node: str, namespace: str, kind: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the Node; a failure is only logged (what it reports has happened anyway)."""
    from labeller.cluster.kube import KubeError

    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{node}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
            "reason": reason, "message": message, "type": kind,
            "source": {"component": "gpu-labeller", "host": node},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1}
    try:
        kube.create_event(namespace, body)
    except KubeError as exc:
        log.warning("could not record an event", node=node, reason="event-failed", event=reason, error=exc.message)
