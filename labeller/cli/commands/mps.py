"""``gpu-labeller mps-control-daemon``: its own container in the device-plugin pod when the config
shares by MPS (loaded lazily by labeller.cli.root)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

from labeller.cli.commands.options import discovery_options, endpoint_options, mps_tools_options, own_node_options
from labeller.cli.commands.params import Duration
from labeller.host.machine import Host, NodeOptions
from labeller.apps.mps.service import Metrics, MpsService
from labeller.process.follow import ConfigFollower
from labeller.process.serve import Endpoint, Process, Served, serve
from vendors.nvidia.mpscontrol import Tools


@click.command("mps-control-daemon")
@discovery_options
@own_node_options("This Node's name, to follow --config-label. [env: NODE_NAME]")
@click.option("--check-interval", type=Duration(minimum=0.05), default="5s", show_default=True,
              envvar="MPS_CHECK_INTERVAL",
              help="How often every daemon is asked whether it answers. [env: MPS_CHECK_INTERVAL]")
@mps_tools_options("each GPU's compute mode")
@endpoint_options(8082, ready="every daemon answers")
def mps_control_daemon(node_options: NodeOptions, check_interval: float, mps_control: str, nvidia_smi: str,
                       endpoint: Endpoint) -> None:
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
    metrics, tools = Metrics(), Tools(mps_control=mps_control, nvidia_smi=nvidia_smi)

    @contextmanager
    def supervisor(host: Host, follower: ConfigFollower | None) -> Iterator[Served]:
        service = MpsService(host, tools, check_interval, metrics)
        try:
            yield Served(service, fields={"mps_root": service.supervisor.root})
        finally:
            service.stop()

    sys.exit(serve(Process(node_options, endpoint, metrics.registry, "gpu_labeller_mps", supervisor,
                           started="MPS control daemon supervisor started",
                           stopped="MPS control daemon supervisor stopped")))
