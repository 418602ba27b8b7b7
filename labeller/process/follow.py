"""Following a node's named config (labeller.model.namedconfigs) while ``run`` or ``device-plugin`` runs.

``ConfigFollower`` holds the selection in force and chooses again when
- the node label that asks for a config (``nvidia.com/device-plugin.config``) or gpu-labeller's
  ``config.applied`` label changes: ``observe`` gets the Node's labels from a watch of the own Node
  (the labeller's Node sink watch, or ``watch``'s own);
- the config directory changes (a ConfigMap edit: the kubelet swaps its ``..data`` link):
  ``check_files`` (one ``readlink``) runs when inotify says the directory changed, once a minute in
  case it did not, and every ``poll_s`` where the directory cannot be watched;
and calls ``on_change`` when what is in force, or why the config asked for is not, changed. The
consumer (the daemon's loop, the plugin's prober) then calls ``apply(node)``: the selection goes
into force and is reported once (``SelectionReport``): one log line, the metrics, and (the labeller)
an Event on the Node.

The Kubernetes client is reached only through the cluster layer (``labeller.cluster``), which
loads it when a process connects, so a process that follows no label never loads it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from labeller.cluster.nodes import NodeCache, NodeWatch, node_labels, node_labels_reader
from labeller.cluster.permissions import PermissionLog
from labeller.host.machine import Host, NodeOptions, OptionsError
from labeller.base.inotify import DirectoryWatch
from labeller.model.labels import key_problem, owns
from labeller.model.namedconfigs import APPLIED_LABEL, Chooser, NoConfig, Selection
from labeller.base.backoff import Backoff
from labeller.base.log import get_logger

if TYPE_CHECKING:
    from labeller.cluster.kube import Kube

log = get_logger(__name__)

POLL_SECONDS = 1.0
WATCHED_CHECK_SECONDS = 60.0  # a watched directory is looked at anyway this often
# How long a starting process waits to read its Node's labels before it starts with the default config.
BOOTSTRAP_SECONDS = 15.0

EventRecorder = Callable[[str, str, str], None]  # (type "Normal" | "Warning", reason, message)
Labels = Mapping[str, str]


class ConfigMetrics:
    """The follower's metrics, named ``<prefix>_config_*`` in the process's own registry."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.failed = Gauge(f"{prefix}_config_failed", "1 while the named config the node asks for is not in force "
                            "(unknown name, or a file that does not load; the last good one stays), else 0.",
                            registry=registry)
        self.changes = Counter(f"{prefix}_config_changes_total", "Named config changes by outcome (applied: the "
                               "config asked for is in force; failed: it cannot be).", ["outcome"], registry=registry)


