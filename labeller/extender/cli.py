"""``gpu-labeller scheduler-extender`` and ``gpu-labeller inspect`` (also ``kubectl-inspect-gpushare``).

Loaded lazily by ``labeller.cli``: importing this module pulls in the Kubernetes client.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import click
import structlog

from labeller.extender.binder import Binder, BindOptions
from labeller.extender.cache import ShareCache
from labeller.extender.feed import Feed, load_once
from labeller.extender.metrics import Metrics
from labeller.extender.placement import POLICIES
from labeller.extender.server import Extender
from labeller.gpushare import RESOURCE_MEM
from labeller.cluster.connect import connect
from labeller.cluster.kube import Kube, KubeError
from labeller.commands.options import BadInput
from labeller.commands.params import Duration
from labeller.runtime import HealthServer, PortUnavailable, run_until_signalled, start_http_server

log = structlog.get_logger("gpu_labeller.extender")

DEFAULT_PORT = 39999  # gpushare's
KUBECTL_CONFIG = os.path.join("~", ".kube", "config")
POOL_SIZE = 16  # connections to the API: three watches, binds and the HTTP handlers' reads


@click.command("scheduler-extender")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port of the extender API (/gpushare-scheduler/...), /healthz, /readyz and /metrics.")
@click.option("--bind", "bind_address", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--kubeconfig", envvar="KUBECONFIG", type=click.Path(dir_okay=False),
              help="Kubeconfig file; default: the pod's service account. [env: KUBECONFIG]")
@click.option("--policy", type=click.Choice(POLICIES), default="binpack", show_default=True,
              help="binpack: the fitting GPU with the least free memory; spread: the one with the most.")
@click.option("--bind-wait", type=Duration(), default="4s", show_default=True,
              help="How long a bind waits for the node's previous gpu-mem pod to be allocated by the device plugin; "
                   "keep it below the scheduler's extender httpTimeout (default 5s).")
@click.option("--assume-timeout", type=Duration(minimum=1), default="60s", show_default=True,
              help="A pod bound this long ago and still not allocated no longer holds its node's allocation lock.")
@click.option("--scheduler-name", "scheduler_names", multiple=True, default=("default-scheduler",), show_default=True,
              help="The schedulerName of the pods /bind binds (repeatable): the scheduler profiles that call this extender.")
@click.option("--watch-timeout", type=Duration(minimum=1), default="300s", show_default=True,
              help="Length of one watch request (watches are resumed).")
def scheduler_extender(port: int, bind_address: str, kubeconfig: str | None, policy: str, bind_wait: float,
                       assume_timeout: float, scheduler_names: tuple[str, ...], watch_timeout: float) -> None:
    """Schedule pods by GPU memory (aliyun.com/gpu-mem), gpushare-compatible: filter, prioritize, bind."""
    options = BindOptions(policy=policy, wait_s=bind_wait, stale_s=assume_timeout, scheduler_names=scheduler_names)
    try:
        running = start(lambda metrics: connect(kubeconfig, observer=metrics.observe_request, pool_size=POOL_SIZE),
                        port, bind_address, options, int(watch_timeout))
    except PortUnavailable as exc:
        raise BadInput(str(exc)) from None
    log.info("started", reason="start", port=running.http.port, policy=policy)
    run_until_signalled(running.stop.wait, running.stop.set, lambda: None)
    log.info("stopped", reason="stop")


@dataclass
class Running:
    """A started extender: its cache, HTTP server (``http.port``) and the event that stops it."""

    cache: ShareCache
    metrics: Metrics
    binder: Binder
    feed: Feed
    http: HealthServer
    stop: threading.Event
    kube: Kube

    def close(self) -> None:
        self.stop.set()
        self.http.close()
        self.kube.close()


def start(make_kube: Callable[[Metrics], Kube], port: int, bind_address: str = "0.0.0.0",
          options: BindOptions = BindOptions(), watch_timeout_s: int = 300) -> Running:
    """Serve the extender on ``port`` and follow the cluster; ready once every first list is in."""
    cache = ShareCache()
    metrics = Metrics(cache)
    kube = make_kube(metrics)
    binder = Binder(kube, cache, options, observe_wait=metrics.bind_wait.observe)
    stop = threading.Event()
    feed = Feed(kube, cache, stop, watch_timeout_s=watch_timeout_s)
    http = start_http_server(port, bind_address, ready=lambda: len(cache.synced) == len(feed.sources),
                             registry=metrics.registry, app=Extender(cache, binder, metrics), flag="--port")
    feed.start()
    return Running(cache, metrics, binder, feed, http, stop, kube)


@click.command()
@click.argument("node", required=False)
@click.option("--kubeconfig", envvar="KUBECONFIG", type=click.Path(dir_okay=False),
              help=f"Kubeconfig file; default: {KUBECTL_CONFIG} when it exists, else the pod's service account. "
                   "[env: KUBECONFIG]")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def inspect(node: str | None, kubeconfig: str | None, fmt: str) -> None:
    """Per node and GPU: total, used and free GPU memory (aliyun.com/gpu-mem units) and the pods on it."""
    if not kubeconfig and os.path.exists(os.path.expanduser(KUBECTL_CONFIG)):
        kubeconfig = os.path.expanduser(KUBECTL_CONFIG)
    kube = connect(kubeconfig, pool_size=POOL_SIZE)
    cache = ShareCache()
    try:
        load_once(kube, cache)
    except KubeError as exc:
        click.echo(f"Error: cannot read the cluster: {exc}", err=True)
        sys.exit(1)
    finally:
        kube.close()
    nodes = cache.inspect(node)
    if node is not None and not nodes:
        raise BadInput(f"node {node}: not found, or it shares no GPU memory (no {RESOURCE_MEM} capacity)")
    click.echo(json.dumps({"nodes": nodes}, indent=2) if fmt == "json" else inspect_text(nodes))


def inspect_text(nodes: list[dict[str, object]]) -> str:
    rows = [("NODE", "GPU", "TOTAL", "USED", "FREE", "PODS")]
    total = used = 0
    for node in nodes:
        for dev in node["devs"]:  # type: ignore[attr-defined]
            pods = ", ".join(f"{p['namespace']}/{p['name']} ({p['usedGPU']}{', pending allocation' if p['assumed'] else ''})"
                             for p in dev["pods"]) or "-"
            free = str(dev["freeGPU"]) if dev["healthy"] else "unhealthy"
            rows.append((str(node["name"]), str(dev["id"]), str(dev["totalGPU"]), str(dev["usedGPU"]), free, pods))
            if dev["healthy"]:
                total += int(dev["totalGPU"])
                used += int(dev["usedGPU"])
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[5] for row in rows]
    share = f" ({100 * used // total}%)" if total else ""
    lines.append(f"Allocated/Total GPU memory of healthy GPUs in cluster: {used}/{total}{share}")
    return "\n".join(lines)
