"""What ``gpu-labeller run`` serves (``labels_process``): where the labels go (the Node, NFD's
features.d file or a NodeFeature object), the node's name, GFD's settings from the config, the
named configs followed with the node's label, and the ``Daemon`` on the process loop; or one
reconcile (``--once``).

Importing this module pulls in the Kubernetes client (through the sinks)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog

from labeller.cluster.connect import connect
from labeller.cluster.kube import Kube
from labeller.cluster.nodes import record_node_event
from labeller.model.config import GfdFlags
from labeller.apps.daemon.metrics import Metrics
from labeller.apps.daemon.reconcile import ProbeResult, owned
from labeller.apps.daemon.service import Daemon, Options
from labeller.apps.daemon.sinks import make_sink
from labeller.model.documents import not_a_regular_file
from labeller.base.errors import InputError
from labeller.host.machine import Host, NodeOptions
from labeller.model.namedconfigs import Selection
from labeller.process.follow import ConfigFollower, ConfigMetrics, EventRecorder, follow_configs, followed_label
from labeller.process.serve import Endpoint, Process, Served
from labeller.base.log import get_logger

log = get_logger("gpu_labeller.daemon")

DEFAULT_FEATURES_FILE = Path("/etc/kubernetes/node-feature-discovery/features.d/gpu-labeller")
EVENT_NAMESPACE = "default"  # where the kubelet records Node events too
NO_NODE_NAME = "no node name: give --node-name NAME or set NODE_NAME (a DaemonSet sets it from spec.nodeName)"


@dataclass(frozen=True)
class RunOptions:
    """``run``'s own options (--interval, --once, --dry-run, --output, --features-file, --namespace,
    --events, --start-jitter); None where GFD's config keys may decide."""

    interval_s: float | None = None
    once: bool = False
    dry_run: bool = False
    output: str | None = None
    features_file: Path | None = None
    namespace: str = "default"
    events: bool = False
    start_jitter_s: float = 2.0


def labels_process(node_options: NodeOptions, endpoint: Endpoint, run: RunOptions) -> Process:
    """``run``'s process. The named configs' label and the Events need the API from the start; the
    output is known once the config is read (GFD's output file means the features file); NFD's
    features.d file needs no API at all. InputError for a node name that is needed and not given."""
    node_name = node_options.node_name
    chooser = node_options.named_configs()
    label = followed_label(chooser, node_options.config_label)
    if not node_name and (label is not None or run.events or run.output not in (None, "features-file")):
        raise InputError(NO_NODE_NAME)
    metrics = Metrics()
    alternative = "use --output features-file without --events" + (" and with --config-label ''" if label else "")

    def client() -> Kube:
        return connect(node_options.kubeconfig, alternative=alternative + ", which needs none",
                       observer=metrics.observe_request)

    kube = client() if run.events or label is not None else None

    def follow(config_metrics: ConfigMetrics, stop: threading.Event) -> tuple[ConfigFollower | None, Selection | None]:
        if chooser is None:
            return None, None
        writes_events = kube is not None and not run.dry_run
        recorder = node_event_recorder(kube, node_name or "") if kube is not None and writes_events else None
        return follow_configs(chooser, label, kube, node_name or "", config_metrics, recorder)

    @contextmanager
    def labelling(host: Host, follower: ConfigFollower | None) -> Iterator[Served]:
        output = gfd_output(run.output, host.config.gfd)
        name = node_name or _features_file_node(output)
        structlog.contextvars.bind_contextvars(node=name)
        once, interval, features_file = _gfd_settings(host.config.gfd, run.once, run.interval_s,
                                                      run.features_file, output)
        if output == "features-file" and (kind := not_a_regular_file(features_file)) is not None:
            raise InputError(f"--features-file {features_file}: {kind}")
        api = kube if kube is not None or output == "features-file" else client()
        watched_by_sink = follower is not None and label is not None and output == "node"
        sink = make_sink(output, name, api, features_file=features_file, namespace=run.namespace,
                         interval_s=interval, follow=not once, events=run.events,
                         node_observers=(follower.observe,) if follower is not None and watched_by_sink else ())
        options = Options(interval_s=interval, start_jitter_s=run.start_jitter_s, dry_run=run.dry_run, once=once)
        daemon = Daemon(name, lambda: probe_labels(host), sink, metrics, options)
        watch = None
        if follower is not None and label is not None and api is not None and not watched_by_sink:
            def watch(stop: threading.Event) -> None:  # the Node's label, read by a watch of its own
                follower.watch(api, name, stop, daemon.permissions)

        yield Served(daemon, options.loop(), inputs=host.offer_inputs, follow=watch,
                     fields={"output": sink.name, "interval_s": interval, "dry_run": run.dry_run},
                     once=(lambda: _run_once(daemon)) if once else None)

    return Process(node_options, endpoint, metrics.registry, "gpu_labeller", labelling, follow=follow)


def _features_file_node(output: str) -> str:
    """The node name of a features file written without one: this host's, as GFD's (the logs say it)."""
    if output != "features-file":
        raise InputError(NO_NODE_NAME)
    return socket.gethostname()


def node_event_recorder(kube: Kube, node: str) -> EventRecorder:
    """Records the follower's news as Events on the Node."""

    def record(kind: str, reason: str, message: str) -> None:
        record_node_event(kube, node, EVENT_NAMESPACE, kind, reason, message)

    return record


def probe_labels(host: Host) -> ProbeResult:
    """Probe the hardware and compute the owned labels; ``partial`` when the inventory is incomplete."""
    inventory = host.probe()
    label_set = host.labels(inventory, host.offer(inventory))
    label_set.log_problems(log)
    labels = owned(label_set.labels)  # the one ownership filter on the way in
    not_owned = sorted(set(label_set.labels) - set(labels))
    if not_owned:
        log.warning("labels outside the owned prefixes are never written", reason="not-owned", labels=not_owned)
    # discovery logged each backend's problem; the daemon says what a partial probe means for the labels
    return ProbeResult(labels, partial=inventory.partial)


def gfd_output(output: str | None, gfd: GfdFlags) -> str:
    """Where the labels go: --output; when it is not given, GFD's output file (-o/--output-file,
    GFD_OUTPUT_FILE or flags.gfd.outputFile) means the features file at that path, as GFD writes it;
    else the Node."""
    if output is not None:
        return output
    return "features-file" if gfd.output_file else "node"


def _gfd_settings(gfd: GfdFlags, once: bool, interval: float | None, features_file: Path | None,
                  output: str) -> tuple[bool, float, Path]:
    """--once, --interval and --features-file, each from GFD's flags.gfd key where not given (read at
    start: a reload does not change them)."""
    if gfd.output_file is not None and features_file is None and output != "features-file":
        log.warning("flags.gfd.outputFile is the path of --output features-file, and --output sends the labels "
                    "elsewhere", reason="not-honoured", output=output, output_file=gfd.output_file)
    return (once or gfd.oneshot,
            interval if interval is not None else gfd.sleep_interval_s or 60.0,
            features_file or (Path(gfd.output_file) if gfd.output_file else DEFAULT_FEATURES_FILE))


def _run_once(daemon: Daemon) -> int:
    """0 when the probe was complete and the labels are right; 1 otherwise (a failed or partial
    probe still adds or repairs what it can, but never removes, and is reported as a failure)."""
    daemon.probe()
    outcome = daemon.reconcile_once()
    log.info("reconciled once", reason="once", outcome=outcome, probe_ok=daemon.probe_ok)
    return 0 if daemon.probe_ok and outcome in ("unchanged", "applied", "dry-run") else 1
