"""The dry-run commands: ``labels``, ``probe``, ``resources``, ``resourceslices``, ``profiles``, ``completion``.

They touch no cluster and serve nothing, so they import neither the kubernetes client nor grpc.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from labeller.model.config import ConfigError
from labeller.model.inventory import Inventory, ProbeError
from labeller.host.machine import Host, NodeOptions, open_host
from labeller.model.offer import Offer
from labeller.cli.commands.options import BadInput, discovery_options, format_option, node_name_option
from labeller.cli.commands.upstream import EPILOG, upstream_options
from labeller.base.outputs import FORMATS, render, write_atomic
from labeller.model.resourceslices import resource_slices
from labeller.host.snippets import SNIPPET_FORMATS, SnippetError, snippet
from labeller.base.log import get_logger

log = get_logger(__name__)
# libyaml when PyYAML has it: the same text, 4x faster
_YAML_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# Failures of the write itself (not of the path): a full disk, a closed pipe, an I/O error.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EPIPE, errno.EIO})


class WriteFailed(click.ClickException):
    """The output could not be written (full disk, closed pipe): one line on stderr, exit code 1."""

    exit_code = 1


def emit(text: str) -> None:
    """Print ``text`` on standard output; a closed stdout or a full disk raises WriteFailed."""
    try:
        if sys.stdout is None:  # started with stdout closed (`>&-`)
            raise OSError(errno.EBADF, "standard output is closed")
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        _discard_stdout()
        raise WriteFailed(f"cannot write to standard output: {exc.strerror or exc}") from None


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit cannot fail again (and print
    "Exception ignored ... BrokenPipeError" after our one line)."""
    try:
        stdout = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # closed, or not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stdout)
    finally:
        os.close(devnull)

def probe_host(host: Host) -> Inventory:
    """The node's inventory; a probe that cannot be trusted (no PCI device list under the host
    root) is bad input: one line on stderr, exit code 2."""
    try:
        return host.probe()
    except ProbeError as exc:
        raise BadInput(str(exc)) from None


def say_if_no_gpu(inventory: Inventory, options: NodeOptions) -> None:
    """On a machine without GPUs the dry-run commands print nothing: say why on stderr, and how to
    see what they print on a GPU node. Standard output and the exit code (0) stay as they are."""
    if not inventory.pci_gpus and options.simulate is None:
        log.warning("no GPU found on this machine (no NVIDIA or AMD GPU among the PCI devices), so nothing to "
                    "describe; to see the output for a GPU node, add --simulate PROFILE (gpu-labeller profiles "
                    "lists them)", reason="no-gpu")


def offer_of(host: Host, inventory: Inventory, options: NodeOptions) -> Offer:
    """The host's offer; a sharing config that does not fit this host (a device it lacks) is bad
    input, named like a bad config file."""
    try:
        return host.offer(inventory)
    except ConfigError as exc:
        if host.selection is not None:
            where = f"config {host.selection.name!r}: "
        elif options.config_path is not None:
            where = f"{options.config_path}: "
        else:
            where = f"{options.simulate}: config: " if options.simulate else ""
        raise BadInput(f"{where}{exc}") from None


@click.command(epilog=EPILOG)
@discovery_options
@format_option(*FORMATS, *SNIPPET_FORMATS,
               help="text: key=value lines; nfd: NFD features.d file; selector, affinity: a ready-to-paste "
                    "nodeSelector or node affinity selecting nodes like this one (presence and model).")
@click.option("--min-memory", type=click.IntRange(min=1), metavar="MIB",
              help="With --format affinity: GPUs with at least this much memory (a Gt on nvidia.com/gpu.memory) "
                   "instead of this model.")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write to this file instead of standard output: a regular file is replaced atomically, "
                   "a symlink's target is written, a device or FIFO is written through.")
@upstream_options("labels")
def labels(node_options: NodeOptions, fmt: str, min_memory: int | None, output: Path | None) -> None:
    """Print the labels gpu-labeller would apply to this node (dry run: touches no cluster)."""
    if min_memory is not None and fmt != "affinity":
        raise BadInput("--min-memory needs --format affinity (a nodeSelector cannot compare numbers)")
    with open_host(node_options, node_options.chosen()) as host:
        inventory = probe_host(host)
        label_set = host.labels(inventory, offer_of(host, inventory, node_options))
    label_set.log_problems(log)
    say_if_no_gpu(inventory, node_options)
    text = _snippet(label_set.labels, fmt, min_memory) if fmt in SNIPPET_FORMATS else render(label_set.labels, fmt)
    if output is None:
        emit(text)
        return
    try:
        write_atomic(output, text, make_parents=False)
    except OSError as exc:
        message = f"{output}: cannot write: {exc.strerror or exc}"
        raise (WriteFailed(message) if exc.errno in WRITE_ERRNOS else BadInput(message)) from None


