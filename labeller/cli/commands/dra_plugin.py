"""The ``gpu-labeller dra-plugin`` command (loaded lazily: it imports grpc and the Kubernetes client)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from labeller.cluster.connect import connect
from labeller.cli.commands.options import (BadInput, discovery_options, endpoint_options, given_as,
                                       health_recovery_option, mps_tools_options, own_node_options,
                                       parent_must_exist)
from labeller.cli.commands.params import Duration
from labeller.cli.commands.upstream import EPILOG, upstream_options
from labeller.apps.draplugin.app import DraPlugin, probe_inputs
from labeller.apps.draplugin.checkpoint import DIRECTORY
from labeller.apps.draplugin.metrics import DraMetrics
from labeller.apps.draplugin.settings import (DEFAULT_CDI_SPEC_DIR, DEFAULT_MPS_ROOT, DEFAULT_PLUGINS_DIR,
                                        DEFAULT_REGISTRY_DIR, DraSettings)
from labeller.host.machine import Host, NodeOptions
from labeller.base.ownfiles import directory_problem
from labeller.process.follow import ConfigFollower
from labeller.process.loop import LoopOptions
from labeller.process.serve import Endpoint, Process, Served, serve
from labeller.model.vendor.dra import ConfigSettings
from vendors import VENDORS


@click.command("dra-plugin", epilog=EPILOG)
@discovery_options
@own_node_options("This Node's name (required): the pool and spec.nodeName of its ResourceSlices, and the Node "
                  "whose --config-label is followed. [env: NODE_NAME]")
@click.option("--plugins-dir", "--kubelet-plugins-directory-path", "plugins_dir",
              type=click.Path(path_type=Path, file_okay=False), default=DEFAULT_PLUGINS_DIR, show_default=True,
              envvar=["DRA_PLUGINS_DIR", "KUBELET_PLUGINS_DIRECTORY_PATH"],
              help="The kubelet's plugins directory: each driver's DRA socket and prepared claims go to "
                   "<dir>/<driver>/; the second name is NVIDIA's and AMD's DRA drivers'. [env: DRA_PLUGINS_DIR, "
                   "KUBELET_PLUGINS_DIRECTORY_PATH]")
@click.option("--registry-dir", "--kubelet-registrar-directory-path", "registry_dir",
              type=click.Path(path_type=Path, file_okay=False), default=DEFAULT_REGISTRY_DIR, show_default=True,
              envvar=["DRA_REGISTRY_DIR", "KUBELET_REGISTRAR_DIRECTORY_PATH"],
              help="The kubelet's plugin registration directory (<dir>/<driver>-reg.sock); the second name is "
                   "NVIDIA's and AMD's DRA drivers'. [env: DRA_REGISTRY_DIR, KUBELET_REGISTRAR_DIRECTORY_PATH]")
@endpoint_options(8083, ready="every driver registered and its slices written")
@click.option("--cdi-spec-dir", "--cdi-root", "cdi_spec_dir", type=click.Path(path_type=Path, file_okay=False),
              default=DEFAULT_CDI_SPEC_DIR, show_default=True, envvar=["CDI_SPEC_DIR", "CDI_ROOT"],
              help="Where each prepared claim's CDI spec file goes (gpu-labeller-dra_<driver>_<claim UID>.json); "
                   "--cdi-root is NVIDIA's and AMD's DRA drivers' name. [env: CDI_SPEC_DIR, CDI_ROOT]")
@health_recovery_option("published again (0: never)")
@click.option("--probe-interval", type=Duration(minimum=0.1), default="300s", show_default=True,
              envvar="DRA_PROBE_INTERVAL",
              help="How often the node is probed in full, besides the changes it watches (within a second: "
                   "NVML's MIG reconfiguration events, KFD's topology generation, the profile file): a safety "
                   "net for a change no one reports. [env: DRA_PROBE_INTERVAL]")
@click.option("--mps-root", type=click.Path(path_type=Path, file_okay=False), default=DEFAULT_MPS_ROOT,
              show_default=True, envvar="DRA_MPS_ROOT",
              help="Host directory of the MPS control daemons of claims whose config shares a GPU by MPS: "
                   "<dir>/<daemon ID>/pipe and log, and <dir>/shm, their /dev/shm (mounted there in the plugin "
                   "and in the claims' containers). [env: DRA_MPS_ROOT]")
@mps_tools_options("a GPU's time slice and compute mode")
@upstream_options("dra-plugin")
def dra_plugin(node_options: NodeOptions, plugins_dir: Path, registry_dir: Path, endpoint: Endpoint,
               cdi_spec_dir: Path, health_recovery_seconds: float, probe_interval: float, mps_root: Path,
               mps_control: str, nvidia_smi: str) -> None:
    """Publish this node's GPUs as ResourceSlices and prepare their claims (kubelet DRA plugin, v1).

    One driver per vendor present that the config serves through DRA (labeller.dra.vendors):
    gpu.nvidia.com, gpu.amd.com. Each registers with the kubelet's plugin watcher
    (<--registry-dir>/<driver>-reg.sock) and serves NodePrepareResources and NodeUnprepareResources on
    <--plugins-dir>/<driver>/dra.sock; a socket the kubelet removed is re-created and registered
    again. Each driver's devices are one pool named after the node (--node-name, required),
    published as ResourceSlices; unhealthy devices leave them until healthy again. Nothing is written
    while nothing changes. A prepared claim gets a CDI spec file in --cdi-spec-dir and an entry in
    the driver's checkpoint (<--plugins-dir>/<driver>/claims/), so a restart loses nothing.
    A claim's opaque configs for the driver (NVIDIA's resource.nvidia.com/v1beta1 GpuConfig and
    MigDeviceConfig, AMD's gpu.resource.amd.com/v1alpha1 GpuConfig) are decoded strictly and applied:
    a time slice set with nvidia-smi, an MPS control daemon per config under --mps-root; a config
    that cannot be honoured fails the claim's prepare, naming the key and the value.
    SIGHUP: re-read the config and probe again. SIGTERM or SIGINT: remove the sockets, exit 0.
    Health env: DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS.
    """
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # gRPC core's own INFO lines are noise in the pod log
    node_name = node_options.node_name
    if not mps_root.is_absolute():
        raise BadInput(f"{given_as('mps_root', mps_root)}: must be an absolute path (claims' containers mount from it)")
    if not node_name:
        raise BadInput("the DRA plugin publishes this Node's ResourceSlices: give --node-name NAME or set NODE_NAME")
    parent_must_exist(plugins_dir, "plugins_dir")
    parent_must_exist(registry_dir, "registry_dir")
    _own_directories_must_be_directories(plugins_dir, cdi_spec_dir)
    settings = DraSettings(node_name=node_name, plugins_dir=plugins_dir, registry_dir=registry_dir,
                           cdi_spec_dir=cdi_spec_dir, recovery_seconds=health_recovery_seconds,
                           configs=ConfigSettings(mps_root, mps_control=mps_control, nvidia_smi=nvidia_smi))
    metrics = DraMetrics()
    with contextlib.closing(connect(node_options.kubeconfig)) as api:

        @contextlib.contextmanager
        def publishing(host: Host, follower: ConfigFollower | None) -> Iterator[Served]:
            plugin = DraPlugin(host, settings, api, metrics)
            try:
                yield Served(plugin, LoopOptions(interval_s=probe_interval),
                             inputs=probe_inputs(host, plugin.board, plugin.gone_due),
                             inputs_polled=plugin.inputs_polled)
            finally:
                plugin.close()

        code = serve(Process(node_options, endpoint, metrics.registry, "gpu_labeller_dra", publishing,
                             started="metrics server listening", stopped="DRA plugin stopped"))
    sys.exit(code)


def _own_directories_must_be_directories(plugins_dir: Path, cdi_spec_dir: Path) -> None:
    """BadInput when a directory the plugin keeps files in exists and is not one it can use: each
    driver's checkpoint (``<plugins dir>/<driver>/claims``) and the CDI spec directory."""
    for vendor in VENDORS:
        if vendor.dra is not None:
            problem = directory_problem(plugins_dir, vendor.dra.driver, DIRECTORY)
            if problem:
                raise BadInput(f"{given_as('plugins_dir', plugins_dir)}: cannot keep the prepared claims of "
                               f"{vendor.dra.driver}: {problem}")
    problem = directory_problem(cdi_spec_dir.parent, cdi_spec_dir.name) if cdi_spec_dir.name else None
    if problem:
        raise BadInput(f"{given_as('cdi_spec_dir', cdi_spec_dir)}: {problem}")
