"""The DRA plugin: ``DraPlugin``, the ``dra-plugin`` command's service on the process loop
(``labeller.process.loop``).

Each probe (at start, every ``--probe-interval``, after SIGHUP or a named-config change, and when
the simulated profile file changes) turns the node's inventory and offer into the DRA devices of
each vendor the config serves through DRA (``Host.dra_devices``), one driver per vendor present:

- a driver new to the plugin gets its sockets (``server.DriverSockets``: registration with the
  kubelet, the DRA service), its checkpoint and its claim preparer; a driver no longer there (the
  config moved its vendor back to the device plugin) loses them, and its slices are deleted;
- the healthy devices of every driver are published (``publisher.SlicePublisher``), and published
  again whenever a health check marks a device Unhealthy or Healthy again (the device plugin's health
  board and the vendors' checkers, ``labeller.process.health``): an unhealthy device leaves its
  slice, and a claim that names it is refused.

Under ``labeller.dra.dynamicMig`` a vendor publishes devices that are made at prepare, drawing on
shared counters (KEP-4815); the plugin tells it which devices it made (each driver's ledger,
``labeller.draplugin.ledger``). Where the API server drops the counters it is sent (Kubernetes
1.34 without the DRAPartitionableDevices feature gate), the publisher says so, and the plugin
publishes that driver's devices as without dynamicMig from then on, with one warning.

A vendor whose backend fails on a later probe keeps what it published: a driver that stops
answering for a while must not take its devices away; the health checks say whether they work.
Between probes the loop's ``work`` looks at the sockets every ``tick_seconds`` and re-creates one
that is gone (a kubelet restart), which registers the driver again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from labeller.config import ConfigError
from labeller.draplugin.cdi import ClaimSpecs
from labeller.draplugin.checkpoint import Checkpoint
from labeller.draplugin.configs import DriverConfigs
from labeller.draplugin.ledger import Ledger
from labeller.draplugin.metrics import DraMetrics
from labeller.draplugin.prepare import Devices, Preparer
from labeller.draplugin.publisher import SliceApi, SlicePublisher
from labeller.draplugin.server import DraService, DriverSockets
from labeller.host import Host
from labeller.inventory import Inventory, ProbeError
from labeller.offer import Offer
from labeller.process.health import HEALTHY, UNHEALTHY, HealthBoard, HealthChecks
from labeller.resourceslices import DraDevice, healthy
from labeller.vendor import Vendor
from labeller.vendor.dra import ConfigSettings, DraState

log = structlog.get_logger(__name__)

DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_CDI_SPEC_DIR = Path("/var/run/cdi")
DEFAULT_MPS_ROOT = Path("/run/gpu-labeller/mps")

Obj = dict[str, Any]


class DraApi(SliceApi, Protocol):
    """The cluster adapter's calls the plugin makes (``labeller.cluster.kube.Kube``)."""

    def get_resource_claim(self, namespace: str, name: str) -> Obj: ...


@dataclass
class DraSettings:
    node_name: str
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    cdi_spec_dir: Path = DEFAULT_CDI_SPEC_DIR
    recovery_seconds: float = 60.0
    health_poll_seconds: float = 0.25
    tick_seconds: float = 0.1
    # the health switches the device plugin reads too (DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS)
    health_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # what claims' opaque configs need: the MPS daemons' root, NVIDIA's tools
    configs: ConfigSettings = field(default_factory=lambda: ConfigSettings(DEFAULT_MPS_ROOT))


@dataclass
class _Driver:
    """What the plugin runs for one driver."""

    sockets: DriverSockets
    snapshot: Devices


def failed_vendors(inventory: Inventory) -> set[str]:
    """Vendors whose backend could not describe their GPUs this time (NVML missing, no KFD topology)."""
    return {r.backend for r in inventory.reports if r.status in ("unavailable", "error")}


