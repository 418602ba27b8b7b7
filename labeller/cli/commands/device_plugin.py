"""The ``gpu-labeller device-plugin`` command (loaded lazily: it imports grpc)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from labeller.cli.commands.options import (BadInput, discovery_options, endpoint_options, given_as,
                                       health_recovery_option, own_node_options, parent_must_exist)
from labeller.cli.commands.upstream import EPILOG, upstream_options
from labeller.host.machine import Host, NodeOptions
from labeller.apps.plugin.app import DevicePlugin, PluginSettings
from labeller.apps.plugin.cdi import DEFAULT_SPEC_DIR
from labeller.apps.plugin.metrics import PluginMetrics
from labeller.apps.plugin.prober import Prober
from labeller.process.follow import ConfigFollower
from labeller.process.serve import Endpoint, Process, Served, serve

if TYPE_CHECKING:
    from labeller.apps.plugin.gpushare_allocate import PodApi

DEFAULT_SOCKET_DIR = Path("/var/lib/kubelet/device-plugins")
STALL_SECONDS = 10.0


def pod_api(kubeconfig: str | None) -> Callable[[], PodApi]:
    """The API client memory sharing reads and annotates pods with, made on first use."""

    def connect() -> PodApi:
        from labeller.cluster.connect import connect as connect_api

        return connect_api(kubeconfig)  # NoCredentials says why there is no access

    return connect


@click.command("device-plugin", epilog=EPILOG)
@discovery_options
@own_node_options("This Node's name, to follow --config-label and, under sharing.memory, to read the pods bound "
                  "to it. [env: NODE_NAME]")
@click.option("--socket-dir", type=click.Path(path_type=Path, file_okay=False), default=DEFAULT_SOCKET_DIR,
              show_default=True, envvar="DP_SOCKET_DIR",
              help="The kubelet's device-plugins directory. [env: DP_SOCKET_DIR]")
@click.option("--kubelet-socket", default="kubelet.sock", show_default=True,
              envvar=["DP_KUBELET_SOCKET", "KUBELET_SOCKET"],
              help="The kubelet's registration socket: a file name in --socket-dir, or its path there (as NVIDIA's "
                   "plugin takes it). [env: DP_KUBELET_SOCKET, NVIDIA's KUBELET_SOCKET]")
@endpoint_options(8081)
@health_recovery_option("Healthy again (0: never, as NVIDIA's plugin)")
@click.option("--cdi-spec-dir", type=click.Path(path_type=Path, file_okay=False), default=DEFAULT_SPEC_DIR,
              show_default=True, envvar="CDI_SPEC_DIR",
              help="Where CDI spec files go when flags.plugin.deviceListStrategy has cdi-annotations or cdi-cri "
                   "(gpu-labeller-<vendor>.json). [env: CDI_SPEC_DIR]")
@upstream_options("device-plugin")
def device_plugin(node_options: NodeOptions, socket_dir: Path, kubelet_socket: str, endpoint: Endpoint,
                  health_recovery_seconds: float, cdi_spec_dir: Path) -> None:
    """Serve this node's GPUs to the kubelet (device plugin API v1beta1).

    One gRPC server per resource (nvidia.com/gpu, nvidia.com/mig-<profile>, amd.com/gpu or
    amd.com/<compute>_<memory> under AMD's mixed naming, and the shared ones: <name>.shared, rename) on
    its own socket in --socket-dir, registered with the kubelet and re-registered when the kubelet
    restarts. MPS replicas are served while gpu-labeller mps-control-daemon says it serves them. Under a
    CDI deviceListStrategy the CDI spec files go to --cdi-spec-dir. While the driver is not ready (NVML
    missing, no KFD topology, nothing to serve) it probes again on its own, 1 s doubling to 30 s;
    flags.failOnInitError: true exits with 1 instead. SIGHUP: re-read the config, probe again and update
    the served devices in place (a config that fails to load is logged and the old one kept). With
    --config-dir, the config the node's --config-label names is served, and a change of the label or of
    the files is served the same way. SIGTERM or SIGINT: stop, remove the sockets, exit 0. Health env:
    DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS.
    """
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # gRPC core's own INFO lines are noise in the pod log
    if "/" in kubelet_socket:  # NVIDIA's form: the whole path, which must be in --socket-dir
        if Path(kubelet_socket).parent != socket_dir:
            raise BadInput(f"{given_as('kubelet_socket', kubelet_socket)}: not in --socket-dir {socket_dir} (the "
                           "kubelet's registration socket is a file name in --socket-dir, or its path there)")
        kubelet_socket = Path(kubelet_socket).name
    parent_must_exist(socket_dir, "socket_dir")
    metrics, node_name = PluginMetrics(), node_options.node_name
    plugin = DevicePlugin(PluginSettings(socket_dir=socket_dir, kubelet_socket=kubelet_socket,
                                         recovery_seconds=health_recovery_seconds, cdi_spec_dir=cdi_spec_dir,
                                         node_name=node_name or "", pod_api=pod_api(node_options.kubeconfig)), metrics)

    @contextmanager
    def serving(host: Host, follower: ConfigFollower | None) -> Iterator[Served]:
        if host.config.sharing.memory is not None and not node_name:
            raise BadInput("sharing.memory: the plugin reads the pods bound to this Node to serve aliyun.com/gpu-mem; "
                           "give --node-name NAME or set NODE_NAME")
        with plugin:
            yield Served(Prober(host, plugin), inputs=host.offer_inputs, healthy=lambda: plugin.healthy(STALL_SECONDS))

    sys.exit(serve(Process(node_options, endpoint, metrics.registry, "gpu_labeller_plugin", serving,
                           started="metrics server listening", stopped="device plugin stopped")))
