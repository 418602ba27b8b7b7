"""Where the daemon's labels go: the Node (server-side apply, with the cluster layer's watch-fed
cache of the live labels), NFD's features.d file, or an NFD ``NodeFeature`` object; ``EventSink``
wraps any of them to record a Kubernetes Event per change. ``make_sink`` builds what ``run`` asks for.

A sink reads what is there now (``live``, the ownership boundary on the way in: only keys under
gpu-labeller's prefixes, with who set each) and carries out a ``Change`` (``write``). It raises only
the ``SinkError`` kinds below, whatever API or file lies behind it, so the loop never sees the
client's errors. The Kubernetes client is reached only through ``labeller.cluster.kube``, imported
lazily, so the features.d output and the dry-run path never import it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from labeller.cluster.nodes import NodeCache, NodeWatch, record_node_event
from labeller.cluster.permissions import PermissionLog
from labeller.apps.daemon.reconcile import Change, Live
from labeller.model.documents import DocumentError, not_a_regular_file, read_limited
from labeller.base.outputs import render, write_atomic

if TYPE_CHECKING:
    from labeller.cluster.kube import Forbidden, Kube, Obj

WRITTEN_BY = "# Written by gpu-labeller"  # first line of every features.d file gpu-labeller writes
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-labeller")  # label on every NodeFeature it creates
OUTPUTS = ("node", "features-file", "nodefeature")


# --- what a sink may raise -----------------------------------------------------------------------

class SinkError(Exception):
    """The output could not be read or written; ``str()`` says why, in one line."""


class Unavailable(SinkError):
    """Try again later: the API did not answer or failed (5xx, 429, timeouts), or the file could not be written."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Stale(SinkError):
    """The target changed between reading and writing (a 409): read again and plan again."""


class PermissionDenied(SinkError):
    """A 403. RBAC refused ``verb`` on ``resource`` to ``identity``; or, with ``identity`` None,
    something else refused (an admission policy): ``message`` says what."""

    def __init__(self, verb: str, resource: str, identity: str | None, message: str) -> None:
        super().__init__(message)
        self.verb, self.resource, self.identity, self.message = verb, resource, identity, message

    @classmethod
    def of(cls, exc: Forbidden) -> PermissionDenied:
        return cls(exc.verb, exc.resource, exc.identity, exc.message)


class NodeMissing(SinkError):
    """The Node object does not exist (yet)."""


class NotOurs(SinkError):
    """The output's target exists but gpu-labeller did not write it: it is never replaced or removed."""


@contextmanager
def _api_errors() -> Iterator[None]:
    """The Kubernetes adapter's errors, as sink errors."""
    from labeller.cluster.kube import Conflict, Forbidden, KubeError

    try:
        yield
    except Forbidden as exc:
        raise PermissionDenied.of(exc) from None
    except Conflict as exc:
        raise Stale(exc.message) from None
    except KubeError as exc:
        raise Unavailable(str(exc), exc.status) from None


class Sink(Protocol):
    """Where labels go. ``live`` says what is there now and who set it; ``write`` carries out a Change."""

    name: str

    def start(self, on_change: Callable[[], None], stop: threading.Event, permissions: PermissionLog) -> None:
        """Begin following the target, if it can change under us: ``on_change`` whenever it does."""

    def live(self) -> Live: ...

    def write(self, change: Change) -> None: ...

    def close(self) -> None: ...


