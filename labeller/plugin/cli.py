"""The ``gpu-labeller device-plugin`` command (loaded lazily: it imports grpc)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import click
import structlog

from labeller.configwatch import ConfigFollower, ConfigMetrics, follow_configs, followed_label
from labeller.namedconfigs import Selection
from labeller.node import named_configs, open_node
from labeller.options import BadInput, config_label_option, discovery_options
from labeller.runtime import PortUnavailable, install_signals, start_http_server
from labeller.params import Duration
from labeller.plugin.app import DevicePlugin, PluginSettings
from labeller.plugin.metrics import PluginMetrics
from labeller.plugin.prober import Prober

log = structlog.get_logger(__name__)

DEFAULT_SOCKET_DIR = Path("/var/lib/kubelet/device-plugins")
STALL_SECONDS = 10.0


@click.command("device-plugin")
@discovery_options
@config_label_option
@click.option("--node-name", envvar="NODE_NAME", help="This Node's name, to follow --config-label. [env: NODE_NAME]")
@click.option("--kubeconfig", envvar="KUBECONFIG", type=click.Path(dir_okay=False),
              help="Kubeconfig file to read the own Node's labels; default: the pod's service account. [env: KUBECONFIG]")
@click.option("--socket-dir", type=click.Path(path_type=Path, file_okay=False), default=DEFAULT_SOCKET_DIR,
              show_default=True, envvar="DP_SOCKET_DIR", help="The kubelet's device-plugins directory. [env: DP_SOCKET_DIR]")
@click.option("--kubelet-socket", default="kubelet.sock", show_default=True, envvar="DP_KUBELET_SOCKET",
              help="The kubelet's registration socket, a file name in --socket-dir. [env: DP_KUBELET_SOCKET]")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=8081, show_default=True,
              help="Port for /healthz, /readyz and /metrics (0: any free port).")
@click.option("--metrics-bind", default="0.0.0.0", show_default=True, help="Address the metrics server binds.")
@click.option("--health-recovery-seconds", type=Duration(), default=60.0, show_default=True,
              envvar="DP_HEALTH_RECOVERY_SECONDS",
              help="An Unhealthy device that answers normally, with no new error, for this long (60, 90s, 2m) is "
                   "Healthy again (0: never, as NVIDIA's plugin). [env: DP_HEALTH_RECOVERY_SECONDS]")
def device_plugin(host_root: Path, simulate: str | None, config_path: Path | None, config_dir: Path | None,
                  config_name: str | None, config_label: str, node_name: str | None, kubeconfig: str | None,
                  socket_dir: Path, kubelet_socket: str, metrics_port: int, metrics_bind: str,
                  health_recovery_seconds: float) -> None:
    """Serve this node's GPUs to the kubelet (device plugin API v1beta1).

    One gRPC server per resource (nvidia.com/gpu, nvidia.com/mig-<profile>, amd.com/gpu, and
    <name>.shared under time-slicing) on its own socket in --socket-dir, registered with the
    kubelet and re-registered when the kubelet restarts. While the driver is not ready (NVML
    missing, no KFD topology, nothing to serve) it probes again on its own, 1 s doubling to 30 s;
    flags.failOnInitError: true exits with 1 instead. SIGHUP: re-read the config, probe again and
    update the served devices in place (a config that fails to load is logged and the old one
    kept). With --config-dir, the config the node's --config-label names is served, and a change of
    the label or of the files is served the same way. SIGTERM or SIGINT: stop, remove the sockets,
    exit 0. Health env: DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS.
    """
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # gRPC core's own INFO lines are noise in the pod log
    if "/" in kubelet_socket:
        raise click.BadParameter("a file name in --socket-dir, not a path", param_hint="--kubelet-socket")
    terminate = threading.Event()
    reload = threading.Event()
    metrics = PluginMetrics()
    follower, selection = _follow(config_path, config_dir, config_name, config_label, node_name, kubeconfig, metrics,
                                  terminate)
    install_signals(terminate.set, reload.set)
    plugin = DevicePlugin(PluginSettings(socket_dir=socket_dir, kubelet_socket=kubelet_socket,
                                         recovery_seconds=health_recovery_seconds), metrics)
    with open_node(host_root, simulate, config_path, selection) as node:
        try:
            http = start_http_server(metrics_port, metrics_bind, ready=lambda: plugin.ready,
                                     healthy=lambda: plugin.healthy(STALL_SECONDS), registry=metrics.registry)
        except PortUnavailable as exc:
            raise BadInput(str(exc)) from None
        log.info("metrics server listening", port=http.port)
        try:
            with plugin:
                prober = Prober(node, plugin, config_path, follower=follower)
                if follower is not None:
                    follower.apply(node)
                    follower.poll(terminate)
                code = prober.run(terminate, reload)
        finally:
            http.close()
    if code:
        sys.exit(code)
    log.info("device plugin stopped")


def _follow(config_path: Path | None, config_dir: Path | None, config_name: str | None, config_label: str,
            node_name: str | None, kubeconfig: str | None, metrics: PluginMetrics,
            stop: threading.Event) -> tuple[ConfigFollower | None, Selection | None]:
    """With --config-dir: the follower of the named configs and, with --config-label, of the own
    Node's label (the Kubernetes client is loaded only then: it costs about 22 MiB of RSS)."""
    chooser = named_configs(config_path, config_dir, config_name)
    if chooser is None:
        return None, None
    label = followed_label(chooser, config_label)
    kube = None
    if label is not None:
        if not node_name:
            raise BadInput("--config-label needs this Node's name to read its label: give --node-name NAME or set "
                           "NODE_NAME, or --config-label '' to follow no label")
        from labeller.daemon.cli import connect
        from labeller.daemon.sinks import PermissionLog

        structlog.contextvars.bind_contextvars(node=node_name)
        kube = connect(kubeconfig, "--config-label '' to follow no node label")  # loads the Kubernetes client
    follower, selection = follow_configs(chooser, label, kube, node_name or "", ConfigMetrics(metrics.registry,
                                                                                              "gpu_labeller_plugin"))
    if kube is not None and node_name:
        follower.watch(kube, node_name, stop, PermissionLog())
    return follower, selection