def _snippet(labels: dict[str, str], fmt: str, min_memory: int | None) -> str:
    try:
        return snippet(labels, fmt, min_memory)
    except SnippetError as exc:
        raise BadInput(str(exc)) from None


def _pci_class(code: int) -> str:
    """As lspci -n writes it: class and subclass, ``0302``; a non-zero programming interface after it."""
    return f"{code >> 8:04x}" + (f" prog-if {code & 0xFF:02x}" if code & 0xFF else "")


# PCI fields the probe prints in hex, as lspci does (10de:2330, class 0302, rev a1)
_HEX_FIELDS: dict[str, Any] = {"vendor_id": "{:04x}".format, "device_id": "{:04x}".format, "revision": "{:02x}".format,
                               "class_code": _pci_class, "pci_class": _pci_class}


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            hexed = f.name in _HEX_FIELDS and isinstance(item, int) and not isinstance(item, bool)
            out[f.name] = _HEX_FIELDS[f.name](item) if hexed else _jsonable(item)
        if {"vendor_id", "device_id"} <= set(out) and isinstance(out["vendor_id"], str):
            out = {"bdf": out.pop("bdf", None), "id": f"{out['vendor_id']}:{out['device_id']}", **out}
        return out
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


@click.command()
@discovery_options
def probe(node_options: NodeOptions) -> None:
    """Print the discovered inventory as JSON: what each backend saw, and why it found nothing. PCI
    ids, classes and revisions are in hex, as lspci writes them (10de:2330, class 0302, rev a1)."""
    with open_host(node_options, node_options.chosen()) as host:
        inventory = probe_host(host)
    parts = {part.vendor: part for part in inventory.parts}
    document = {
        "pci_gpus": _jsonable(inventory.pci_gpus),
        **{vendor.name: _jsonable(parts.get(vendor.name)) for vendor in host.vendors},
        "machine": inventory.machine,
        "reports": _jsonable(inventory.reports),
        "partial": inventory.partial,
    }
    emit(json.dumps(document, indent=2) + "\n")


def offer_document(offer: Offer, node: Host) -> dict[str, Any]:
    """The offer as ``resources --format json`` prints it."""
    health = {vendor.name: vendor.devices.health_source for vendor in node.vendors}
    return {
        "resources": [{
            "name": r.name, "base": r.base, "vendor": r.vendor, "socket": r.socket_name,
            "count": len(r.devices), "physical": len(r.physical_devices), "replicas": r.replicas,
            "sharing": r.strategy, "renamed": r.renamed, "health": health[r.vendor],
            "devices": [{"id": d.id, "physical": d.physical.health_key, "gpu": d.physical.gpu,
                         "partition": d.physical.partition, "numa_node": d.physical.numa_node}
                        for d in r.devices],
        } for r in offer.resources],
        "withheld": offer.withheld,
        "held": [{"name": h.resource.name, "base": h.resource.base, "vendor": h.resource.vendor,
                  "count": len(h.resource.devices), "replicas": h.resource.replicas, "sharing": h.resource.strategy,
                  "reason": h.reason, "waiting": h.waiting} for h in offer.held],
    }


def _shared_text(resource: dict[str, Any]) -> str:
    """How the devices share their physical ones: replicas, or units of each GPU's memory."""
    if resource["replicas"] <= 1:
        return ""
    if resource["sharing"] != "memory":
        return f" x {resource['replicas']} replicas, {resource['sharing']}"
    per_gpu, uneven = divmod(resource["count"], resource["physical"])
    return ", each its memory in units" if uneven else f", {per_gpu} memory units each"


