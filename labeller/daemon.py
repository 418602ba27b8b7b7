"""The labelling daemon: keep the owned labels of one Node equal to what the hardware says.

Pure decisions (``owned``, ``desired_after``, ``plan``, ``FightDetector``, ``Backoff``) are separate
from I/O, which goes through a ``Sink`` (the Node, a features.d file, a NodeFeature object). The
Kubernetes client is reached only through ``labeller.kube``, imported by the caller; this module
imports nothing from it at import time.

Rules kept here:
- only keys with ``labels.owns(key)`` are ever written or removed;
- a write happens only when the live owned labels differ from the desired ones (no idle writes);
- a failed or partial probe never removes a label: it may add or repair, never take away.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from labeller.labels import owns
from labeller.outputs import render, write_atomic

if TYPE_CHECKING:
    from labeller.kube import Kube, Obj
    from labeller.metrics import Metrics

Labels = dict[str, str]
log = structlog.get_logger("gpu_labeller.daemon")


# --------------------------------------------------------------------------- pure decisions


def owned(labels: Mapping[str, str]) -> Labels:
    """The labels among ``labels`` that gpu-labeller owns (by key prefix)."""
    return {key: value for key, value in labels.items() if owns(key)}


@dataclass(frozen=True)
class ProbeResult:
    """What one probe produced: the owned labels, and whether they are the whole truth."""

    labels: Labels
    partial: bool = False
    error: str | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.partial


def desired_after(result: ProbeResult, last_good: Labels | None) -> Labels:
    """The labels to aim for after a probe.

    Complete probe: its labels. Partial probe: the last good set, plus keys only this probe found
    (values already known are kept). Failed probe: the last good set (empty if there is none; the
    plan then keeps whatever is live, because a failed probe never removes).
    """
    if result.ok:
        return owned(result.labels)
    base = dict(last_good or {})
    if result.error is None:
        return {**owned(result.labels), **base}
    return base


@dataclass(frozen=True)
class Change:
    """The difference between live and desired owned labels; ``labels`` is the full set to apply."""

    labels: Labels
    added: Labels = field(default_factory=dict)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    removed: tuple[str, ...] = ()

    @property
    def needed(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    @property
    def keys(self) -> set[str]:
        return set(self.added) | set(self.changed) | set(self.removed)

    def summary(self) -> dict[str, Any]:
        return {"added": sorted(self.added), "changed": sorted(self.changed), "removed": list(self.removed)}


def plan(live: Mapping[str, str], desired: Mapping[str, str], probe_ok: bool) -> Change:
    """What to apply so the live owned labels become ``desired``.

    After a failed or partial probe (``probe_ok`` False) nothing is removed: live owned labels
    that the desired set lacks are kept in the applied set.
    """
    live_owned, want = owned(live), owned(desired)
    if not probe_ok:
        want = {**live_owned, **want}
    added = {k: v for k, v in want.items() if k not in live_owned}
    changed = {k: (live_owned[k], v) for k, v in want.items() if k in live_owned and live_owned[k] != v}
    removed = tuple(sorted(set(live_owned) - set(want)))
    return Change(want, added, changed, removed)


class Backoff:
    """Capped exponential backoff with full jitter: ``next()`` in [base/2, min(cap, base*2^n)]."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 30.0, rng: random.Random | None = None) -> None:
        self.base_s, self.cap_s, self.attempts = base_s, cap_s, 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        ceiling = min(self.cap_s, self.base_s * 2.0 ** self.attempts)
        self.attempts += 1
        return float(self._rng.uniform(min(self.base_s / 2, ceiling), ceiling))

    def reset(self) -> None:
        self.attempts = 0


