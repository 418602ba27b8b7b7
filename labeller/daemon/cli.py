"""``gpu-labeller run`` (the DaemonSet's loop) and ``gpu-labeller cleanup`` (for uninstall).

Loaded lazily by ``labeller.cli``: importing this module pulls in the Kubernetes client.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import click
import structlog

from labeller.commands.completion import complete_node_names
from labeller.commands.upstream import EPILOG, upstream_options
from labeller.process.follow import ConfigMetrics, EventRecorder, follow_configs, followed_label
from labeller.daemon.service import Daemon, Options
from labeller.host import Host, NodeOptions, open_host
from labeller.commands.options import (BadInput, config_label_option, discovery_options, endpoint_options,
                                      kubeconfig_option)
from labeller.cluster.connect import connect
from labeller.cluster.kube import Kube, KubeError
from labeller.config import GfdFlags
from labeller.cluster.nodes import record_node_event
from labeller.cluster.permissions import PermissionLog
from labeller.documents import not_a_regular_file
from labeller.labels import FIELD_MANAGER
from labeller.daemon.metrics import Metrics
from labeller.process.configsource import ConfigSource
from labeller.process.loop import ProcessLoop
from labeller.process.serve import Endpoints, serve
from labeller.commands.params import Duration
from labeller.daemon.reconcile import Change, Live, Owned, ProbeResult, managers_text, owned, plan
from labeller.daemon.sinks import (
    OUTPUTS,
    NodeMissing,
    NodeSink,
    PermissionDenied,
    SinkError,
    Stale,
    make_sink,
)

log = structlog.get_logger("gpu_labeller.daemon")

DEFAULT_FEATURES_FILE = Path("/etc/kubernetes/node-feature-discovery/features.d/gpu-labeller")
EVENT_NAMESPACE = "default"  # where the kubelet records Node events too


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


@click.command(epilog=EPILOG)
@click.option("--node-name", envvar=["NODE_NAME", "DS_NODE_NAME"], shell_complete=complete_node_names,
              help="This Node's name (downward API); required, but for a features file (--output features-file, "
                   "GFD's -o), which needs none. [env: NODE_NAME, or AMD's DS_NODE_NAME]")
@kubeconfig_option
@discovery_options
@config_label_option
@click.option("--interval", type=Duration(minimum=0.01), show_default="flags.gfd.sleepInterval, else 60s",
              envvar="GPU_LABELLER_INTERVAL",
              help="Time between hardware probes: 60, 60s, 500ms, 2m. [env: GPU_LABELLER_INTERVAL]")
@endpoint_options(8080)
@click.option("--once", is_flag=True,
              help="Reconcile once and exit: 0 on success, 1 on failure (also: flags.gfd.oneshot).")
@click.option("--dry-run", is_flag=True, help="Log the change that would be applied; write nothing.")
@click.option("--output", type=click.Choice(OUTPUTS),
              show_default="node; features-file when GFD's -o/--output-file (flags.gfd.outputFile) is given",
              help="node: server-side apply to the Node; features-file: NFD features.d file; "
                   "nodefeature: NFD NodeFeature object.")
@click.option("--features-file", type=click.Path(path_type=Path, dir_okay=False),
              show_default=f"flags.gfd.outputFile, else {DEFAULT_FEATURES_FILE}",
              help="Path of the features.d file (--output features-file).")
@click.option("--namespace", envvar="NAMESPACE", default="default", show_default=True,
              help="Namespace of the NodeFeature object (--output nodefeature). [env: NAMESPACE]")
@click.option("--events/--no-events", default=False, show_default=True,
              help="Record a Kubernetes Event when labels change.")
@click.option("--start-jitter", type=Duration(), default="2s", show_default=True,
              help="Wait a random time up to this (2s, 500ms) before the first reconcile, so a fleet does not stampede "
                   "(not with --once).")
@upstream_options("run")
def run(node_options: NodeOptions, interval: float | None, metrics_port: int, metrics_bind: str, once: bool,
        dry_run: bool, output: str | None, features_file: Path | None, namespace: str, events: bool,
        start_jitter: float) -> None:
    """Keep this node's labels true on the cluster."""
    node_name = node_options.node_name
    chooser = node_options.named_configs()
    label = followed_label(chooser, node_options.config_label)
    if not node_name and (label is not None or events or output not in (None, "features-file")):
        raise BadInput(NO_NODE_NAME)
    metrics = Metrics()
    alternative = "use --output features-file without --events" + (" and with --config-label ''" if label else "")

    def client() -> Kube:
        return connect(node_options.kubeconfig, alternative=alternative + ", which needs none",
                       observer=metrics.observe_request)

    # The named configs' label and the Events need the API from the start; the output is known once the
    # config is read (GFD's output file means the features file); NFD's features.d file needs none at all.
    kube = client() if events or label is not None else None
    follower, selection = None, None
    if chooser is not None:
        writes_events = kube is not None and (events or label is not None) and not dry_run
        recorder = node_event_recorder(kube, node_name or "") if kube is not None and writes_events else None
        follower, selection = follow_configs(chooser, label, kube, node_name or "",
                                             ConfigMetrics(metrics.registry, "gpu_labeller"), recorder)
    with open_host(node_options, selection) as host:
        output = gfd_output(output, host.config.gfd)
        if not node_name:
            if output != "features-file":
                raise BadInput(NO_NODE_NAME)
            node_name = socket.gethostname()  # as GFD, the features file needs no node name: the logs say this host's
        structlog.contextvars.bind_contextvars(node=node_name)
        once, interval, features_file = _gfd_settings(host.config.gfd, once, interval, features_file, output)
        if output == "features-file" and (kind := not_a_regular_file(features_file)) is not None:
            raise BadInput(f"--features-file {features_file}: {kind}")
        if kube is None and output != "features-file":
            kube = client()
        watched_by_sink = follower is not None and label is not None and output == "node"
        sink = make_sink(output, node_name, kube, features_file=features_file, namespace=namespace,
                         interval_s=interval, follow=not once, events=events,
                         node_observers=(follower.observe,) if follower is not None and watched_by_sink else ())
        options = Options(interval_s=interval, start_jitter_s=start_jitter, dry_run=dry_run, once=once)
        daemon = Daemon(node_name, lambda: probe_labels(host), sink, metrics, options)
        loop = ProcessLoop(daemon, options.loop(), config=ConfigSource(host, node_options.config_path, follower),
                           inputs=host.offer_inputs)
        if follower is not None:
            follower.apply(host)
        if once:
            sys.exit(_run_once(daemon))
        if follower is not None and label is not None and kube is not None and not watched_by_sink:
            follower.watch(kube, node_name, loop.stopped, daemon.permissions)
        serve(loop, Endpoints(metrics_port, metrics_bind, metrics.registry, ready=lambda: daemon.ready),
              output=sink.name, interval_s=interval, dry_run=dry_run)
        log.info("stopped", reason="stop")


