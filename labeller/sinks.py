"""Where the daemon's labels go: the Node (server-side apply, with a watch-fed cache of the live
labels), NFD's features.d file, or an NFD ``NodeFeature`` object.

The Kubernetes client is reached only through ``labeller.kube``, imported lazily, so the
features.d output and the dry-run path never import it.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from labeller.outputs import render, write_atomic
from labeller.reconcile import Backoff, Change, Labels, owned

if TYPE_CHECKING:
    from labeller.kube import Kube, Obj

log = structlog.get_logger("gpu_labeller.daemon")


class NodeMissing(Exception):
    """The Node object does not exist (yet)."""


class Sink(Protocol):
    """Where labels go. ``live`` gives the owned labels there now; ``write`` makes them ``change.labels``."""

    name: str

    def live(self) -> Labels: ...

    def write(self, change: Change) -> None: ...

    def close(self) -> None: ...


def _rv(obj: Mapping[str, Any]) -> int:
    text = str(obj.get("metadata", {}).get("resourceVersion") or "0")
    return int(text) if text.isdigit() else 0


class NodeCache:
    """The live Node as the watch (or the last write's answer) saw it. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.synced = False
        self.exists = False
        self.labels: Labels = {}
        self.resource_version = 0
        self._synced = threading.Event()

    def put(self, obj: Mapping[str, Any] | None) -> bool:
        """Store a newer view of the node (None: it does not exist). True if anything changed."""
        with self._lock:
            self._synced.set()
            if obj is None:
                changed = self.exists or not self.synced
                self.synced, self.exists, self.labels = True, False, {}
                return changed
            rv = _rv(obj)
            if self.synced and self.exists and rv and rv < self.resource_version:
                return False
            labels = dict(obj.get("metadata", {}).get("labels") or {})
            changed = not (self.synced and self.exists and labels == self.labels)
            self.synced, self.exists, self.labels, self.resource_version = True, True, labels, rv
            return changed

    def forget(self) -> None:
        with self._lock:
            self.synced = False
            self._synced.clear()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    def snapshot(self) -> tuple[bool, bool, Labels]:
        with self._lock:
            return self.synced, self.exists, dict(self.labels)


class NodeWatcher:
    """Keeps a NodeCache current: list this node, watch it from there, re-list on 410, back off on errors."""

    def __init__(self, kube: Kube, node: str, cache: NodeCache, watch_timeout_s: int = 300) -> None:
        self.kube, self.node, self.cache = kube, node, cache
        self.notify: Callable[[], None] = lambda: None
        self.stop = threading.Event()
        self.watch_timeout_s = watch_timeout_s
        self.backoff = Backoff(0.2, 10.0)
        self.thread = threading.Thread(target=self._run, name=f"watch-{node}", daemon=True)

    def attach(self, notify: Callable[[], None], stop: threading.Event) -> None:
        """Wake ``notify`` on every change; end when ``stop`` is set."""
        self.notify, self.stop = notify, stop

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        from labeller.kube import Gone, KubeError

        while not self.stop.is_set():
            try:
                self._list_then_watch()
            except Gone:
                log.info("watch expired, listing again", node=self.node, reason="gone")
                self.stop.wait(self.backoff.next())  # never a tight list-watch loop, even if 410 repeats
            except KubeError as exc:
                self.cache.forget()
                delay = self.backoff.next()
                log.warning("watch failed", node=self.node, reason="api-error", error=str(exc), retry_in_s=round(delay, 2))
                self.stop.wait(delay)

    def _list_then_watch(self) -> None:
        obj, rv = self.kube.list_node(self.node)
        if self.cache.put(obj):
            self.notify()
        self.backoff.reset()
        while not self.stop.is_set():
            timeout = int(self.watch_timeout_s * random.uniform(1.0, 1.2))
            for kind, obj in self.kube.watch_node(self.node, rv, timeout):
                rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                if kind == "BOOKMARK":
                    continue
                if self.cache.put(None if kind == "DELETED" else obj):
                    self.notify()
                if self.stop.is_set():
                    return


class NodeSink:
    """Server-side apply to the Node, reading the live labels from the watch cache (GET when the watch
    has not listed the node within ``sync_wait_s``)."""

    name = "node"

    def __init__(self, kube: Kube, node: str, cache: NodeCache | None = None, sync_wait_s: float = 0.5) -> None:
        self.kube, self.node = kube, node
        self.cache = cache or NodeCache()
        self.sync_wait_s = sync_wait_s if cache is not None else 0.0  # no cache given: nothing fills it

    def live(self) -> Labels:
        synced, exists, labels = self.cache.snapshot()
        if not synced:
            if not self.cache.wait_synced(self.sync_wait_s):
                self._refresh()
            synced, exists, labels = self.cache.snapshot()
        if not exists:
            raise NodeMissing(self.node)
        return owned(labels)

    def _refresh(self) -> None:
        from labeller.kube import NotFound

        try:
            self.cache.put(self.kube.get_node(self.node))
        except NotFound:
            self.cache.put(None)

    def write(self, change: Change) -> None:
        from labeller.kube import NotFound

        try:
            answer = self.kube.apply_node_labels(self.node, change.labels)
            leftovers = sorted(set(owned(_labels_of(answer))) - set(change.labels))
            if leftovers:
                # Owned by prefix but applied by someone else (kubectl, an older labeller): SSA
                # cannot remove them, a merge patch can.
                answer = self.kube.remove_node_labels(self.node, leftovers)
        except NotFound:
            self.cache.put(None)
            raise NodeMissing(self.node) from None
        self.cache.put(answer)

    def close(self) -> None:
        self.kube.close()


def _labels_of(obj: Mapping[str, Any]) -> Labels:
    return dict(obj.get("metadata", {}).get("labels") or {})


class FeaturesFileSink:
    """NFD's features.d file: rewritten atomically when labels change or the expiry draws near."""

    name = "features-file"

    def __init__(self, path: Path, expiry_s: float) -> None:
        self.path, self.expiry_s = path, expiry_s

    def live(self) -> Labels:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        labels: Labels = {}
        for line in text.splitlines():
            if line.startswith("# +expiry-time="):
                expiry = datetime.fromisoformat(line.split("=", 1)[1])
                if expiry - datetime.now(UTC) < timedelta(seconds=self.expiry_s / 2):
                    return {}  # about to expire: count it as absent so it is rewritten
            elif line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                labels[key] = value
        return owned(labels)

    def write(self, change: Change) -> None:
        expiry = datetime.now(UTC) + timedelta(seconds=self.expiry_s)
        write_atomic(self.path, render(change.labels, "nfd", expiry=expiry))

    def close(self) -> None:
        return None


class NodeFeatureSink:
    """An NFD ``NodeFeature`` object ``gpu-labeller-<node>``; replaced only when its labels differ."""

    name = "nodefeature"

    def __init__(self, kube: Kube, node: str, namespace: str) -> None:
        self.kube, self.node, self.namespace = kube, node, namespace
        self.object_name = f"gpu-labeller-{node}"
        self._current: Obj | None = None

    def live(self) -> Labels:
        self._current = self.kube.get_node_feature(self.namespace, self.object_name)
        if self._current is None:
            return {}
        return owned(self._current.get("spec", {}).get("labels") or {})

    def write(self, change: Change) -> None:
        body: Obj = {
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
            "metadata": {"name": self.object_name, "namespace": self.namespace,
                         "labels": {"nfd.node.kubernetes.io/node-name": self.node}},
            "spec": {"labels": dict(sorted(change.labels.items()))},
        }
        if self._current is None:
            self._current = self.kube.create_node_feature(self.namespace, body)
        else:
            body["metadata"]["resourceVersion"] = self._current["metadata"].get("resourceVersion")
            self._current = self.kube.replace_node_feature(self.namespace, self.object_name, body)

    def close(self) -> None:
        self.kube.close()