class NodeSink:
    """Server-side apply to the Node. With ``watch`` (the daemon) it lists and watches its Node from
    ``start`` on and reads the live labels from that cache, falling back to a GET when the watch has
    not listed the node within ``sync_wait_s``; without (``--once``, ``cleanup``) every ``live`` is a GET."""

    name = "node"

    def __init__(self, kube: Kube, node: str, *, watch: bool = False, sync_wait_s: float = 0.5,
                 watch_timeout_s: int = 300,
                 observers: Sequence[Callable[[Mapping[str, str] | None], None]] = ()) -> None:
        self.kube, self.node = kube, node
        self.cache = NodeCache(Live.of_node, observers)
        self.watch, self.watch_timeout_s = watch, watch_timeout_s
        self.sync_wait_s = sync_wait_s if watch else 0.0
        self.watcher: NodeWatch[Live] | None = None

    def start(self, on_change: Callable[[], None], stop: threading.Event, permissions: PermissionLog) -> None:
        if self.watch and self.watcher is None:
            self.watcher = NodeWatch(self.kube, self.node, self.cache, stop, permissions, notify=on_change,
                                     watch_timeout_s=self.watch_timeout_s)
            self.watcher.start()

    def live(self) -> Live:
        synced, exists, live = self.cache.snapshot()
        if not synced or self.watcher is None:
            if self.watcher is None or not self.cache.wait_synced(self.sync_wait_s):
                self._refresh()
            synced, exists, live = self.cache.snapshot()
        if not exists:
            raise NodeMissing(f"node {self.node} not found")
        return live

    def _refresh(self) -> None:
        from labeller.cluster.kube import NotFound

        with _api_errors():
            try:
                self.cache.put(self.kube.get_node(self.node))
            except NotFound:
                self.cache.put(None)

    def write(self, change: Change) -> None:
        """Apply ``change.labels`` when needed, then merge-patch out the keys an apply cannot drop."""
        from labeller.cluster.kube import NotFound

        answer = None
        with _api_errors():
            try:
                if change.apply:
                    answer = self.kube.apply_node_labels(self.node, change.labels)
                    self.cache.put(answer)
                if change.patch_out:
                    answer = self._patch_out(change.patch_out)
            except NotFound:
                self.cache.put(None)
                raise NodeMissing(f"node {self.node} not found") from None
        if answer is not None:
            self.cache.put(answer)

    def _patch_out(self, keys: Mapping[str, tuple[str, ...]]) -> Obj | None:
        """Remove ``keys`` (key -> its managers when the change was planned) with a merge patch, but only
        those no new manager has set since; the resourceVersion precondition turns a race into a 409."""
        _, _, live = self.cache.snapshot()
        still = sorted(key for key, names in keys.items() if key in live.labels and set(live.names(key)) <= set(names))
        if not still:
            return None
        return self.kube.remove_node_labels(self.node, still, live.resource_version or None)

    def last_seen(self) -> Live:
        """The Node as the last read or write's answer showed it."""
        return self.cache.snapshot()[2]

    def close(self) -> None:
        self.kube.close()


class FeaturesFileSink:
    """NFD's features.d file: rewritten atomically when labels change or the expiry draws near.

    A file at the path that gpu-labeller did not write (no ``WRITTEN_BY`` first line) is never
    replaced: ``live`` and ``write`` raise NotOurs."""

    name = "features-file"

    def __init__(self, path: Path, expiry_s: float) -> None:
        self.path, self.expiry_s = path, expiry_s

    def start(self, on_change: Callable[[], None], stop: threading.Event, permissions: PermissionLog) -> None:
        return None  # only gpu-labeller writes the file: nothing to follow

    def _ours(self) -> str | None:
        """Our file's text; None when there is none."""
        if not os.path.lexists(self.path):
            return None
        kind = not_a_regular_file(self.path)
        if kind is not None:
            raise NotOurs(f"{self.path} is {kind}; it is left as it is")
        try:
            data = read_limited(self.path, "features file")
        except DocumentError as exc:
            raise Unavailable(str(exc)) from None
        if not data.startswith(WRITTEN_BY.encode()):
            raise NotOurs(f"{self.path} exists and gpu-labeller did not write it (no '{WRITTEN_BY}' first line); "
                          "it is left as it is")
        return data.decode(errors="replace")

    def live(self) -> Live:
        text = self._ours()
        if text is None:
            return Live()
        labels: dict[str, str] = {}
        refresh_due = True  # a file without an expiry is rewritten with one
        for line in text.splitlines():
            if line.startswith("# +expiry-time="):
                refresh_due = self._expires_soon(line.split("=", 1)[1])
            elif line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                labels[key] = value
        return Live.written_by_us(labels, refresh_due=refresh_due)

    def _expires_soon(self, stamp: str) -> bool:
        try:
            expiry = datetime.fromisoformat(stamp)
        except ValueError:
            return True
        return expiry - datetime.now(UTC) < timedelta(seconds=self.expiry_s / 2)

    def write(self, change: Change) -> None:
        self._ours()  # a file that appeared since live() is not ours to replace either
        expiry = datetime.now(UTC) + timedelta(seconds=self.expiry_s)
        try:
            write_atomic(self.path, render(change.labels, "nfd", expiry=expiry))
        except OSError as exc:
            raise Unavailable(f"{self.path}: cannot write: {exc.strerror or exc}") from None

    def close(self) -> None:
        return None