class FightDetector:
    """Notices another writer fighting over an owned label and says how long to hold off.

    Each repair of drift is recorded per key. More than ``threshold`` repairs of one key within
    ``window_s`` is a fight: hold off ``base_hold_s``, doubling per consecutive fight up to
    ``max_hold_s`` (while the key stays hot, every further repair is a fight). A quiet window
    resets the doubling.
    """

    def __init__(self, threshold: int = 3, window_s: float = 60.0, base_hold_s: float = 2.0,
                 max_hold_s: float = 300.0) -> None:
        self.threshold, self.window_s = threshold, window_s
        self.base_hold_s, self.max_hold_s = base_hold_s, max_hold_s
        self.repairs: dict[str, list[float]] = {}
        self.level = 0
        self.hold_until = 0.0
        self._last_fight = float("-inf")

    def record(self, keys: set[str], now: float) -> list[str]:
        """Record a repair of ``keys``; return the keys being fought over (empty: no fight)."""
        if now - self._last_fight > self.window_s + self.hold_s():
            self.level = 0
        fought = []
        memory_s = self.window_s + (self.hold_s() if self.level else 0.0)  # a hold must not erase the history
        for key in keys:
            times = [t for t in self.repairs.get(key, []) if now - t <= memory_s] + [now]
            self.repairs[key] = times
            if len(times) > self.threshold:
                fought.append(key)
        if fought:
            self.hold_until = now + self.hold_s()
            self.level += 1
            self._last_fight = now
        return sorted(fought)

    def hold_s(self) -> float:
        return min(self.max_hold_s, self.base_hold_s * 2.0 ** self.level)


# --------------------------------------------------------------------------- sinks (I/O)


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


# --------------------------------------------------------------------------- the loop


@dataclass
class Options:
    interval_s: float = 60.0
    start_jitter_s: float = 2.0
    dry_run: bool = False
    events: bool = False
    event_namespace: str = "default"


