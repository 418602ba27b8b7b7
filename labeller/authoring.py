"""Commands for the people who write nodeSelectors: ``explain`` (where each label comes from),
``match`` (which nodes a selector or an affinity would land on) and ``nodes`` (the fleet at a
glance). Loaded only when invoked; only ``nodes`` and ``match --kubeconfig`` load the Kubernetes
client (through labeller.kube), and only then."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from labeller.cli import _offer, _probe, emit
from labeller.completion import complete_label_keys
from labeller.explain import explain as explain_keys
from labeller.node import chosen, open_node
from labeller.options import discovery_options


@click.command()
@click.argument("keys", nargs=-1, metavar="[KEY ...]", shell_complete=complete_label_keys)
@discovery_options
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def explain(keys: tuple[str, ...], host_root: Path, simulate: str | None, config_path: Path | None,
            config_dir: Path | None, config_name: str | None, fmt: str) -> None:
    """Say where each label comes from (backend, exact source, rule, upstream tool), or why a key
    is not produced. Exit 1 when a KEY is not a gpu-labeller key (with the closest one)."""
    with open_node(host_root, simulate, config_path, chosen(config_path, config_dir, config_name)) as node:
        inventory = _probe(node)
        label_set = node.labels(inventory, _offer(node, inventory, config_path, simulate))
        results = explain_keys(keys, label_set, inventory, node.config, node.vendors, node.selection is not None)
    if fmt == "json":
        emit(json.dumps([r.document() for r in results], indent=2) + "\n")
    else:
        emit("".join(r.text() for r in results))
    if any(not r.known for r in results):
        sys.exit(1)
