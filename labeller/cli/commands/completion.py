"""Shell completion for arguments: profile names, label keys, node names.

Completion runs inside the user's shell on every Tab: it must be quick and silent. Anything that
fails (no profiles directory, no cluster, no credentials) completes nothing, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import click
from click.shell_completion import CompletionItem

from labeller.base.log import silence


def _quiet() -> None:
    """No log line while completing: the shell reads stdout, and the user's terminal shows stderr.
    (Completion runs in a process of its own, so this changes nothing else.)"""
    silence()


def _items(values: list[str], incomplete: str, help_of: dict[str, str] | None = None) -> list[CompletionItem]:
    return [CompletionItem(v, help=(help_of or {}).get(v)) for v in values if v.startswith(incomplete)]


def complete_profiles(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Built-in profile names for ``--simulate`` (a path completes as a file where the shell does)."""
    _quiet()
    try:
        from vendors.simulate import builtin_profiles

        profiles = builtin_profiles()
    except Exception:  # noqa: BLE001 - completion never fails loudly
        return []
    return _items(sorted(profiles), incomplete, profiles)


def complete_label_keys(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Every literal key gpu-labeller writes, every DRA attribute and capacity (``gpu.nvidia.com/productName``),
    and the keys of ``--simulate``'s labels when given."""
    _quiet()
    try:
        from labeller.host.explain import catalog, known_keys
        from vendors import VENDORS

        keys = set(known_keys(catalog(VENDORS)))
        keys.update(f"{v.dra.driver}/{doc.name}" if "/" not in doc.name else doc.name
                    for v in VENDORS if v.dra is not None for doc in v.dra.attribute_docs
                    if "<" not in doc.name and not doc.renamed_to)
        keys.update(_simulated_keys(ctx))
    except Exception:  # noqa: BLE001
        return []
    return _items(sorted(keys), incomplete)


def _simulated_keys(ctx: click.Context) -> list[str]:
    """The labels of the profile named by ``--simulate`` on the command line so far, if any."""
    simulate = ctx.params.get("simulate")
    if not simulate:
        return []
    from labeller.host.machine import NodeOptions, open_host

    with open_host(NodeOptions(host_root=ctx.params.get("host_root") or Path("/"), simulate=simulate)) as host:
        inventory = host.probe()
        return list(host.labels(inventory, host.offer(inventory)).labels)


def complete_node_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Node names of the cluster the command's credentials reach (``--kubeconfig``, else KUBECONFIG, else
    ~/.kube/config, else the pod's service account, as the command finds them); nothing when none answers."""
    _quiet()
    try:
        from labeller.cluster.connect import connect

        kube = connect(ctx.params.get("kubeconfig"), request_timeout=(1.0, 2.0))
        try:
            names = sorted(kube.list_node_names())
        finally:
            kube.close()
    except BaseException:  # noqa: BLE001 - no cluster, no credentials, a timeout: complete nothing
        return []
    return _items(names, incomplete)