class Daemon:
    """One node's reconcile loop. ``run()`` until ``stop()``; ``reconcile_once()`` for ``--once``."""

    def __init__(self, node: str, probe: Callable[[], ProbeResult], sink: Sink, metrics: Metrics,
                 options: Options | None = None, reload: Callable[[], None] | None = None,
                 kube: Kube | None = None, watcher: NodeWatcher | None = None) -> None:
        self.node, self.probe_fn, self.sink, self.metrics = node, probe, sink, metrics
        self.options = options or Options()
        self.reload_fn, self.kube, self.watcher = reload, kube, watcher
        self.log = log.bind(node=node)
        self.wake, self.stopped = threading.Event(), threading.Event()
        self.desired: Labels = {}
        self.probe_ok = False
        self.last_good: Labels | None = None
        self.last_applied: Labels | None = None
        self.ready = False
        self.heartbeat = time.monotonic()
        self.backoff = Backoff(0.2, 30.0)
        self.fights = FightDetector()
        self._reload_requested = False
        self._not_before = 0.0
        self._reported_forbidden: set[tuple[str, str]] = set()
        self._last_dry_run: Change | None = None
        if watcher is not None:
            watcher.attach(self.wake.set, self.stopped)

    # -- control, safe from signal handlers and other threads
    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()

    def request_reload(self) -> None:
        self._reload_requested = True
        self.wake.set()

    def healthy(self) -> bool:
        return time.monotonic() - self.heartbeat < max(3 * self.options.interval_s, 300.0)

    # -- probing
    def probe(self) -> None:
        start = time.monotonic()
        try:
            result = self.probe_fn()
        except Exception as exc:  # noqa: BLE001 - a probe must never take the daemon down
            result = ProbeResult({}, error=f"{type(exc).__name__}: {exc}")
        result = ProbeResult(result.labels, result.partial, result.error, time.monotonic() - start)
        self.metrics.observe_probe(result)
        self.desired = desired_after(result, self.last_good)
        self.probe_ok = result.ok
        if result.ok:
            self.last_good = dict(self.desired)
        else:
            self.log.warning("probe incomplete, keeping the last good labels", reason="partial-probe" if result.error is None
                             else "probe-failed", error=result.error, kept=len(self.desired))

    # -- reconciling
    def reconcile_once(self) -> str:
        """Compare live and desired owned labels and write when they differ. Returns the outcome."""
        from labeller.kube import Forbidden, KubeError

        outcome = "failed"
        try:
            outcome = self._reconcile()
        except NodeMissing:
            outcome = "node-missing"
            self.log.warning("node not found, waiting for it", reason="node-not-found")
        except Forbidden as exc:
            self._report_forbidden(exc.verb, exc.resource, exc.message)
        except KubeError as exc:
            self.log.warning("API request failed", reason="api-error", status=exc.status, error=exc.message)
        except OSError as exc:
            self.log.error("cannot write output", reason="io-error", error=str(exc))
        self.metrics.reconciles.labels(outcome=outcome).inc()
        if outcome in ("unchanged", "applied", "dry-run"):
            self.ready = True
            self.backoff.reset()
            self.metrics.last_success.set(time.time())
        return outcome

    def _reconcile(self) -> str:
        live = self.sink.live()
        change = plan(live, self.desired, self.probe_ok)
        self.metrics.labels_owned.set(len(live))
        if not change.needed:
            self.last_applied = dict(change.labels)
            return "unchanged"
        if self.options.dry_run:
            if change != self._last_dry_run:
                self.log.info("dry run: would apply", reason="dry-run", **change.summary())
                self._last_dry_run = change
            return "dry-run"
        if self.last_applied == change.labels and self._fighting(change):
            return "held"
        self._write(change)
        return "applied"

    def _fighting(self, change: Change) -> bool:
        """Record a drift repair; True when a fight was just detected (the write is held off)."""
        now = time.monotonic()
        fought = self.fights.record(change.keys, now)
        if not fought:
            return False
        self.metrics.fights.inc()
        hold = self.fights.hold_until - now
        self._not_before = max(self._not_before, self.fights.hold_until)
        self.log.warning("another writer keeps changing owned labels; backing off", reason="label-fight",
                         labels=fought, hold_s=round(hold, 1))
        return True

    def _write(self, change: Change) -> None:
        try:
            self.sink.write(change)
        except Exception:
            self.metrics.writes.labels(outcome="error").inc()
            raise
        self.metrics.writes.labels(outcome="success").inc()
        self.metrics.labels_owned.set(len(change.labels))
        self.last_applied = dict(change.labels)
        self.log.info("labels updated", reason="labels-changed", output=self.sink.name, **change.summary())
        if self.options.events:
            self._emit_event(change)

    def _emit_event(self, change: Change) -> None:
        from labeller.kube import KubeError

        if self.kube is None:
            return
        counts = f"{len(change.added)} added, {len(change.changed)} changed, {len(change.removed)} removed"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{self.node}.{time.time_ns():x}", "namespace": self.options.event_namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node},
                "reason": "GPULabelsChanged", "message": f"gpu-labeller: {counts}", "type": "Normal",
                "source": {"component": "gpu-labeller", "host": self.node},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self.kube.create_event(self.options.event_namespace, body)
        except KubeError as exc:
            self.log.warning("could not record an event", reason="event-failed", error=exc.message)

    def _report_forbidden(self, verb: str, resource: str, message: str) -> None:
        if (verb, resource) in self._reported_forbidden:
            return
        self._reported_forbidden.add((verb, resource))
        self.log.error(f"permission missing: grant verb '{verb}' on resource '{resource}' to gpu-labeller's "
                       "ServiceAccount", reason="forbidden", verb=verb, resource=resource, detail=message)

    # -- the loop
    def run(self) -> None:
        if self.options.start_jitter_s > 0 and self.stopped.wait(random.uniform(0, self.options.start_jitter_s)):
            return
        if self.watcher is not None:  # after the jitter: a restarting fleet must not list-and-watch at once
            self.watcher.start()
        next_probe = time.monotonic()
        while not self.stopped.is_set():
            self.wake.clear()
            now = self.heartbeat = time.monotonic()
            if self._reload_requested:
                self._reload()
                next_probe = now
            if now >= next_probe:
                self.probe()
                next_probe = now + self.options.interval_s
            if now >= self._not_before:
                self._after(self.reconcile_once(), now)
            wake_at = min(next_probe, self._not_before) if self._not_before > now else next_probe
            self.wake.wait(max(0.0, wake_at - time.monotonic()))

    def _after(self, outcome: str, now: float) -> None:
        if outcome in ("failed", "node-missing"):
            self._not_before = now + self.backoff.next()

    def _reload(self) -> None:
        self._reload_requested = False
        self.log.info("reloading config and re-probing", reason="sighup")
        if self.reload_fn is not None:
            try:
                self.reload_fn()
            except Exception as exc:  # noqa: BLE001 - a bad config file keeps the old config
                self.log.error("config reload failed, keeping the old config", reason="bad-config", error=str(exc))
