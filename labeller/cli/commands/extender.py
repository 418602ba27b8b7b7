"""``gpu-labeller scheduler-extender`` and ``gpu-labeller inspect`` (also ``kubectl-inspect-gpushare``).

Loaded lazily by ``labeller.cli.root``: importing this module pulls in the Kubernetes client.
"""

from __future__ import annotations

import json
import sys

import click

from labeller.cluster.connect import connect
from labeller.cluster.kube import KubeError
from labeller.cli.commands.options import BadInput, format_option, kubeconfig_option
from labeller.cli.commands.params import Duration, format_duration
from labeller.cli.commands.upstream import EPILOG, upstream_options
from labeller.apps.extender.app import Listen, serve
from labeller.apps.extender.binder import BindOptions
from labeller.apps.extender.cache import ShareCache
from labeller.apps.extender.feed import load_once
from labeller.apps.extender.placement import POLICIES
from labeller.model.gpushare import RESOURCE_MEM
from labeller.process.httpserver import HttpLimits, raise_open_files_limit, server_tls

DEFAULT_PORT = 39999  # gpushare's
POOL_SIZE = 16  # connections to the API: three watches, binds and the HTTP handlers' reads
# Connections open at once: a socket each (one without a request holds no thread); when all are taken, an
# idle one is closed for a new one, so clients that never authenticate cannot keep the scheduler out.
MAX_CONNECTIONS = 1024
SPARE_FILES = 128  # the listening sockets, the API connections, the log, the certificates


@click.command("scheduler-extender", epilog=EPILOG)
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True, envvar="PORT",
              help="Port of the extender API (/gpushare-scheduler/...), /healthz, /readyz and /metrics. [env: PORT, "
                   "as gpushare's]")
@click.option("--bind", "bind_address", default=None,
              help="Address to listen on. Default: 0.0.0.0 with TLS, else 127.0.0.1 (unauthenticated: local only).")
@click.option("--tls-cert-file", type=click.Path(dir_okay=False),
              help="Serve HTTPS with this certificate (PEM); with --tls-key-file and --client-ca-file.")
@click.option("--tls-key-file", type=click.Path(dir_okay=False), help="The certificate's private key (PEM).")
@click.option("--client-ca-file", type=click.Path(dir_okay=False),
              help="CA bundle (PEM) that must have signed a client's certificate: only the kube-scheduler holding "
                   "one gets an answer.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Also serve /healthz, /readyz and /metrics (only those) over plain HTTP on this port, for probes "
                   "and Prometheus when the extender port demands client certificates.")
@kubeconfig_option
@click.option("--policy", type=click.Choice(POLICIES), default="binpack", show_default=True,
              help="binpack: the fitting GPU with the least free memory; spread: the one with the most.")
@click.option("--bind-wait", type=Duration(), default="4s", show_default=True,
              help="How long a bind waits for the node's previous gpu-mem pod to be allocated by the device plugin; "
                   "keep it below the scheduler's extender httpTimeout (default 5s).")
@click.option("--assume-timeout", type=Duration(minimum=1), default="60s", show_default=True,
              help="A pod bound this long ago and still not allocated no longer holds its node's allocation lock.")
@click.option("--scheduler-name", "scheduler_names", multiple=True, default=("default-scheduler",), show_default=True,
              help="The schedulerName of the pods /bind binds (repeatable): the scheduler profiles that call "
                   "this extender.")
@click.option("--max-body-bytes", type=click.IntRange(1024), default=HttpLimits.max_body_bytes, show_default=True,
              help="Largest request body read; a longer one is answered 413.")
@click.option("--request-timeout", type=Duration(minimum=0.1), default=format_duration(HttpLimits.request_timeout_s),
              show_default=True, help="Time a client has to send one request (headers and body) from its first byte; "
                                      "also how long a connection stays open without a request.")
@click.option("--tls-handshake-timeout", type=Duration(minimum=0.1),
              default=format_duration(HttpLimits.tls_handshake_timeout_s), show_default=True,
              help="Time a client has to finish the TLS handshake; a connection that has not is closed.")
@click.option("--max-connections", type=click.IntRange(1), default=MAX_CONNECTIONS, show_default=True,
              help="Connections open at once. When all are taken, an idle one is closed for a new one: the one longest "
                   "in its TLS handshake, else the one longest without a request; when every one has a request in "
                   "flight, the new one is closed.")
@click.option("--watch-timeout", type=Duration(minimum=1), default="300s", show_default=True,
              help="Length of one watch request (watches are resumed).")
@upstream_options("scheduler-extender")
def scheduler_extender(port: int, bind_address: str | None, tls_cert_file: str | None, tls_key_file: str | None,
                       client_ca_file: str | None, metrics_port: int | None, kubeconfig: str | None, policy: str,
                       bind_wait: float, assume_timeout: float, scheduler_names: tuple[str, ...], max_body_bytes: int,
                       request_timeout: float, tls_handshake_timeout: float, max_connections: int,
                       watch_timeout: float) -> None:
    """Schedule pods by GPU memory (aliyun.com/gpu-mem), gpushare-compatible: filter, prioritize, bind."""
    tls_files = (tls_cert_file, tls_key_file, client_ca_file)
    if any(tls_files) and not all(tls_files):
        raise BadInput("--tls-cert-file, --tls-key-file and --client-ca-file go together: give all three or none")
    raise_open_files_limit(max_connections + SPARE_FILES)
    tls = (server_tls(tls_cert_file, tls_key_file, client_ca_file)
           if tls_cert_file and tls_key_file and client_ca_file else None)
    limits = HttpLimits(max_body_bytes=max_body_bytes, request_timeout_s=request_timeout,
                        max_connections=max_connections, tls_handshake_timeout_s=tls_handshake_timeout)
    listen = Listen(port, bind_address or ("0.0.0.0" if tls else "127.0.0.1"), tls, metrics_port, limits)
    options = BindOptions(policy=policy, wait_s=bind_wait, stale_s=assume_timeout, scheduler_names=scheduler_names)
    sys.exit(serve(lambda metrics: connect(kubeconfig, observer=metrics.observe_request, pool_size=POOL_SIZE),
                   listen, options, int(watch_timeout)))


@click.command(epilog=EPILOG)
@click.argument("node", required=False)
@kubeconfig_option
@format_option()
@upstream_options("inspect")
def inspect(node: str | None, kubeconfig: str | None, fmt: str) -> None:
    """Per node and GPU: total, used and free GPU memory (aliyun.com/gpu-mem units) and the pods on it."""
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
            pods = ", ".join(f"{p['namespace']}/{p['name']} "
                             f"({p['usedGPU']}{', pending allocation' if p['assumed'] else ''})"
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
