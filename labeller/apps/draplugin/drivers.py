"""The drivers the DRA plugin serves (``labeller.apps.draplugin.app``), one per vendor present, and what
wakes its loop.

``DriverSet.start`` gives a driver new to the plugin its sockets (``server.DriverSockets``:
registration with the kubelet, the DRA service), its checkpoint and its claim preparer, and stops
one no longer served (the config moved its vendor back to the device plugin). ``tick``, the loop's
work, re-creates a socket that is gone (a kubelet restart deletes the registration socket), which
registers the driver again: at every turn of the loop while inotify (``labeller.base.inotify``) watches
the registration directory, each driver's socket directory and the directory of a simulated profile
the node follows (a change there wakes the loop), else every ``tick_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labeller.apps.draplugin.cdi import ClaimSpecs
from labeller.apps.draplugin.checkpoint import Checkpoint
from labeller.apps.draplugin.configs import DriverConfigs
from labeller.apps.draplugin.derive import Derivation
from labeller.apps.draplugin.metrics import DraMetrics
from labeller.apps.draplugin.prepare import Devices, Preparer
from labeller.apps.draplugin.server import DraService, DriverSockets
from labeller.apps.draplugin.settings import DraSettings
from labeller.host.machine import Host
from labeller.base.inotify import DirectoryWatch
from labeller.model.resourceslices import DraDevice
from labeller.model.vendor import Vendor
from labeller.base.log import get_logger

log = get_logger(__name__)

ClaimReader = Callable[[str, str], dict[str, Any]]  # (namespace, name) -> the ResourceClaim
AsPublished = Callable[[str, Devices], Devices]  # what a prepare sees of a driver's devices


@dataclass
class Driver:
    """What the plugin runs for one driver."""

    sockets: DriverSockets
    snapshot: Devices
    preparer: Preparer | None = None


def dra_vendor(host: Host, driver: str) -> Vendor:
    return next(v for v in host.vendors if v.dra is not None and v.dra.driver == driver)


def held(drivers: Mapping[str, Driver], driver: str, name: str) -> bool:
    """A claim prepared on this node holds device ``name`` of ``driver``."""
    preparer = drivers[driver].preparer if driver in drivers else None
    return preparer is not None and preparer.holds.holding(name)


class DriverSet:
    """See the module docstring. ``running``: the drivers served, replaced whole (``/readyz`` reads it
    from another thread); everything else on the loop's thread."""

    def __init__(self, host: Host, settings: DraSettings, metrics: DraMetrics, derivation: Derivation,
                 read_claim: ClaimReader, as_published: AsPublished) -> None:
        self.host, self.settings, self.metrics, self.derivation = host, settings, metrics, derivation
        self.read_claim, self.as_published = read_claim, as_published
        self.running: dict[str, Driver] = {}
        self.watch: DirectoryWatch | None = None  # from ``begin``
        self._next_tick = 0.0

    def start(self, found: Mapping[str, Sequence[DraDevice]],
              healthy: Callable[[str], bool]) -> tuple[dict[str, Driver], list[str]]:
        """The drivers that serve ``found`` (each driver's devices) from now on: a driver no longer in it
        is stopped, a new one started, each given its snapshot of the devices; and what kept a driver
        from being served (its claims' files cannot be kept: it publishes nothing, tried again next
        probe). ``running`` changes only with ``running_now``."""
        config, host_root = self.host.config, self.host.host_root
        problems: list[str] = []
        for driver in sorted(set(self.running) - set(found)):
            self.running[driver].sockets.stop()
            log.info("driver no longer served; its slices go", driver=driver)
        drivers = {}
        for driver, devices in sorted(found.items()):
            snapshot = Devices({d.name: d for d in devices}, healthy, config, host_root)
            if driver in self.running:
                drivers[driver] = self.running[driver]
                drivers[driver].snapshot = snapshot
            else:
                try:
                    drivers[driver] = self._start(driver, snapshot)
                except OSError as exc:
                    problems.append(f"{driver}: cannot keep its prepared claims: {exc.strerror or exc}")
                    log.error("driver not served: cannot keep its prepared claims", reason="bad-directory",
                              driver=driver, error=str(exc.strerror or exc))
        return drivers, problems

    def running_now(self, drivers: dict[str, Driver]) -> None:
        """``drivers`` (from ``start``) are served, their devices published; their directories are watched."""
        self.running = drivers
        self._watch_directories()

    def _start(self, driver: str, snapshot: Devices) -> Driver:
        vendor = dra_vendor(self.host, driver)
        configs = DriverConfigs(driver, vendor.dra.configs if vendor.dra is not None else None, self.settings.configs)
        checkpoint = Checkpoint(self.settings.plugins_dir, driver, self.settings.node_name, configs.read_applied)
        specs = ClaimSpecs(self.settings.cdi_spec_dir, driver)
        entry: Driver | None = None

        def current() -> Devices:
            assert entry is not None
            return self.as_published(driver, entry.snapshot)

        ledger = self.derivation.ledger(vendor)
        maker = vendor.dra.maker if vendor.dra is not None else None
        make = (lambda: maker(self.host.host_root, self.host.handles)) if maker is not None else None
        preparer = Preparer(driver, self.settings.node_name, vendor, self.read_claim, checkpoint, specs,
                            current, configs, ledger, make)
        sockets = DriverSockets(driver, self.settings.registry_dir, self.settings.plugins_dir,
                                DraService(preparer, self.metrics), self.metrics)
        entry = Driver(sockets, snapshot, preparer)
        sockets.start()
        return entry

    # --- the sockets, and what wakes the loop ------------------------------------------------------

    def begin(self, wake: Callable[[], None]) -> None:
        self.watch = DirectoryWatch(wake, "dra-watch")
        self._watch_directories()

    @property
    def watching(self) -> bool:
        return self.watch is not None and self.watch.watching

    def _watch_directories(self) -> None:
        """What wakes the loop: the registration directory, each driver's socket directory, and the
        directory of a simulated profile the node follows."""
        if self.watch is None:
            return
        directories = [self.settings.registry_dir, *(self.settings.plugins_dir / d for d in sorted(self.running))]
        if self.host.simulation is not None:
            directories.append(self.host.simulation.path.parent)
        self.watch.watch(directories)

    def tick(self, now: float) -> float:
        """Look at the sockets: at every turn of the loop while inotify watches their directories (a
        change wakes it), else every ``tick_seconds``; when to look next (a socket to create again
        after a failure)."""
        watching = self.watching
        if watching or now >= self._next_tick:
            for driver in self.running.values():
                try:
                    driver.sockets.tick()
                except Exception:  # one bad tick must not end the loop: the next one retries
                    log.exception("socket check failed; retrying", driver=driver.sockets.driver)
            self._next_tick = now + self.settings.tick_seconds
        retry = min((d.sockets.next_try() for d in self.running.values()), default=float("inf"))
        return retry if watching else min(self._next_tick, retry)

    def stop(self) -> None:
        """The sockets go: the kubelet deregisters the drivers."""
        for driver in self.running.values():
            driver.sockets.stop()
