"""``gpu-labeller mps-control-daemon``: its own container in the device-plugin pod when the config
shares by MPS (loaded lazily by labeller.cli)."""

from __future__ import annotations

import threading

import click
import structlog

from labeller.process.follow import ConfigMetrics, follow_own_node
from labeller.mps.service import Metrics, MpsService
from labeller.host import NodeOptions, open_host
from labeller.commands.options import discovery_options, endpoint_options, own_node_options
from labeller.commands.params import Duration
from labeller.process.configsource import ConfigSource
from labeller.process.loop import LoopOptions, ProcessLoop
from labeller.process.serve import Endpoints, serve
from labeller.process.signals import defer_signals
from vendors.nvidia.mpscontrol import Tools

log = structlog.get_logger(__name__)


@click.command("mps-control-daemon")
@discovery_options
@own_node_options
@click.option("--check-interval", type=Duration(minimum=0.05), default="5s", show_default=True,
              envvar="MPS_CHECK_INTERVAL",
              help="How often every daemon is asked whether it answers. [env: MPS_CHECK_INTERVAL]")
@click.option("--mps-control", default="nvidia-cuda-mps-control", show_default=True, envvar="MPS_CONTROL",
              help="The nvidia-cuda-mps-control binary (looked up on PATH). [env: MPS_CONTROL]")
@click.option("--nvidia-smi", default="nvidia-smi", show_default=True, envvar="NVIDIA_SMI",
              help="The nvidia-smi binary that sets each GPU's compute mode. [env: NVIDIA_SMI]")
@endpoint_options(8082, ready="every daemon answers")
def mps_control_daemon(node_options: NodeOptions, check_interval: float, mps_control: str, nvidia_smi: str,
                       metrics_port: int, metrics_bind: str) -> None:
    """Run one NVIDIA MPS control daemon per resource the config shares by MPS (sharing.mps).

    Each runs as `nvidia-cuda-mps-control -d` with its pipe and log directories under
    <flags.mpsRoot>/<resource>/, its GPUs in EXCLUSIVE_PROCESS compute mode, a default active
    thread percentage of 100/replicas and a pinned device memory limit of memory/replicas per
    GPU. Every --check-interval each daemon is asked for its thread percentage; one that does not
    answer as configured is started or configured again. <mpsRoot>/.gpu-labeller-mps-ready.json
    lists the daemons that answer, with a heartbeat: the labeller and the device plugin advertise
    MPS replicas only for those. With --config-dir it runs what the config the node's
    --config-label names asks for, and follows a change of the label or the files as the device
    plugin does. SIGHUP: re-read the config and probe again. SIGTERM: quit every daemon, restore
    the compute mode, remove the readiness file.
    """
    defer_signals()  # a SIGTERM or SIGHUP during start-up is acted on once it serves
    stop = threading.Event()  # ends the follower's watch of the Node when the loop ends
    metrics = Metrics()
    follower, selection = follow_own_node(node_options, ConfigMetrics(metrics.registry, "gpu_labeller_mps"), stop)
    tools = Tools(mps_control=mps_control, nvidia_smi=nvidia_smi)
    with open_host(node_options, selection) as host:
        if follower is not None:
            follower.apply(host)
        service = MpsService(host, tools, check_interval, metrics)
        loop = ProcessLoop(service, LoopOptions(), config=ConfigSource(host, node_options.config_path, follower))
        try:
            serve(loop, Endpoints(metrics_port, metrics_bind, metrics.registry, ready=lambda: service.ready),
                  "MPS control daemon supervisor started", mps_root=service.supervisor.root)
        finally:
            stop.set()
            service.stop()
    log.info("MPS control daemon supervisor stopped")