NO_NODE_NAME = "no node name: give --node-name NAME or set NODE_NAME (a DaemonSet sets it from spec.nodeName)"


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


NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # a DNS subdomain


@click.command()
@click.option("--node", "nodes", multiple=True, shell_complete=complete_node_names, help="Node to clean (repeatable).")
@click.option("--all-nodes", is_flag=True, help="Clean every node in the cluster.")
@kubeconfig_option
@click.option("--include-foreign", is_flag=True,
              help="Also remove labels under gpu-labeller's prefixes that other managers set (migrating from GFD "
                   "or AMD's labeller). The GPU Operator's keys are never removed.")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; change nothing.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: at the end, a list of {node, cleaned, dry_run, removed, released, left}; each key an "
                   "object {key, managers}.")
def cleanup(nodes: tuple[str, ...], all_nodes: bool, kubeconfig: str | None, include_foreign: bool,
            dry_run: bool, fmt: str) -> None:
    """Remove the labels gpu-labeller set (for uninstall); print, per node, what was removed and what was left."""
    if bool(nodes) == all_nodes:
        raise click.UsageError("give --node NAME (repeatable) or --all-nodes")
    for name in nodes:
        if len(name) > 253 or not NODE_NAME.fullmatch(name):
            raise BadInput(f"--node {name!r}: not a node name (lowercase letters, digits, '-' and '.', "
                           "at most 253 characters)")
    kube = connect(kubeconfig)
    try:
        names = kube.list_node_names() if all_nodes else list(nodes)
    except KubeError as exc:
        log.error("cannot reach the cluster", reason="api-error", error=str(exc))
        sys.exit(1)
    permissions = PermissionLog()
    documents = [clean_node(kube, name, permissions, include_foreign, dry_run, print_lines=fmt == "text")
                 for name in names]
    if fmt == "json":
        click.echo(json.dumps(documents, indent=2))
    sys.exit(0 if all(d["cleaned"] for d in documents) else 1)