def offer_text(document: dict[str, Any]) -> str:
    lines = []
    for r in document["resources"]:
        lines.append(f"{r['name']}: {r['count']} devices ({r['physical']} physical{_shared_text(r)}), "
                     f"socket {r['socket']}")
        lines.append(f"  health: {r['health']}")
        for d in r["devices"]:
            where = ", ".join(f"{k} {d[k]}" for k in ("partition", "numa_node") if d[k] is not None)
            lines.append(f"  {d['id']}  on {d['gpu']}" + (f" ({where})" if where else ""))
    lines.extend(f"{base}: nothing offered: {reason}" for base, reason in document["withheld"].items())
    lines.extend(f"{h['name']}: {h['count']} devices not advertised ({'waiting' if h['waiting'] else 'held'}): "
                 f"{h['reason']}" for h in document["held"])
    return "".join(line + "\n" for line in lines)


@click.command(epilog=EPILOG)
@discovery_options
@format_option()
@upstream_options("resources")
def resources(node_options: NodeOptions, fmt: str) -> None:
    """Print what the device plugin would advertise on this node: each resource, its devices and
    their IDs, replicas and health checks (dry run: serves nothing, touches no cluster)."""
    with open_host(node_options, node_options.chosen()) as host:
        inventory = probe_host(host)
        document = offer_document(offer_of(host, inventory, node_options), host)
    say_if_no_gpu(inventory, node_options)
    emit(json.dumps(document, indent=2) + "\n" if fmt == "json" else offer_text(document))


def _dra_vendors(text: str, host: Host) -> tuple[str, ...]:
    """``--dra-vendors``: 'all' (every vendor with a DRA driver), or names separated by commas."""
    known = [v.name for v in host.vendors if v.dra is not None]
    names = known if text == "all" else [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise BadInput(f"--dra-vendors: {unknown[0]!r} is not a vendor with a DRA driver (known: {', '.join(known)}, "
                       "or all)")
    return tuple(dict.fromkeys(names))


@click.command()
@discovery_options
@node_name_option("The Node the slices are for (their pool and spec.nodeName); default: this machine's host name. "
                  "[env: NODE_NAME]")
@click.option("--dra-vendors", metavar="VENDORS|all",
              help="Show the slices as if the config's labeller.dra.vendors were these vendors (comma-separated, "
                   "or all): what moving the node to DRA would publish.")
@format_option("yaml", "json", help="yaml: one document per slice (kubectl apply -f takes it); json: a v1 List.")
def resourceslices(node_options: NodeOptions, dra_vendors: str | None, fmt: str) -> None:
    """Print the ResourceSlices the DRA plugin would publish for this node: one pool per DRA driver the
    config serves (labeller.dra.vendors), devices named and described as the vendors' DRA drivers do
    (dry run: serves nothing, touches no cluster). Under a config that serves no vendor through DRA,
    what every vendor present would publish (as --dra-vendors all), saying so on stderr."""
    node = node_options.node_name or socket.gethostname()
    with open_host(node_options, node_options.chosen()) as host:
        preview = dra_vendors is None and not host.config.dra_vendors
        if dra_vendors is not None or preview:
            host.config = dataclasses.replace(host.config, dra_vendors=_dra_vendors(dra_vendors or "all", host))
        inventory = probe_host(host)
        devices = host.dra_devices(inventory, offer_of(host, inventory, node_options))
    say_if_no_gpu(inventory, node_options)
    if preview and devices:
        log.warning("this config serves no vendor through DRA (labeller.dra.vendors is empty), so the DRA plugin "
                    "would publish nothing; shown: what every vendor present would publish (--dra-vendors all)",
                    reason="dra-off", drivers=sorted(devices))
    slices = resource_slices(node, devices)
    if fmt == "json":
        emit(json.dumps({"apiVersion": "v1", "kind": "List", "items": slices}, indent=2) + "\n")
    else:
        emit(yaml.dump_all(slices, Dumper=_YAML_DUMPER, sort_keys=False) if slices else "")


@click.command()
@format_option(help="json: a list of {name, description}.")
def profiles(fmt: str) -> None:
    """List the built-in simulated node profiles."""
    from vendors.simulate import builtin_profiles

    if fmt == "json":
        emit(json.dumps([{"name": name, "description": description}
                         for name, description in builtin_profiles().items()], indent=2) + "\n")
        return
    emit("".join(f"{name:<24} {description}\n" for name, description in builtin_profiles().items()))


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print a shell completion script (eval "$(gpu-labeller completion bash)")."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    root = click.get_current_context().find_root().command
    emit(cls(root, {}, "gpu-labeller", "_GPU_LABELLER_COMPLETE").source() + "\n")
