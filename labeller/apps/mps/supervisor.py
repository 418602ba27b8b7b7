"""The MPS control daemons of one node: started, configured, watched and restarted, and the
readiness file that tells the labeller and the device plugin which ones serve.

One ``Daemon`` (``vendors.nvidia.mpscontrol``) per MPS resource of the offer, named after it.
Each ``round`` (every ``--check-interval``) asks every daemon for its active thread percentage: a
daemon that answers what it was given is ready; one that does not answer (it died) or answers
something else (it was restarted without its limits) is started or configured again. Then the
readiness file is rewritten with the ready daemons and a new heartbeat; it is removed on stop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from labeller.model.offer import Offer, Resource
from labeller.base.outputs import write_atomic
from vendors.nvidia import mps
from vendors.nvidia.model import MpsServed
from vendors.nvidia.mpscontrol import Daemon, Plan, Tools
from labeller.base.log import get_logger

log = get_logger(__name__)

STALE_ROUNDS = 6  # a heartbeat older than this many rounds means the supervisor stopped


@dataclass(frozen=True)
class Wanted:
    """One resource's daemon: what it must be (``mpscontrol.Plan``, named after the resource), and
    what the readiness file says of it once it answers."""

    served: MpsServed
    plan: Plan

    @property
    def resource(self) -> str:
        return self.served.resource

    @property
    def uuids(self) -> tuple[str, ...]:
        return self.plan.uuids

    @classmethod
    def of(cls, resource: Resource) -> Wanted:
        pinned = tuple((str(index), mib) for index, mib in sorted(mps.pinned_memory_limits(resource).items()))
        return cls(mps.served(resource), Plan(resource.name, tuple(d.nvml_gpu.uuid for d in mps.gpus(resource)),
                                              pinned, mps.active_thread_percentage(resource)))


def plans(offer: Offer) -> list[Wanted]:
    """The daemons the offer needs: its MPS resources, advertised or waiting for us."""
    wanted = [r for r in offer.resources if r.strategy == "mps"]
    wanted += [h.resource for h in offer.held if h.waiting and h.resource.strategy == "mps"]
    for held in offer.held:
        if not held.waiting and held.resource.strategy == "mps":
            log.error("no MPS daemon for this resource", resource=held.resource.name, reason=held.reason)
    return [Wanted.of(r) for r in wanted]


class Supervisor:
    """Every daemon the config needs, and the readiness file under the MPS root."""

    def __init__(self, root: str, tools: Tools, interval_s: float, clock: Callable[[], float] = time.time):
        self.root, self.tools, self.interval_s, self._clock = root, tools, interval_s, clock
        self.daemons: dict[str, Daemon] = {}  # by resource name
        self.served: dict[str, MpsServed] = {}

    @property
    def ready(self) -> bool:
        """Every daemon answers as configured (true when none is needed)."""
        return all(d.ready for d in self.daemons.values())

    def want(self, wanted: Iterable[Wanted]) -> None:
        """Run exactly these daemons from now on: stop the others, and those whose plan changed."""
        new = {w.resource: w for w in wanted}
        for name, daemon in list(self.daemons.items()):
            if name not in new or new[name].plan != daemon.plan:
                log.info("stopping MPS daemon", resource=name, reason="no longer wanted or changed")
                del self.daemons[name]
                self._write()
                daemon.stop()
        self.served = {name: w.served for name, w in new.items()}
        for name, w in new.items():
            self.daemons.setdefault(name, Daemon(w.plan, self.root, self.tools))

    def round(self) -> None:
        os.makedirs(mps.shm_dir(self.root), mode=0o755, exist_ok=True)  # every client mounts it at /dev/shm
        for daemon in self.daemons.values():
            if daemon.healthy():
                continue
            if daemon.ready:  # it stopped answering: out of the readiness file before anything else
                daemon.ready = False
                log.warning("MPS daemon stopped answering; starting it again", resource=daemon.name)
                self._write()
            daemon.repair()
        self._write()
        reap_orphans()

    def _write(self) -> None:
        entries = [self.served[name] for name, d in self.daemons.items() if d.ready]
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
