"""``gpu-labeller cleanup`` (for uninstall): the Node output of the daemon writing an empty set, once
per node: what gpu-labeller applied goes, what another manager set stays (``--include-foreign``
removes keys under gpu-labeller's prefixes that others set).

Loaded lazily by ``labeller.cli.root``: importing this module pulls in the Kubernetes client.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import click

from labeller.cluster.connect import connect
from labeller.cluster.kube import Kube, KubeError
from labeller.cluster.permissions import PermissionLog
from labeller.cli.commands.completion import complete_node_names
from labeller.cli.commands.options import BadInput, format_option, kubeconfig_option
from labeller.apps.daemon.reconcile import Change, Live, Owned, managers_text, plan
from labeller.apps.daemon.sinks import NodeMissing, NodeSink, PermissionDenied, SinkError, Stale
from labeller.model.labels import FIELD_MANAGER
from labeller.base.log import get_logger

log = get_logger("gpu_labeller.daemon")


NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # a DNS subdomain


@click.command()
@click.option("--node", "nodes", multiple=True, shell_complete=complete_node_names, help="Node to clean (repeatable).")
@click.option("--all-nodes", is_flag=True, help="Clean every node in the cluster.")
@kubeconfig_option
@click.option("--include-foreign", is_flag=True,
              help="Also remove labels under gpu-labeller's prefixes that other managers set (migrating from GFD "
                   "or AMD's labeller). The GPU Operator's keys are never removed.")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; change nothing.")
@format_option(help="json: at the end, a list of {node, cleaned, dry_run, removed, released, left}; each key "
                    "an object {key, managers}.")
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
