"""The ``gpu-labeller`` command line.

Commands that talk to a cluster or serve gRPC are imported only when invoked, so the dry-run path
(``labels``, ``resources``, ``probe``, ``profiles``) never loads the kubernetes client or grpc.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import click
import structlog

from labeller.config import ConfigError
from labeller.errors import InputError
from labeller.inventory import Inventory, ProbeError
from labeller.log import LEVELS, configure
from labeller.node import Node, chosen, open_node
from labeller.offer import Offer
from labeller.options import BadInput, discovery_options
from labeller.outputs import FORMATS, render, write_atomic
from labeller.snippets import SNIPPET_FORMATS, SnippetError, snippet

log = structlog.get_logger(__name__)

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

# name -> ("module:attribute" of a click command loaded on first use, short help for --help)
LAZY_COMMANDS = {
    "run": ("labeller.daemon.cli:run", "Keep this node's labels true on the cluster (the DaemonSet's job)."),
    "cleanup": ("labeller.daemon.cli:cleanup", "Remove the labels gpu-labeller set (for uninstall)."),
    "device-plugin": ("labeller.plugin.cli:device_plugin", "Serve this node's GPUs to the kubelet (device plugin API v1beta1)."),
    "mps-control-daemon": ("labeller.mps.cli:mps_control_daemon", "Run and watch the NVIDIA MPS control daemons sharing.mps needs."),
    "scheduler-extender": ("labeller.extender.cli:scheduler_extender",
                           "Schedule pods by GPU memory (aliyun.com/gpu-mem), gpushare-compatible."),
    "inspect": ("labeller.extender.cli:inspect", "Per node and GPU: total, used and free GPU memory and its pods."),
    "explain": ("labeller.authoring:explain", "Say where each label comes from, or why a key is not produced."),
    "match": ("labeller.authoring:match", "Which nodes a label selector or a node affinity would land on."),
    "nodes": ("labeller.authoring:nodes", "The GPU nodes of a cluster at a glance: models, resources, use, readiness."),
}


# A link to gpu-labeller by one of these names runs that command: kubectl finds plugins by name on PATH.
KUBECTL_PLUGINS = {"kubectl-inspect-gpushare": ("inspect", "kubectl inspect gpushare")}


class LazyGroup(click.Group):
    """The root command: loads the commands that need the cluster or grpc on first use, and is the
    one place where the domain's InputError becomes click's one line (``Error: ...``, exit code 2)."""

    def main(self, args: Any = None, prog_name: str | None = None, *rest: Any, **extra: Any) -> Any:
        plugin = KUBECTL_PLUGINS.get(os.path.basename(sys.argv[0]))
        if args is None and plugin is not None:
            name, prog = plugin
            command = self.get_command(click.Context(self), name)
            assert command is not None
            configure("warning", json_output=False)
            try:
                return command.main(sys.argv[1:], prog, *rest, **extra)
            except InputError as exc:  # the command ran outside this group's invoke
                error = BadInput(str(exc))
                error.show()
                sys.exit(error.exit_code)
        return super().main(args, prog_name, *rest, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InputError as exc:
            raise BadInput(str(exc)) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing must not import the lazy commands (that would load kubernetes and grpc).
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS:
                rows.append((name, LAZY_COMMANDS[name][1]))
            elif (command := super().get_command(ctx, name)) is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module_name, attribute = LAZY_COMMANDS[cmd_name][0].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "GPU_LABELLER"})
@click.version_option(package_name="gpu-labeller", prog_name="gpu-labeller")
@click.option("--log-level", type=click.Choice(LEVELS), default="info", show_default=True, help="Log verbosity.")
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto", show_default=True,
              help="auto: JSON inside Kubernetes or when stderr is not a terminal.")
def main(log_level: str, log_format: str) -> None:
    """Label Kubernetes nodes with their NVIDIA and AMD GPUs, and serve those GPUs to pods."""
    configure(log_level, None if log_format == "auto" else log_format == "json")


def _probe(node: Node) -> Inventory:
    """The node's inventory; a probe that cannot be trusted (no PCI device list under the host
    root) is bad input: one line on stderr, exit code 2."""
    try:
        return node.probe()
    except ProbeError as exc:
        raise BadInput(str(exc)) from None


def _offer(node: Node, inventory: Inventory, config_path: Path | None, simulate: str | None) -> Offer:
    """The node's offer; a sharing config that does not fit this node (a device it lacks) is bad
    input, named like a bad config file."""
    try:
        return node.offer(inventory)
    except ConfigError as exc:
        if node.selection is not None:
            where = f"config {node.selection.name!r}: "
        else:
            where = f"{config_path}: " if config_path is not None else f"{simulate}: config: " if simulate else ""
        raise BadInput(f"{where}{exc}") from None


@main.command()
@discovery_options
@click.option("--format", "fmt", type=click.Choice([*FORMATS, *SNIPPET_FORMATS]), default="text", show_default=True,
              help="text: key=value lines; nfd: NFD features.d file; selector, affinity: a ready-to-paste "
                   "nodeSelector or node affinity selecting nodes like this one (presence and model).")
@click.option("--min-memory", type=click.IntRange(min=1), metavar="MIB",
              help="With --format affinity: GPUs with at least this much memory (a Gt on nvidia.com/gpu.memory) "
                   "instead of this model.")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write to this file instead of standard output: a regular file is replaced atomically, "
                   "a symlink's target is written, a device or FIFO is written through.")
def labels(host_root: Path, simulate: str | None, config_path: Path | None, config_dir: Path | None,
           config_name: str | None, fmt: str, min_memory: int | None, output: Path | None) -> None:
    """Print the labels gpu-labeller would apply to this node (dry run: touches no cluster)."""
    if min_memory is not None and fmt != "affinity":
        raise BadInput("--min-memory needs --format affinity (a nodeSelector cannot compare numbers)")
    with open_node(host_root, simulate, config_path, chosen(config_path, config_dir, config_name)) as node:
        inventory = _probe(node)
        label_set = node.labels(inventory, _offer(node, inventory, config_path, simulate))
    label_set.log_problems(log)
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


@main.command()
@discovery_options
def probe(host_root: Path, simulate: str | None, config_path: Path | None, config_dir: Path | None,
          config_name: str | None) -> None:
    """Print the discovered inventory as JSON: what each backend saw, and why it found nothing. PCI
    ids, classes and revisions are in hex, as lspci writes them (10de:2330, class 0302, rev a1)."""
    with open_node(host_root, simulate, config_path, chosen(config_path, config_dir, config_name)) as node:
        inventory = _probe(node)
    parts = {part.vendor: part for part in inventory.parts}
    document = {
        "pci_gpus": _jsonable(inventory.pci_gpus),
        **{vendor.name: _jsonable(parts.get(vendor.name)) for vendor in node.vendors},
        "machine": inventory.machine,
        "reports": _jsonable(inventory.reports),
        "partial": inventory.partial,
    }
    emit(json.dumps(document, indent=2) + "\n")


def offer_document(offer: Offer, node: Node) -> dict[str, Any]:
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


@main.command()
@discovery_options
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def resources(host_root: Path, simulate: str | None, config_path: Path | None, config_dir: Path | None,
              config_name: str | None, fmt: str) -> None:
    """Print what the device plugin would advertise on this node: each resource, its devices and
    their IDs, replicas and health checks (dry run: serves nothing, touches no cluster)."""
    with open_node(host_root, simulate, config_path, chosen(config_path, config_dir, config_name)) as node:
        document = offer_document(_offer(node, _probe(node), config_path, simulate), node)
    emit(json.dumps(document, indent=2) + "\n" if fmt == "json" else offer_text(document))


@main.command()
def profiles() -> None:
    """List the built-in simulated node profiles."""
    from vendors.simulate import builtin_profiles

    emit("".join(f"{name:<24} {description}\n" for name, description in builtin_profiles().items()))


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print a shell completion script (eval "$(gpu-labeller completion bash)")."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    emit(cls(main, {}, "gpu-labeller", "_GPU_LABELLER_COMPLETE").source() + "\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