class SelectionReport:
    """Says each change of the selection in force once: a log line, the metrics, and an Event on the
    Node (when ``events`` is given). Called by the consumer's thread only (``ConfigFollower.apply``)."""

    def __init__(self, label_key: str | None, metrics: ConfigMetrics, events: EventRecorder | None = None) -> None:
        self.label_key, self.metrics, self.events = label_key, metrics, events
        self._reported: Selection | None = None

    def __call__(self, selection: Selection) -> None:
        """Once per change: a log line, the metrics and an Event (when ``events`` is given)."""
        before, self._reported = self._reported, selection
        self.metrics.failed.set(0 if selection.ok else 1)
        if before == selection:
            return
        fields = {"config": selection.name, "asked": selection.wanted, "label": self.label_key}
        if selection.problem is not None:
            if before is not None and before.problem == selection.problem:
                return
            log.error("named config not applied; the config in force stays", reason="config-failed",
                      error=selection.problem, **fields)
            self.metrics.changes.labels(outcome="failed").inc()
            self._event("Warning", "GPUConfigFailed", f"{selection.problem}; config {selection.name!r} stays in force")
            return
        if before is None:
            log.info("named config in force", reason="config-applied", **fields)
            return
        log.info("named config applied", reason="config-applied", previous=before.name, **fields)
        self.metrics.changes.labels(outcome="applied").inc()
        self._event("Normal", "GPUConfigApplied", f"config {selection.name!r} in force (was {before.name!r})")

    def _event(self, kind: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events(kind, reason, f"gpu-labeller: {message}")


class ConfigFollower:
    """See the module docstring. ``label_key`` None: the node label is not followed (the default
    config and the directory only)."""

    def __init__(self, chooser: Chooser, label_key: str | None, metrics: ConfigMetrics, *,
                 events: EventRecorder | None = None, poll_s: float = POLL_SECONDS,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.chooser, self.label_key, self.poll_s, self.on_change = chooser, label_key, poll_s, on_change
        self.report = SelectionReport(label_key, metrics, events)
        self._lock = threading.Lock()
        self._wanted: str | None = None
        self._hint: str | None = None
        self._signature = chooser.directory.signature()
        self._selection: Selection | None = None
        self._problem: str | None = None
        self._synced = threading.Event()
        self._choose()

    # --- inputs (any thread) ------------------------------------------------------------------

    def observe(self, labels: Labels | None) -> None:
        """The own Node's labels, as a watch sees them (None: the Node is gone; nothing changes)."""
        if labels is None or self.label_key is None:
            return
        wanted, hint = labels.get(self.label_key) or None, labels.get(APPLIED_LABEL) or None
        with self._lock:
            first = not self._synced.is_set()
            self._synced.set()
            if not first and (wanted, hint) == (self._wanted, self._hint):
                return
            self._wanted, self._hint = wanted, hint
            changed = self._choose()
        if changed:
            self.on_change()

    def check_files(self, notify: bool = True) -> None:
        """Choose again when the config directory changed since the last look (``notify``: then call
        ``on_change``, for a caller that does not apply the selection itself)."""
        signature = self.chooser.directory.signature()
        with self._lock:
            if signature == self._signature:
                return
            self._signature = signature
            changed = self._choose()
        if changed:
            log.info("config directory changed", reason="config-files-changed",
                     directory=str(self.chooser.directory.path))
            if notify:
                self.on_change()

    def _choose(self) -> bool:
        """Choose with the lock held; True when the selection (or why it fails) changed."""
        try:
            selection = self.chooser.choose(self._wanted, self._hint, self._selection)
        except NoConfig as exc:
            self._problem = self._in_context(str(exc))
            return False
        if selection.problem is not None:
            selection = dataclasses.replace(selection, problem=self._in_context(selection.problem))
        changed = selection != self._selection
        self._selection, self._problem = selection, selection.problem
        return changed

    def _in_context(self, problem: str) -> str:
        if self._wanted is None or self.label_key is None:
            return problem
        return f"node label {self.label_key}={self._wanted}: {problem}"

    # --- threads --------------------------------------------------------------------------------

    def poll(self, stop: threading.Event) -> threading.Thread:
        """Check the directory when inotify says it changed, else every ``poll_s`` (see the module
        docstring), until ``stop`` is set, on a daemon thread."""
        watch = DirectoryWatch(self._check_files, "config-watch")
        watch.watch([self.chooser.directory.path])

        def loop() -> None:
            try:
                while not stop.wait(WATCHED_CHECK_SECONDS if watch.watching else self.poll_s):
                    self._check_files()
            finally:
                watch.close()

        thread = threading.Thread(target=loop, name="config-poll", daemon=True)
        thread.start()
        return thread

    def _check_files(self) -> None:
        try:
            self.check_files()
        except Exception:  # a bad look must not end following: the next one retries
            log.exception("config directory check failed", reason="config-files-changed")

    def watch(self, kube: Kube, node: str, stop: threading.Event, permissions: PermissionLog) -> None:
        """Follow the own Node's labels with a watch of its own (when no Node sink watches it already)."""
        NodeWatch(kube, node, NodeCache(node_labels, observers=(self.observe,)), stop, permissions).start()

    def bootstrap(self, read: Callable[[], Labels], stop: threading.Event,
                  timeout_s: float = BOOTSTRAP_SECONDS) -> bool:
        """Before the first probe: read the own Node's labels once (``read``, retried for ``timeout_s``),
        so a node never starts on the default config and then switches. False when they could not be read."""
        if self.label_key is None:
            return True
        backoff, deadline = Backoff(base_s=0.2, cap_s=2.0), time.monotonic() + timeout_s
        while True:
            try:
                self.observe(read())
                return True
            except Exception as exc:  # noqa: BLE001 - any failure to read is retried the same way
                error = str(exc)
            if time.monotonic() >= deadline or stop.wait(backoff.next()):
                log.warning("cannot read the node's labels; starting with the config in force, and following the "
                            "label once the API answers", reason="api-error", label=self.label_key, error=error)
                return False

    # --- the consumer's side ----------------------------------------------------------------------

    @property
    def selection(self) -> Selection:
        """What is in force; NoConfig (naming the problem) when nothing can be."""
        with self._lock:
            if self._selection is None:
                raise NoConfig(self._problem or "no config")
            return self._selection

    def apply(self, node: Host) -> bool:
        """Put the current selection in force on ``node`` and report it; True when the config changed."""
        selection = self.selection
        changed = node.select(selection)
        self.report(selection)
        return changed


# --- what run and device-plugin share to start following -----------------------------------------

def followed_label(chooser: Chooser | None, config_label: str) -> str | None:
    """The node label to follow (None: none); OptionsError for a key that is not a label key, or one
    gpu-labeller writes itself (it would follow its own writes)."""
    if chooser is None or not config_label:
        return None
    problem = key_problem(config_label)
    if problem is not None:
        raise OptionsError(f"--config-label {config_label!r}: not a label key: {problem}")
    if owns(config_label):
        raise OptionsError(f"--config-label {config_label}: a key gpu-labeller writes itself cannot choose its config")
    return config_label


def follow_configs(chooser: Chooser, label: str | None, kube: Kube | None, node: str, metrics: ConfigMetrics,
                   events: EventRecorder | None = None) -> tuple[ConfigFollower, Selection]:
    """A follower of the named configs and, with ``label``, of the node label (read once now, so the
    first probe already uses the node's config); NoConfig when no config can be put in force."""
    follower = ConfigFollower(chooser, label, metrics, events=events)
    if label is not None and kube is not None:
        follower.bootstrap(node_labels_reader(kube, node), threading.Event())
    return follower, follower.selection


def follow_own_node(options: NodeOptions, metrics: ConfigMetrics,
                    stop: threading.Event) -> tuple[ConfigFollower | None, Selection | None]:
    """For a process on the node that writes no labels (``device-plugin``, ``mps-control-daemon``):
    with --config-dir, the follower of the named configs and, with --config-label, of the own Node's
    label, watched until ``stop`` (the Kubernetes client is loaded only then: about 22 MiB of RSS)."""
    chooser = options.named_configs()
    if chooser is None:
        return None, None
    label = followed_label(chooser, options.config_label)
    node_name, kube = options.node_name, None
    if label is not None:
        if not node_name:
            raise OptionsError("--config-label needs this Node's name to read its label: give --node-name NAME or set "
                           "NODE_NAME, or --config-label '' to follow no label")
        from labeller.cluster.connect import connect  # loads the Kubernetes client

        structlog.contextvars.bind_contextvars(node=node_name)
        kube = connect(options.kubeconfig, alternative="--config-label '' to follow no node label")
    follower, selection = follow_configs(chooser, label, kube, node_name or "", metrics)
    if kube is not None and node_name:
        follower.watch(kube, node_name, stop, PermissionLog())
    return follower, selection
