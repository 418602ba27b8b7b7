"""``gpu-labeller run``: the DaemonSet's loop (loaded lazily by ``labeller.cli.root``: importing this
module pulls in the Kubernetes client)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from labeller.cli.commands.options import (config_label_option, discovery_options, endpoint_options, kubeconfig_option,
                                       node_name_option)
from labeller.cli.commands.params import Duration
from labeller.cli.commands.upstream import EPILOG, upstream_options
from labeller.apps.daemon.run import DEFAULT_FEATURES_FILE, RunOptions, labels_process
from labeller.apps.daemon.sinks import OUTPUTS
from labeller.host.machine import NodeOptions
from labeller.process.serve import Endpoint, serve


@click.command(epilog=EPILOG)
@node_name_option("This Node's name (downward API); required, but for a features file (--output features-file, "
                  "GFD's -o), which needs none. [env: NODE_NAME, or AMD's DS_NODE_NAME]", ("NODE_NAME", "DS_NODE_NAME"))
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
def run(node_options: NodeOptions, interval: float | None, endpoint: Endpoint, once: bool, dry_run: bool,
        output: str | None, features_file: Path | None, namespace: str, events: bool, start_jitter: float) -> None:
    """Keep this node's labels true on the cluster."""
    options = RunOptions(interval_s=interval, once=once, dry_run=dry_run, output=output, features_file=features_file,
                         namespace=namespace, events=events, start_jitter_s=start_jitter)
    sys.exit(serve(labels_process(node_options, endpoint, options)))
