"""Commands for the people who write nodeSelectors: ``explain`` (where each label comes from),
``match`` (which nodes a selector or an affinity would land on) and ``nodes`` (the fleet at a
glance). Loaded only when invoked; only ``nodes`` and ``match --cluster`` load the Kubernetes
client (through labeller.cluster.kube), and only then."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from labeller.cli.commands.dryrun import emit, offer_of, probe_host
from labeller.cli.commands.completion import complete_label_keys, complete_node_names, complete_profiles
from labeller.host.explain import AttributeExplanation, Explanation, explain_attributes, is_attribute_key
from labeller.host.explain import explain as explain_keys
from labeller.base.log import at_least
from labeller.host.machine import NodeOptions, open_host
from labeller.cli.commands.options import BadInput, discovery_options, format_option, kubeconfig_option
from labeller.host.selectors import (Selector, SelectorError, Term, hint, load_selector, near_miss, nothing_matches,
                                parse_selector)


@click.command()
@click.argument("keys", nargs=-1, metavar="[KEY ...]", shell_complete=complete_label_keys)
@discovery_options
@format_option()
def explain(keys: tuple[str, ...], node_options: NodeOptions, fmt: str) -> None:
    """Say where each label comes from (backend, exact source, rule, upstream tool), or why a key
    is not produced. A KEY <driver>/<name> (gpu.nvidia.com/productName, gpu.amd.com/memory,
    resource.kubernetes.io/pciBusID) does the same for an attribute or capacity of the DRA devices;
    the driver alone (gpu.nvidia.com) for all of them. Exit 1 when a KEY is not a gpu-labeller key
    (with the closest one)."""
    with open_host(node_options, node_options.chosen()) as host:
        inventory = probe_host(host)
        offer = offer_of(host, inventory, node_options)
        label_set = host.labels(inventory, offer)
        devices = host.dra_devices(inventory, offer, every_vendor=True) if keys else {}
        results: list[Explanation | AttributeExplanation] = []
        for key in keys or [None]:
            if key is not None and is_attribute_key(key, host.vendors):
                results += explain_attributes(key, devices, inventory, host.config, host.vendors)
            else:
                results += explain_keys((key,) if key else (), label_set, inventory, host.config, host.vendors,
                                        host.selection is not None)
    if fmt == "json":
        emit(json.dumps([r.document() for r in results], indent=2) + "\n")
    else:
        emit("".join(r.text() for r in results))
    if any(not r.known for r in results):
        sys.exit(1)


# --- match -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """Something a selector is evaluated against: a simulated profile or a live Node."""

    name: str
    labels: Mapping[str, str]


def profile_labels(profile: str, config_path: Path | None = None) -> dict[str, str]:
    """The labels ``labels --simulate profile`` prints (BadInput for a bad profile)."""
    options = NodeOptions(simulate=profile, config_path=config_path)
    with open_host(options) as host:
        inventory = probe_host(host)
        return host.labels(inventory, offer_of(host, inventory, options)).labels


def profile_targets(profiles: Sequence[str], profiles_dir: Path | None, config_path: Path | None) -> list[Target]:
    """The given profiles, or every profile file of ``profiles_dir``, or every built-in profile."""
    from vendors.simulate import builtin_profiles

    if profiles_dir is not None:
        if not profiles_dir.is_dir():
            raise BadInput(f"{profiles_dir}: --profiles-dir: not a directory")
        names = [str(p) for p in sorted(profiles_dir.iterdir())
                 if p.suffix in (".yaml", ".yml", ".json") and p.is_file()]
        if not names:
            raise BadInput(f"{profiles_dir}: --profiles-dir: no profile files (*.yaml, *.yml, *.json)")
    else:
        names = list(profiles) or sorted(builtin_profiles())
    # One answer about many profiles: their info lines (MPS not served, ...) would only be noise.
    with at_least("warning") if len(names) > 1 else contextlib.nullcontext():
        return [Target(Path(n).stem if "/" in n else n, profile_labels(n, config_path)) for n in names]


def node_targets(kubeconfig: str | None) -> list[Target]:
    """Every Node of the cluster, with its labels: one list call."""
    from labeller.cluster.connect import calls

    with calls(kubeconfig, "list nodes") as kube:
        nodes, _ = kube.list_nodes()
    return [Target(str(n["metadata"]["name"]), dict(n["metadata"].get("labels") or {})) for n in nodes]


def selector_of(selector_text: str | None, affinity: Path | None) -> Selector:
    """The selector string, or the affinity file, or both (ANDed); BadInput when neither or invalid."""
    if selector_text is None and affinity is None:
        raise BadInput("give a SELECTOR (e.g. 'nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3') or --affinity FILE")
    try:
        parsed = parse_selector(selector_text) if selector_text is not None else None
        loaded = load_selector(affinity) if affinity is not None else None
    except SelectorError as exc:
        raise BadInput(str(exc)) from None
    if parsed is None:
        assert loaded is not None
        return loaded
    if loaded is None:
        return parsed
    extra = parsed.terms[0].requirements
    return Selector(tuple(Term((*extra, *t.requirements), t.fields) for t in loaded.terms))


def match_document(selector: Selector, targets: Sequence[Target], what: str) -> dict[str, Any]:
    """What ``match --format json`` prints: every target, whether it matches, the term that matched or
    came closest (1-based), whether it is a near miss and why it fails; the hints when nothing matches."""
    everywhere = [t.labels for t in targets]
    results = []
    for target in targets:
        outcome = selector.evaluate(target.labels, target.name)
        results.append({"name": target.name, "match": outcome.matched, "term": outcome.term + 1,
                        "near": near_miss(outcome, target.labels, everywhere),
                        "reasons": [hint(r, target.labels, everywhere) for r in outcome.failed]})
    matched = sum(1 for r in results if r["match"])
    return {"targets": what, "matched": matched, "total": len(targets), "terms": len(selector.terms),
            "results": results, "hints": [] if matched else nothing_matches(selector, everywhere)}


def match_report(selector: Selector, targets: Sequence[Target], verbose: bool, what: str) -> tuple[str, int]:
    """The lines ``match`` prints and how many targets match."""
    document = match_document(selector, targets, what)
    lines, others = [], 0
    for result in document["results"]:
        term = f" (term {result['term']})" if document["terms"] > 1 else ""
        if result["match"]:
            lines.append(f"match  {result['name']}{term}")
        elif result["near"] or verbose:
            label = "near " if result["near"] else "no   "
            lines.append(f"{label}  {result['name']}{term}: {'; '.join(result['reasons'])}")
        else:
            others += 1
    lines += document["hints"]
    summary = f"{document['matched']} of {len(targets)} {what} match"
    if others:
        summary += f"; {others} other{'s' if others > 1 else ''} far from it (--verbose says why)"
    return "".join(line + "\n" for line in [*lines, summary]), document["matched"]


@click.command()
@click.argument("selector_text", metavar="[SELECTOR]", required=False)
@click.option("--affinity", type=click.Path(path_type=Path, dir_okay=False),
              help="A YAML or JSON file with nodeAffinity (requiredDuringSchedulingIgnoredDuringExecution), a "
                   "nodeSelector map, a pod spec or a workload; ANDed with SELECTOR when both are given.")
@click.option("--simulate", "profiles", multiple=True, metavar="PROFILE|FILE", shell_complete=complete_profiles,
              help="Evaluate against this profile (repeatable); default: every built-in profile.")
@click.option("--profiles-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Evaluate against every profile file in this directory.")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Label the profiles with this config instead of their own.")
@click.option("--cluster", is_flag=True,
              help="Evaluate against the Nodes of the cluster (one list call) instead of profiles, with the "
                   "credentials every command finds: --kubeconfig, else KUBECONFIG, else ~/.kube/config, else the "
                   "pod's service account.")
@kubeconfig_option(when="With --cluster (which it implies)")
@click.option("--verbose", "-v", is_flag=True, help="Also say why each other target does not match.")
@format_option(help="json: {targets, matched, total, terms, results: [{name, match, term, near, reasons}], hints}, "
               "every target included.")
def match(selector_text: str | None, affinity: Path | None, profiles: tuple[str, ...], profiles_dir: Path | None,
          config_path: Path | None, cluster: bool, kubeconfig: str | None, verbose: bool, fmt: str) -> None:
    """Which nodes a label selector (k=v, k!=v, k in (a,b), k notin (a,b), k, !k) or a node affinity
    file would land on: built-in profiles, given profiles, or a live cluster's Nodes. Near misses
    name the requirement that failed and the closest existing value. Exit 0 when something
    matches, 1 when nothing does, 2 on bad input."""
    selector = selector_of(selector_text, affinity)
    cluster = cluster or kubeconfig is not None
    if cluster and (profiles or profiles_dir is not None):
        raise BadInput("give --cluster or --kubeconfig (live nodes) or --simulate/--profiles-dir (profiles), not both")
    if profiles and profiles_dir is not None:
        raise BadInput("give --simulate PROFILE or --profiles-dir DIR, not both")
    if cluster:
        targets, what = node_targets(kubeconfig), "nodes"
    else:
        targets, what = profile_targets(profiles, profiles_dir, config_path), "profiles"
    if fmt == "json":
        document = match_document(selector, targets, what)
        emit(json.dumps(document, indent=2) + "\n")
        matched = document["matched"]
    else:
        text, matched = match_report(selector, targets, verbose, what)
        emit(text)
    if not matched:
        sys.exit(1)


# --- nodes -----------------------------------------------------------------------------------------

@click.command()
@kubeconfig_option
@format_option()
@click.argument("names", nargs=-1, metavar="[NODE ...]", shell_complete=complete_node_names)
def nodes(kubeconfig: str | None, fmt: str, names: tuple[str, ...]) -> None:
    """The GPU nodes at a glance, one line each: vendor, model, count, memory, sharing, MIG, each GPU
    resource's capacity/allocatable/in use by pods, labeller and plugin readiness. One list of Nodes
    and one of Pods (bound, not finished), however many nodes."""
    from labeller.cluster.connect import calls
    from labeller.host.fleet import POD_FIELD_SELECTOR, fleet, fleet_text

    with calls(kubeconfig, "list nodes and pods") as kube:
        node_list, _ = kube.list_nodes()
        pod_list, _ = kube.list_pods(field_selector=POD_FIELD_SELECTOR)
    rows = [r for r in fleet(node_list, pod_list) if not names or r.name in names]
    unknown = sorted(set(names) - {r.name for r in rows})
    if unknown:
        raise BadInput(f"no GPU node named {unknown[0]}")
    emit(json.dumps([r.document() for r in rows], indent=2) + "\n" if fmt == "json" else fleet_text(rows))
