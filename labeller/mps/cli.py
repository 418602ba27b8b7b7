"""``gpu-labeller mps-control-daemon``: its own container in the device-plugin pod when the config
shares by MPS (loaded lazily by labeller.cli)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import click
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from labeller import configwatch
from labeller.config import ConfigError
from labeller.configwatch import ConfigMetrics, follow_own_node
from labeller.inventory import ProbeError
from labeller.mps.control import Tools
from labeller.mps.supervisor import Plan, Supervisor, plans
from labeller.node import Node, open_node
from labeller.options import BadInput, discovery_options, own_node_options
from labeller.params import Duration
from labeller.runtime import Backoff, PortUnavailable, install_signals, start_http_server

log = structlog.get_logger(__name__)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ready = Gauge("gpu_labeller_mps_daemon_ready", "1 while the resource's MPS daemon answers as configured.",
                           ["resource"], registry=self.registry)
        self.starts = Counter("gpu_labeller_mps_daemon_starts_total", "MPS control daemons started, by resource.",
                              ["resource"], registry=self.registry)

    def observe(self, supervisor: Supervisor, before: dict[str, int]) -> None:
        for name, daemon in supervisor.daemons.items():
            self.ready.labels(resource=name).set(1 if daemon.ready else 0)
            self.starts.labels(resource=name).inc(daemon.starts - before.get(name, 0))


def wanted(node: Node) -> list[Plan]:
    """Probe the node and return the daemons its config needs; ProbeError or ConfigError when it cannot tell."""
    if node.config.sharing.strategy != "mps":
        return []
    return plans(node.offer(node.probe()))


@click.command("mps-control-daemon")
@discovery_options
@own_node_options
@click.option("--check-interval", type=Duration(minimum=0.05), default="5s", show_default=True,
              envvar="MPS_CHECK_INTERVAL", help="How often every daemon is asked whether it answers. [env: MPS_CHECK_INTERVAL]")
@click.option("--mps-control", default="nvidia-cuda-mps-control", show_default=True, envvar="MPS_CONTROL",
              help="The nvidia-cuda-mps-control binary (looked up on PATH). [env: MPS_CONTROL]")
@click.option("--nvidia-smi", default="nvidia-smi", show_default=True, envvar="NVIDIA_SMI",
              help="The nvidia-smi binary that sets each GPU's compute mode. [env: NVIDIA_SMI]")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=8082, show_default=True,
              help="Port for /healthz, /readyz (every daemon answers) and /metrics (0: any free port).")
@click.option("--metrics-bind", default="0.0.0.0", show_default=True, help="Address the metrics server binds.")
def mps_control_daemon(host_root: Path, simulate: str | None, config_path: Path | None, config_dir: Path | None,
                       config_name: str | None, config_label: str, node_name: str | None, kubeconfig: str | None,
                       check_interval: float, mps_control: str, nvidia_smi: str, metrics_port: int,
                       metrics_bind: str) -> None:
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
    terminate, reload = threading.Event(), threading.Event()
    metrics = Metrics()
    follower, selection = follow_own_node(config_path, config_dir, config_name, config_label, node_name, kubeconfig,
                                          ConfigMetrics(metrics.registry, "gpu_labeller_mps"), terminate)
    config_changed, wake = threading.Event(), threading.Event()  # wake: a signal or a config change ends a wait

    def woken(event: threading.Event) -> Callable[[], None]:
        def set_and_wake() -> None:
            event.set()
            wake.set()
        return set_and_wake

    if follower is not None:
        follower.on_change = woken(config_changed)
    install_signals(woken(terminate), woken(reload))
    tools = Tools(mps_control=mps_control, nvidia_smi=nvidia_smi)
    with open_node(host_root, simulate, config_path, selection) as node:
        if follower is not None:
            follower.apply(node)
            follower.poll(terminate)
        supervisor = Supervisor(node.config.plugin.mps_root, tools, check_interval)
        probed: list[bool] = []  # one entry once the daemons to run are known
        try:
            http = start_http_server(metrics_port, metrics_bind, ready=lambda: supervisor.ready and bool(probed),
                                     registry=metrics.registry)
        except PortUnavailable as exc:
            raise BadInput(str(exc)) from None
        log.info("MPS control daemon supervisor started", mps_root=supervisor.root, port=http.port)
        backoff = Backoff(1.0, 30.0)
        try:
            while not terminate.is_set():
                if reload.is_set() or config_changed.is_set():
                    sighup = reload.is_set()
                    reload.clear()
                    config_changed.clear()
                    probed.clear()
                    if sighup:
                        configwatch.reload(node, config_path, follower)
                    elif follower is not None:
                        follower.apply(node)
                    if node.config.plugin.mps_root != supervisor.root:
                        supervisor.stop()
                        supervisor = Supervisor(node.config.plugin.mps_root, tools, check_interval)
                if not probed:
                    try:
                        supervisor.want(wanted(node))
                        probed.append(True)
                        backoff.reset()
                    except (ProbeError, ConfigError) as exc:
                        log.error("cannot tell which MPS daemons to run; trying again", reason=str(exc))
                        terminate.wait(backoff.next())
                        continue
                before = {name: d.starts for name, d in supervisor.daemons.items()}
                supervisor.round()
                metrics.observe(supervisor, before)
                wake.wait(check_interval)
                wake.clear()
        finally:
            supervisor.stop()
            http.close()
    log.info("MPS control daemon supervisor stopped")
