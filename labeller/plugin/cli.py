"""The ``gpu-labeller device-plugin`` command (loaded lazily: it imports grpc)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import click
import structlog

from labeller.config import ConfigError, load_config
from labeller.discovery_options import discovery_options, open_node
from labeller.metrics import start_http_server
from labeller.plugin.app import DevicePlugin, PluginSettings
from labeller.plugin.metrics import PluginMetrics

log = structlog.get_logger(__name__)

DEFAULT_SOCKET_DIR = Path("/var/lib/kubelet/device-plugins")
STALL_SECONDS = 10.0
SIGNAL_POLL_SECONDS = 0.2


@click.command("device-plugin")
@discovery_options
@click.option("--socket-dir", type=click.Path(path_type=Path, file_okay=False), default=DEFAULT_SOCKET_DIR,
              show_default=True, envvar="DP_SOCKET_DIR", help="The kubelet's device-plugins directory. [env: DP_SOCKET_DIR]")
@click.option("--kubelet-socket", default="kubelet.sock", show_default=True, envvar="DP_KUBELET_SOCKET",
              help="The kubelet's registration socket, a file name in --socket-dir. [env: DP_KUBELET_SOCKET]")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=8081, show_default=True,
              help="Port for /healthz, /readyz and /metrics (0: any free port).")
@click.option("--metrics-bind", default="0.0.0.0", show_default=True, help="Address the metrics server binds.")
@click.option("--health-recovery-seconds", type=click.FloatRange(min=0), default=60.0, show_default=True,
              envvar="DP_HEALTH_RECOVERY_SECONDS",
              help="An Unhealthy device that answers normally, with no new error, for this long is Healthy "
                   "again (0: never, as NVIDIA's plugin). [env: DP_HEALTH_RECOVERY_SECONDS]")
def device_plugin(host_root: Path, simulate: str | None, config_path: Path | None, socket_dir: Path,
                  kubelet_socket: str, metrics_port: int, metrics_bind: str, health_recovery_seconds: float) -> None:
    """Serve this node's GPUs to the kubelet (device plugin API v1beta1).

    One gRPC server per resource (nvidia.com/gpu, nvidia.com/mig-<profile>, amd.com/gpu, and
    <name>.shared under time-slicing) on its own socket in --socket-dir, registered with the
    kubelet and re-registered when the kubelet restarts. SIGTERM or SIGINT: stop, remove the
    sockets, exit 0. SIGHUP: re-read the config, probe again, serve anew (a config that fails to
    load is logged and the old one kept). Health env: DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS.
    """
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # gRPC core's own INFO lines are noise in the pod log
    if "/" in kubelet_socket:
        raise click.BadParameter("a file name in --socket-dir, not a path", param_hint="--kubelet-socket")
    terminate = threading.Event()
    reload = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal received", signal=signal.Signals(signum).name)
        (reload if signum == signal.SIGHUP else terminate).set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    current: list[DevicePlugin] = []  # the plugin being served, for the health endpoints
    metrics = PluginMetrics()  # one registry for the process: the HTTP server outlives a SIGHUP reload
    http = start_http_server(metrics_port, metrics_bind, ready=lambda: bool(current) and current[0].ready,
                             healthy=lambda: not current or
                             time.monotonic() - current[0].manager.last_tick < STALL_SECONDS,
                             registry=metrics.registry)
    log.info("metrics server listening", port=http.port)
    try:
        while not terminate.is_set():
            reload.clear()
            _serve_until_signal(host_root, simulate, config_path, PluginSettings(
                socket_dir=socket_dir, kubelet_socket=kubelet_socket, recovery_seconds=health_recovery_seconds,
            ), metrics, current, lambda: terminate.is_set() or _reload_accepted(reload, config_path))
            if reload.is_set() and not terminate.is_set():
                log.info("SIGHUP: reloading the config and probing again")
    finally:
        http.close()
    log.info("device plugin stopped")


def _reload_accepted(reload: threading.Event, config_path: Path | None) -> bool:
    """True when SIGHUP asked for a reload and the new config is valid; a bad one keeps the old."""
    if not reload.is_set():
        return False
    try:
        load_config(config_path)
    except ConfigError as exc:
        reload.clear()
        log.error("config reload failed, serving on with the old config", reason="bad-config", error=str(exc))
        return False
    return True


def _serve_until_signal(host_root: Path, simulate: str | None, config_path: Path | None, settings: PluginSettings,
                        metrics: PluginMetrics, current: list[DevicePlugin], signalled: Callable[[], bool]) -> None:
    """Probe, serve and register until a signal; then stop and remove the sockets."""
    with open_node(host_root, simulate, config_path) as node:
        metrics.devices.clear()  # resources may differ after a reload
        plugin = DevicePlugin(node.probe(), node.config, node.host_root, node.nvml, settings, metrics)
        for resource in plugin.resources:
            log.info("resource", resource=resource.name, devices=len(resource.devices), replicas=resource.replicas)
        current[:] = [plugin]
        plugin.start()
        try:
            while not signalled():
                time.sleep(SIGNAL_POLL_SECONDS)
        finally:
            current.clear()
            plugin.stop()