def clean_node(kube: Kube, name: str, permissions: PermissionLog, include_foreign: bool = False,
               dry_run: bool = False, print_lines: bool = True) -> dict[str, Any]:
    """The Node output writing an empty desired set: what gpu-labeller applied goes (keys another
    manager also set are only released), keys it set through older merge patches are patched out.
    Prints each key (``print_lines``); returns what ``cleanup --format json`` prints of the node, with
    ``cleaned`` false (after one error line) when it could not be cleaned."""
    failed = {"node": name, "cleaned": False, "dry_run": dry_run, "removed": [], "released": [], "left": []}
    try:
        for attempt in range(3):  # a Node changed under the merge patch (409): look again
            sink = NodeSink(kube, name)
            before = after = sink.live()
            change = plan(before, Owned({}), probe_ok=True, include_foreign=include_foreign)
            try:
                if change.needed and not dry_run:
                    sink.write(change)
                    after = sink.last_seen()
                break
            except Stale:
                if attempt == 2:
                    raise
    except NodeMissing:
        log.error("node not found", node=name, reason="node-not-found")
        return failed
    except PermissionDenied as exc:
        permissions.report(exc, node=name)
        return failed
    except SinkError as exc:
        log.error("cleanup failed", node=name, reason="api-error", error=str(exc))
        return failed
    document = cleanup_document(name, before, after, change, dry_run)
    if print_lines:
        for line in cleanup_text(document):
            click.echo(line)
    return document


def cleanup_document(node: str, before: Live, after: Live, change: Change, dry_run: bool) -> dict[str, Any]:
    """The keys removed (or, on a dry run, to remove), released and left, each with the managers that
    set it (for a released key: the others). A key planned for removal that is still there after the
    write (another manager set it meanwhile) is left."""
    removed = [key for key in change.removed if dry_run or key not in after.labels]
    left = {**change.foreign, **{key: after.names(key) for key in change.removed if key not in removed}}
    return {
        "node": node, "cleaned": True, "dry_run": dry_run,
        "removed": [{"key": key, "managers": list(before.names(key))} for key in removed],
        "released": [{"key": key, "managers": [n for n in before.names(key) if n != FIELD_MANAGER]}
                     for key in change.relinquished],
        "left": [{"key": key, "managers": list(names)} for key, names in sorted(left.items())],
    }


def cleanup_text(document: dict[str, Any]) -> list[str]:
    """One line per key removed, released or left, then a count."""
    node, dry_run = document["node"], document["dry_run"]
    verb = "would remove" if dry_run else "removed"
    lines = [f"{node}: {verb} {k['key']} (set by {managers_text(tuple(k['managers']))})" for k in document["removed"]]
    lines += [f"{node}: {'would release' if dry_run else 'released'} {k['key']} (also set by "
              f"{managers_text(tuple(k['managers']))}, so it stays)" for k in document["released"]]
    lines += [f"{node}: left {k['key']} (set by {managers_text(tuple(k['managers']))}; --include-foreign removes it)"
              for k in document["left"]]
    counts = ("to remove", "to release") if dry_run else ("removed", "released")
    lines.append(f"{node}: {len(document['removed'])} {counts[0]}, {len(document['released'])} {counts[1]}, "
                 f"{len(document['left'])} left")
    return lines


def cleanup_report(node: str, before: Live, after: Live, change: Change, dry_run: bool) -> list[str]:
    """The lines ``cleanup`` prints for one node."""
    return cleanup_text(cleanup_document(node, before, after, change, dry_run))