class DraPlugin:
    """See the module docstring. A ``Service`` of the process loop; ``close`` when the loop is done."""

    def __init__(self, host: Host, settings: DraSettings, api: DraApi, metrics: DraMetrics | None = None) -> None:
        self.host, self.settings, self.api = host, settings, api
        self.metrics = metrics or DraMetrics()
        self.board = HealthBoard((), settings.recovery_seconds)
        self.board.listeners.append(self._on_health_change)
        self._stop = threading.Event()
        self.publisher = SlicePublisher(api, settings.node_name, self.metrics, self._stop, dropped=self._on_dropped)
        self.drivers: dict[str, _Driver] = {}
        self._devices: dict[str, list[DraDevice]] = {}  # what the last probe found, unhealthy devices included
        self._lock = threading.Lock()  # ``_devices`` and the publishing of it, between the loop and health threads
        self._health = HealthChecks(self.board, settings.health_env, settings.health_poll_seconds)
        self._next_tick = 0.0
        self.probes = 0  # probes done (a test awaits the next one)
        self._served: tuple[str, ...] | None = None  # the drivers served, as last said
        self._ledgers: dict[str, Ledger] = {}  # driver -> what it made for claims
        self._no_counters: set[str] = set()  # drivers whose counters the API server drops
        self._probed: tuple[Inventory, Offer] | None = None  # the last probe, to publish again without counters
        self._republish = threading.Event()  # the API server dropped counters: publish again (the loop's work)
        self._wake: Callable[[], None] = lambda: None

    # --- the Service ---------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Every driver served is registered with the kubelet and its slices are written; with none
        served, because the config serves no vendor through DRA, ready too (the device plugin serves them)."""
        drivers = list(self.drivers.values())
        if not drivers and (self._served is None or self.host.config.dra_vendors):
            return False
        return all(d.sockets.registered for d in drivers) and self.publisher.in_sync

    def begin(self, wake: Callable[[], None], stop: threading.Event) -> None:
        self._wake = wake
        self.publisher.start()

    def probe(self) -> str | None:
        self.probes += 1
        try:
            inventory = self.host.probe()
            offer = self.host.offer(inventory)
            found = self.host.dra_devices(inventory, offer, states=self._states())
            self._probed = (inventory, offer)
        except ProbeError as exc:
            return str(exc)
        except ConfigError as exc:
            log.error("the config does not fit this node", reason="bad-config", error=str(exc))
            return f"config: {exc}"
        except Exception as exc:  # a bug in a probe must not end the plugin: it is retried like a late driver
            log.exception("probe failed", reason="probe-failed")
            return f"probe failed: {type(exc).__name__}: {exc}"
        self._carry_forward(inventory, found)
        troubles = self.serve(found)
        troubles += [f"{r.backend}: {r.detail}" for r in inventory.reports if r.status in ("unavailable", "error")]
        if troubles:
            return "; ".join(troubles)
        if found or not self.host.config.dra_vendors:
            self._say_what_is_served(found)
            return None
        vendors = ", ".join(self.host.config.dra_vendors)
        return f"no GPU of a vendor this node serves through DRA (labeller.dra.vendors: {vendors})"

    def _say_what_is_served(self, found: Mapping[str, Sequence[DraDevice]]) -> None:
        """One line when the drivers served change; a node whose config serves nothing through DRA
        (the device plugin serves its GPUs) is not a problem, only idle."""
        drivers = tuple(sorted(found))
        if drivers != self._served:
            if drivers:
                log.info("serving through DRA", drivers=list(drivers), devices=sum(len(d) for d in found.values()))
            else:
                log.info("no vendor is served through DRA on this node (labeller.dra.vendors); publishing nothing",
                         reason="dra-off")
            self._served = drivers

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        log.warning("nothing to publish yet; probing again", reason="driver-not-ready", detail=reason,
                    attempt=attempt, retry_in_s=round(delay_s, 2))

    def recovered(self, attempts: int, waited_s: float) -> None:
        log.info("devices found; publishing", reason="driver-ready", attempts=attempts, waited_s=round(waited_s, 1))

    def work(self, now: float) -> float:
        if self._republish.is_set() and self._probed is not None:
            self._republish.clear()
            self._publish_again(*self._probed)
        if now >= self._next_tick:
            for driver in self.drivers.values():
                try:
                    driver.sockets.tick()
                except Exception:  # one bad tick must not end the loop: the next one retries
                    log.exception("socket check failed; retrying", driver=driver.sockets.driver)
            self._next_tick = now + self.settings.tick_seconds
        return self._next_tick

    # --- what is served ------------------------------------------------------------------------

    def serve(self, found: Mapping[str, Sequence[DraDevice]]) -> list[str]:
        """Serve exactly these drivers and devices from now on (the loop's thread); what kept a driver
        from being served (its claims' files cannot be kept: it publishes nothing, tried again next probe)."""
        config, host_root = self.host.config, self.host.host_root
        problems: list[str] = []
        for driver in sorted(set(self.drivers) - set(found)):
            self.drivers[driver].sockets.stop()
            log.info("driver no longer served; its slices go", driver=driver)
        drivers = {}  # replaced whole: /readyz reads it from another thread
        for driver, devices in sorted(found.items()):
            snapshot = Devices({d.name: d for d in devices}, self.board.healthy, config, host_root)
            if driver in self.drivers:
                drivers[driver] = self.drivers[driver]
                drivers[driver].snapshot = snapshot
            else:
                try:
                    drivers[driver] = self._start_driver(driver, snapshot)
                except OSError as exc:
                    problems.append(f"{driver}: cannot keep its prepared claims: {exc.strerror or exc}")
                    log.error("driver not served: cannot keep its prepared claims", reason="bad-directory",
                              driver=driver, error=str(exc.strerror or exc))
        found = {driver: devices for driver, devices in found.items() if driver in drivers}
        with self._lock:
            self._devices = {driver: list(devices) for driver, devices in found.items()}
        physical = {d.physical for devices in found.values() for d in devices}
        self.board.track(p.health_key for p in physical)
        self._health.follow(physical, host_root, self.host.handles, self.host.vendors)
        self._publish()
        # Only now: ``ready`` reads the drivers, and must not see one before its devices are published.
        self.drivers = drivers
        return problems

    # --- devices made at prepare, and the API server's counters --------------------------------------

    def _ledger(self, driver: str) -> Ledger | None:
        """The driver's ledger of what it made (its vendor makes devices at prepare); OSError when its
        directory cannot be kept."""
        vendor = self._vendor(driver)
        if vendor.dra is None or vendor.dra.maker is None:
            return None
        if driver not in self._ledgers:
            self._ledgers[driver] = Ledger(self.settings.plugins_dir, driver)
        return self._ledgers[driver]

    def _states(self) -> dict[str, DraState]:
        """What each driver made, and whether the API server keeps its counters."""
        states = {}
        for vendor in self.host.vendors:
            if vendor.dra is None:
                continue
            driver = vendor.dra.driver
            try:
                ledger = self._ledger(driver)
            except OSError as exc:  # made devices are then taken as someone else's: left alone
                log.error("cannot read what the driver made for claims", reason="bad-directory", driver=driver,
                          error=str(exc.strerror or exc))
                ledger = None
            states[driver] = DraState(ledger.names() if ledger is not None else frozenset(),
                                      driver not in self._no_counters)
        return states

    def _on_dropped(self, driver: str, fields: frozenset[str]) -> None:
        """The publisher's word (its thread): the API server left ``fields`` out of what it kept of the
        driver's slices (or refused a slice with counters). Counters not kept: publish that driver as
        without dynamicMig, said once."""
        if driver in self._no_counters or not any("sharedCounters" in f or "consumesCounters" in f for f in fields):
            return
        self._no_counters.add(driver)
        log.warning("the API server does not keep the shared counters of the driver's ResourceSlices (Kubernetes' "
                    "DRAPartitionableDevices feature gate is off, or a release that wants them in slices of their "
                    "own): publishing its devices that exist, as without labeller.dra.dynamicMig",
                    reason="counters-dropped", driver=driver, fields=sorted(fields)[:8])
        self._republish.set()
        self._wake()

    def _publish_again(self, inventory: Inventory, offer: Offer) -> None:
        """The last probe's devices, derived again (the loop's thread)."""
        try:
            found = self.host.dra_devices(inventory, offer, states=self._states())
        except Exception:  # as in probe: a bug must not end the plugin; the next probe tries again
            log.exception("publishing again failed", reason="probe-failed")
            return
        self._carry_forward(inventory, found)
        self.serve(found)

    def _carry_forward(self, inventory: Inventory, found: dict[str, list[DraDevice]]) -> None:
        """A vendor whose backend failed keeps what it published: see the module docstring."""
        failed = failed_vendors(inventory)
        for driver, devices in self._devices.items():
            if driver not in found and self._vendor(driver).name in failed:
                found[driver] = devices

    def _vendor(self, driver: str) -> Vendor:
        return next(v for v in self.host.vendors if v.dra is not None and v.dra.driver == driver)

    def _start_driver(self, driver: str, snapshot: Devices) -> _Driver:
        vendor = self._vendor(driver)
        configs = DriverConfigs(driver, vendor.dra.configs if vendor.dra is not None else None, self.settings.configs)
        checkpoint = Checkpoint(self.settings.plugins_dir, driver, self.settings.node_name, configs.read_applied)
        specs = ClaimSpecs(self.settings.cdi_spec_dir, driver)
        entry: _Driver | None = None

        def current() -> Devices:
            assert entry is not None
            return entry.snapshot

        ledger = self._ledger(driver)
        maker = vendor.dra.maker if vendor.dra is not None else None
        make = (lambda: maker(self.host.host_root, self.host.handles)) if maker is not None else None
        preparer = Preparer(driver, self.settings.node_name, vendor, self.api.get_resource_claim, checkpoint, specs,
                            current, configs, ledger, make)
        sockets = DriverSockets(driver, self.settings.registry_dir, self.settings.plugins_dir,
                                DraService(preparer, self.metrics), self.metrics)
        entry = _Driver(sockets, snapshot)
        sockets.start()
        return entry

    def _publish(self) -> None:
        """Publish every driver's healthy devices (the loop's thread, or a health check's)."""
        with self._lock:
            unhealthy = self.board.unhealthy_keys()
            published = healthy(self._devices, unhealthy)
            self.publisher.publish(published)
            for driver, devices in self._devices.items():
                self.metrics.devices.labels(driver=driver, health=HEALTHY).set(len(published[driver]))
                self.metrics.devices.labels(driver=driver, health=UNHEALTHY).set(len(devices) - len(published[driver]))

    # --- health -----------------------------------------------------------------------------------

    def _on_health_change(self, key: str, is_healthy: bool, reason: str) -> None:
        with self._lock:
            names = [(driver, d.name) for driver, devices in self._devices.items()
                     for d in devices if d.health_key == key]
        for driver, name in names:
            (log.info if is_healthy else log.warning)("device health changed", driver=driver, device=name,
                                                      health=HEALTHY if is_healthy else UNHEALTHY, reason=reason)
        self._publish()

    # --- lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop serving: the sockets go (the kubelet deregisters the drivers), health checks stop; the
        slices stay for the next process to take over (the kubelet deletes them 30 s after a driver
        deregistered and did not come back)."""
        self._stop.set()
        self.publisher.join()
        for driver in self.drivers.values():
            driver.sockets.stop()
        self._health.stop()
        self.board.close()


def probe_inputs(host: Host) -> Callable[[], object] | None:
    """What the loop looks at between probes: the offer's inputs (NVIDIA's MPS readiness file) and a
    simulated profile file's identity, so an edited profile is published within the inputs poll."""
    if host.simulation is None and host.offer_inputs() is None:
        return None

    def inputs() -> object:
        stamp = None
        if host.simulation is not None:
            try:
                st = os.stat(host.simulation.path)
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                pass
        return host.offer_inputs(), stamp

    return inputs

