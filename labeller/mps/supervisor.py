"""The MPS control daemons of one node: started, configured, watched and restarted, and the
readiness file that tells the labeller and the device plugin which ones serve.

One ``Daemon`` per MPS resource of the offer. Each ``round`` (every ``--check-interval``) asks
every daemon for its active thread percentage: a daemon that answers what it was given is ready;
one that does not answer (it died) or answers something else (it was restarted without its
limits) is started or configured again. Then the readiness file is rewritten with the ready
daemons and a new heartbeat; it is removed on stop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from labeller.mps import control
from labeller.mps.control import CommandFailed, Tools
from labeller.offer import Offer, Resource
from labeller.outputs import write_atomic
from vendors.nvidia import mps
from vendors.nvidia.model import MpsServed

log = structlog.get_logger(__name__)

STALE_ROUNDS = 6  # a heartbeat older than this many rounds means the supervisor stopped


@dataclass(frozen=True)
class Plan:
    """What one resource's daemon must be: its devices, the limits each client gets."""

    served: MpsServed
    uuids: tuple[str, ...]  # in NVML index order
    pinned_mib: tuple[tuple[int, int], ...]  # (NVML index, MiB)
    percentage: int

    @property
    def resource(self) -> str:
        return self.served.resource

    @classmethod
    def of(cls, resource: Resource) -> Plan:
        return cls(mps.served(resource), tuple(d.nvml_gpu.uuid for d in mps.gpus(resource)),
                   tuple(sorted(mps.pinned_memory_limits(resource).items())), mps.active_thread_percentage(resource))


def plans(offer: Offer) -> list[Plan]:
    """The daemons the offer needs: its MPS resources, advertised or waiting for us."""
    wanted = [r for r in offer.resources if r.strategy == "mps"]
    wanted += [h.resource for h in offer.held if h.waiting and h.resource.strategy == "mps"]
    for held in offer.held:
        if not held.waiting and held.resource.strategy == "mps":
            log.error("no MPS daemon for this resource", resource=held.resource.name, reason=held.reason)
    return [Plan.of(r) for r in wanted]


class Daemon:
    """One resource's control daemon."""

    def __init__(self, plan: Plan, root: str, tools: Tools):
        self.plan, self.root, self.tools = plan, root, tools
        self.ready = False
        self.starts = 0
        self.problem: str | None = None

    def _command(self, line: str) -> str:
        return control.command(self.root, self.plan.resource, line, self.tools)

    def _answers(self) -> bool:
        """The daemon answers with the percentage it was given."""
        try:
            return float(self._command("get_default_active_thread_percentage")) == float(self.plan.percentage)
        except (CommandFailed, ValueError):
            return False

    def _configure(self) -> None:
        for index, mib in self.plan.pinned_mib:
            self._command(f"set_default_device_pinned_mem_limit {index} {mib}M")
        self._command(f"set_default_active_thread_percentage {self.plan.percentage}")

    def healthy(self) -> bool:
        """It answers as configured; marks it ready when it does."""
        if self._answers():
            self._settle(None)
            return True
        return False

    def repair(self) -> bool:
        """Start it (when it does not run) and configure it; ready afterwards?"""
        try:
            if not self._running():
                control.compute_mode(list(self.plan.uuids), "EXCLUSIVE_PROCESS", self.tools)
                control.start(self.root, self.plan.resource, self.tools)
                self.starts += 1
            self._configure()
        except CommandFailed as exc:
            self._settle(str(exc))
            return False
        ok = self._answers()
        self._settle(None if ok else "the daemon does not report the thread percentage it was given")
        return ok

    def _running(self) -> bool:
        try:
            self._command("get_default_active_thread_percentage")
            return True
        except CommandFailed:
            return False

    def _settle(self, problem: str | None) -> None:
        ready = problem is None
        if ready != self.ready or problem != self.problem:
            if ready:
                log.info("MPS daemon ready", resource=self.plan.resource, devices=len(self.plan.uuids),
                         thread_percentage=self.plan.percentage, starts=self.starts)
            else:
                log.warning("MPS daemon not ready", resource=self.plan.resource, reason=problem)
        self.ready, self.problem = ready, problem

    def stop(self) -> None:
        try:
            self._command("quit")
        except CommandFailed as exc:
            log.info("MPS daemon did not take quit (gone already?)", resource=self.plan.resource, reason=str(exc))
        try:
            control.compute_mode(list(self.plan.uuids), "DEFAULT", self.tools)
        except CommandFailed as exc:
            log.warning("compute mode not restored", resource=self.plan.resource, reason=str(exc))
        self.ready = False


class Supervisor:
    """Every daemon the config needs, and the readiness file under the MPS root."""

    def __init__(self, root: str, tools: Tools, interval_s: float, clock: Callable[[], float] = time.time):
        self.root, self.tools, self.interval_s, self._clock = root, tools, interval_s, clock
        self.daemons: dict[str, Daemon] = {}

    @property
    def ready(self) -> bool:
        """Every daemon answers as configured (true when none is needed)."""
        return all(d.ready for d in self.daemons.values())

    def want(self, wanted: Iterable[Plan]) -> None:
        """Run exactly these daemons from now on: stop the others, and those whose plan changed."""
        new = {plan.resource: plan for plan in wanted}
        for name, daemon in list(self.daemons.items()):
            if new.get(name) != daemon.plan:
                log.info("stopping MPS daemon", resource=name, reason="no longer wanted or changed")
                del self.daemons[name]
                self._write()
                daemon.stop()
        for name, plan in new.items():
            self.daemons.setdefault(name, Daemon(plan, self.root, self.tools))

    def round(self) -> None:
        os.makedirs(mps.shm_dir(self.root), mode=0o755, exist_ok=True)  # every client mounts it at /dev/shm
        for daemon in self.daemons.values():
            if daemon.healthy():
                continue
            if daemon.ready:  # it stopped answering: out of the readiness file before anything else
                daemon.ready = False
                log.warning("MPS daemon stopped answering; starting it again", resource=daemon.plan.resource)
                self._write()
            daemon.repair()
        self._write()
        reap_orphans()

    def _write(self) -> None:
        entries = [d.plan.served for d in self.daemons.values() if d.ready]
        stale_after = max(15.0, STALE_ROUNDS * self.interval_s)
        try:
            write_atomic(mps.ready_file(self.root), mps.ready_document(entries, self._clock(), stale_after))
        except OSError as exc:
            log.error("cannot write the MPS readiness file", path=str(mps.ready_file(self.root)),
                      reason=exc.strerror or str(exc))

    def stop(self) -> None:
        Path(mps.ready_file(self.root)).unlink(missing_ok=True)
        for daemon in self.daemons.values():
            daemon.stop()
        self.daemons.clear()


def reap_orphans() -> None:
    """As PID 1 of its container, collect the daemons that ``-d`` left to us once they exit."""
    if os.getpid() != 1:
        return
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
