"""The ``mps-control-daemon`` command's service on the process loop (``labeller.process.loop``):
which MPS control daemons the config needs, and a supervision round every ``--check-interval``."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from labeller.model.config import ConfigError
from labeller.model.inventory import ProbeError
from labeller.apps.mps.supervisor import Supervisor, Wanted, plans
from labeller.host.machine import Host
from vendors.nvidia.mpscontrol import Tools
from labeller.base.log import get_logger

log = get_logger(__name__)


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


def wanted(node: Host) -> list[Wanted]:
    """Probe the node and return the daemons its config needs; ProbeError or ConfigError when it cannot tell."""
    if node.config.sharing.strategy != "mps":
        return []
    return plans(node.offer(node.probe()))


class MpsService:
    """The ``mps-control-daemon`` command's service on the process loop: a probe says which daemons
    the config needs (``Supervisor.want``); every ``check_interval`` a round asks each whether it
    answers and repairs those that do not. Ready when the daemons wanted are known and all answer."""

    def __init__(self, node: Host, tools: Tools, check_interval: float, metrics: Metrics) -> None:
        self.node, self.tools, self.check_interval, self.metrics = node, tools, check_interval, metrics
        self.supervisor = Supervisor(node.config.plugin.mps_root, tools, check_interval)
        self.probed = False  # the daemons to run are known (for the config in force)
        self._next_round = 0.0

    @property
    def ready(self) -> bool:
        return self.supervisor.ready and self.probed

    def begin(self, wake: Callable[[], None], stop: threading.Event) -> None:
        return None

    def probe(self) -> str | None:
        if self.node.config.plugin.mps_root != self.supervisor.root:  # a reload moved flags.mpsRoot
            self.supervisor.stop()
            self.supervisor = Supervisor(self.node.config.plugin.mps_root, self.tools, self.check_interval)
        try:
            self.supervisor.want(wanted(self.node))
        except (ProbeError, ConfigError) as exc:
            self.probed = False
            return str(exc)
        self.probed = True
        self._next_round = 0.0  # a round now: start what the new plan wants
        return None

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        log.error("cannot tell which MPS daemons to run; trying again", reason="probe-failed", detail=reason,
                  attempt=attempt, retry_in_s=round(delay_s, 2))

    def recovered(self, attempts: int, waited_s: float) -> None:
        log.info("MPS daemons to run are known", reason="probe-recovered", attempts=attempts)

    def work(self, now: float) -> float:
        if not self.probed:
            return math.inf
        if now >= self._next_round:
            before = {name: d.starts for name, d in self.supervisor.daemons.items()}
            self.supervisor.round()
            self.metrics.observe(self.supervisor, before)
            self._next_round = now + self.check_interval
        return self._next_round

    def stop(self) -> None:
        self.supervisor.stop()