class NodeFeatureSink:
    """An NFD ``NodeFeature`` object ``gpu-labeller-<node>``; replaced only when its labels differ.

    An object of that name without gpu-labeller's ``MANAGED_BY`` label is never replaced: NotOurs."""

    name = "nodefeature"

    def __init__(self, kube: Kube, node: str, namespace: str) -> None:
        self.kube, self.node, self.namespace = kube, node, namespace
        self.object_name = f"gpu-labeller-{node}"
        self._current: Obj | None = None

    def start(self, on_change: Callable[[], None], stop: threading.Event, permissions: PermissionLog) -> None:
        return None

    def live(self) -> Live:
        with _api_errors():
            current = self.kube.get_node_feature(self.namespace, self.object_name)
        if current is None:
            self._current = None
            return Live()
        key, value = MANAGED_BY
        if (current.get("metadata", {}).get("labels") or {}).get(key) != value:
            raise NotOurs(f"NodeFeature {self.namespace}/{self.object_name} exists and gpu-labeller did not create it "
                          f"(no label {key}={value}); it is left as it is")
        self._current = current
        return Live.written_by_us(current.get("spec", {}).get("labels") or {})

    def write(self, change: Change) -> None:
        key, value = MANAGED_BY
        body: Obj = {
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
            "metadata": {"name": self.object_name, "namespace": self.namespace,
                         "labels": {"nfd.node.kubernetes.io/node-name": self.node, key: value}},
            "spec": {"labels": dict(sorted(change.labels.items()))},
        }
        with _api_errors():
            if self._current is None:
                self._current = self.kube.create_node_feature(self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = self._current["metadata"].get("resourceVersion")
                self._current = self.kube.replace_node_feature(self.namespace, self.object_name, body)

    def close(self) -> None:
        self.kube.close()


class EventSink:
    """Any sink, plus a Kubernetes Event on the Node for each change written (``run --events``)."""

    def __init__(self, inner: Sink, kube: Kube, node: str, namespace: str) -> None:
        self.inner, self.kube, self.node, self.namespace = inner, kube, node, namespace
        self.name = inner.name

    def start(self, on_change: Callable[[], None], stop: threading.Event, permissions: PermissionLog) -> None:
        self.inner.start(on_change, stop, permissions)

    def live(self) -> Live:
        return self.inner.live()

    def write(self, change: Change) -> None:
        self.inner.write(change)
        if not change.keys:
            return  # a refresh (the features file's expiry) changes no label
        counts = f"{len(change.added)} added, {len(change.changed)} changed, {len(change.removed)} removed"
        record_node_event(self.kube, self.node, self.namespace, "Normal", "GPULabelsChanged", f"gpu-labeller: {counts}")

    def close(self) -> None:
        self.inner.close()


def make_sink(output: str, node: str, kube: Kube | None, *, features_file: Path, namespace: str, interval_s: float,
              follow: bool, events: bool = False, event_namespace: str = "default",
              node_observers: Sequence[Callable[[Mapping[str, str] | None], None]] = ()) -> Sink:
    """The sink ``run --output`` names; ``follow``: the Node sink watches its Node (not for ``--once``),
    and ``node_observers`` get every view of it. ``kube`` may be None only for the features.d file
    without events (it needs no credentials)."""
    sink: Sink
    if output == "features-file":
        sink = FeaturesFileSink(features_file, expiry_s=max(4 * interval_s, 300.0))
    elif kube is None:
        raise ValueError(f"--output {output} needs Kubernetes credentials")
    elif output == "nodefeature":
        sink = NodeFeatureSink(kube, node, namespace)
    else:
        sink = NodeSink(kube, node, watch=follow, observers=node_observers)
    if events:
        if kube is None:
            raise ValueError("--events needs Kubernetes credentials")
        sink = EventSink(sink, kube, node, event_namespace)
    return sink
