"""The DRA plugin: ``DraPlugin``, the ``dra-plugin`` command's service on the process loop
(``labeller.process.loop``).

Each probe (at start, every ``--probe-interval``, after SIGHUP or a named-config change, and as
soon as what it reads changes: the simulated profile file, a vendor's hardware stamp such as KFD's
topology generation, a MIG reconfiguration NVML reports; see ``probe_inputs``) turns the node's
inventory and offer into the DRA devices of each vendor the config serves through DRA
(``Host.dra_devices``), one driver per vendor present:

- a driver new to the plugin gets its sockets (``server.DriverSockets``: registration with the
  kubelet, the DRA service), its checkpoint and its claim preparer; a driver no longer there (the
  config moved its vendor back to the device plugin) loses them, and its slices are deleted;
- the devices of every driver are published (``publisher.SlicePublisher``), and published again
  whenever a health check marks a device Unhealthy or Healthy again (the device plugin's health
  board and the vendors' checkers, ``labeller.process.health``): an unhealthy device stays in its
  slice with device taints saying why, and one gone from the probe stays a while tainted NoExecute
  (``labeller.draplugin.taints``). A claim that names an unhealthy device is refused;
- fields of a feature gate the API server has off are dropped by it (or refused, naming them); the
  publisher says so and the plugin derives the last probe's devices again and publishes them without
  that feature from then on (``gates.GateFallbacks``: one line per gate). Without DRADeviceTaints,
  that is an unhealthy device left out of its slice instead of tainted.

Under ``labeller.dra.dynamicMig`` a vendor publishes devices that are made at prepare, drawing on
shared counters (KEP-4815); each probe tells it which devices the driver made and whether the API
server keeps counters (``derive.Derivation``: without DRAPartitionableDevices, the vendors publish
the partitions that exist, as without dynamicMig).

A vendor whose backend fails on a later probe keeps what it published: a driver that stops
answering for a while must not take its devices away; the health checks say whether they work.

Idle, the plugin sleeps until something happens: inotify (``labeller.inotify``) on the registration
and DRA socket directories and the profile file's directory wakes the loop, whose ``work`` then
re-creates a socket that is gone (a kubelet restart deletes the registration socket), which
registers the driver again, and looks at the inputs. Where inotify cannot be used, ``work`` looks
at the sockets every ``tick_seconds`` instead.
"""

from __future__ import annotations

import dataclasses
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
from labeller.draplugin.derive import Derivation, Found
from labeller.draplugin.gates import GateFallbacks
from labeller.draplugin.metrics import DraMetrics
from labeller.draplugin.prepare import Devices, Preparer
from labeller.draplugin.publisher import SliceApi, SlicePublisher
from labeller.draplugin.server import DraService, DriverSockets
from labeller.draplugin.taints import DEFAULT_HOLD_S, GATE, Gone, published
from labeller.host import Host
from labeller.inotify import DirectoryWatch
from labeller.inventory import Inventory, ProbeError
from labeller.process.health import HEALTHY, POLL_SECONDS, UNHEALTHY, HealthBoard, HealthChecks
from labeller.resourceslices import DraDevice
from labeller.vendor import Vendor
from labeller.vendor.dra import ConfigSettings

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
    gone_hold_seconds: float = DEFAULT_HOLD_S  # a device gone from the probe stays published tainted at least this long
    health_poll_seconds: float = POLL_SECONDS
    tick_seconds: float = 0.5  # how often the sockets are looked at where inotify cannot tell
    # the health switches the device plugin reads too (DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS)
    health_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # what claims' opaque configs need: the MPS daemons' root, NVIDIA's tools
    configs: ConfigSettings = field(default_factory=lambda: ConfigSettings(DEFAULT_MPS_ROOT))


@dataclass
class _Driver:
    """What the plugin runs for one driver."""

    sockets: DriverSockets
    snapshot: Devices
    preparer: Preparer | None = None


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
        self.board.fault_listeners.append(self._on_fault)
        self._stop = threading.Event()
        self.gates = GateFallbacks()
        self.publisher = SlicePublisher(api, settings.node_name, self.metrics, self._stop, on_dropped=self._on_dropped)
        self.gone = Gone(settings.gone_hold_seconds)  # kept only while the API server keeps taints
        self.drivers: dict[str, _Driver] = {}
        self._devices: dict[str, list[DraDevice]] = {}  # what the last probe found, unhealthy devices included
        self._lock = threading.Lock()  # ``_devices`` and the publishing of it, between the loop and health threads
        self._health = HealthChecks(self.board, settings.health_env, settings.health_poll_seconds, stamps=True)
        self._next_tick = 0.0
        self.probes = 0  # probes done (a test awaits the next one)
        self._served: tuple[str, ...] | None = None  # the drivers served, as last said
        self.derivation = Derivation(host, settings.plugins_dir, self.gates)  # each probe's devices
        self._republish = threading.Event()  # a gate turned out off: derive and publish again (the loop's work)
        self._wake: Callable[[], None] = lambda: None  # the loop's, from ``begin``
        self.watch: DirectoryWatch | None = None  # the socket and profile directories, from ``begin``
        self.board.hardware_listeners.append(lambda reason: self._wake())

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
        self.watch = DirectoryWatch(wake, "dra-watch")
        self._watch_directories()
        self.publisher.start()

    def inputs_polled(self) -> bool:
        """Whether the loop must look at ``probe_inputs`` on a schedule: something in them can change
        with no one waking it (NVIDIA's MPS readiness goes stale; a profile file inotify cannot watch;
        a vendor's hardware stamp while no health monitor polls it; a device gone from the probe whose
        hold ends)."""
        watching = self.watch is not None and self.watch.watching
        return (self.host.offer_inputs() is not None or (self.host.simulation is not None and not watching)
                or not self._health.polls_stamps or bool(self.gone.devices()))

    def gone_due(self) -> object:
        """The devices gone from the probe that the next probe drops (``Gone.due``): one more is a
        reason to probe now (``probe_inputs``), not at the next ``--probe-interval``."""
        drivers = self.drivers
        return tuple(self.gone.due(lambda driver, name: self._held(drivers, driver, name)))

    def _watch_directories(self) -> None:
        """What wakes the loop: the registration directory, each driver's socket directory, and the
        directory of a simulated profile the node follows."""
        if self.watch is None:
            return
        directories = [self.settings.registry_dir, *(self.settings.plugins_dir / d for d in sorted(self.drivers))]
        if self.host.simulation is not None:
            directories.append(self.host.simulation.path.parent)
        self.watch.watch(directories)

    def probe(self) -> str | None:
        self.probes += 1
        self.metrics.probes.inc()
        try:
            inventory, found = self.derivation.probe()
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
        """Publish again if a gate turned out off; look at the sockets: at every turn of the loop while
        inotify watches their directories (a change wakes it), else every ``tick_seconds``; when to look
        next (a socket to create again after a failure)."""
        if self._republish.is_set():
            self._republish.clear()
            self._publish_again()
        watching = self.watch is not None and self.watch.watching
        if watching or now >= self._next_tick:
            for driver in self.drivers.values():
                try:
                    driver.sockets.tick()
                except Exception:  # one bad tick must not end the loop: the next one retries
                    log.exception("socket check failed; retrying", driver=driver.sockets.driver)
            self._next_tick = now + self.settings.tick_seconds
        retry = min((d.sockets.next_try() for d in self.drivers.values()), default=float("inf"))
        return retry if watching else min(self._next_tick, retry)

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
            if GATE in self.gates.off:  # no taint to publish a gone device with: it is simply gone
                self.gone.clear()
            else:
                went, dropped = self.gone.update(self._devices, found,
                                                 lambda driver, name: self._held(drivers, driver, name))
                for driver, name in went:
                    log.warning("device gone from the probe: published tainted NoExecute while it may be in use",
                                driver=driver, device=name, reason="device-gone",
                                hold_s=self.settings.gone_hold_seconds)
                for driver, name in dropped:
                    log.info("device gone from the probe no longer published: no claim here holds it",
                             driver=driver, device=name, reason="device-gone")
            self._devices = {driver: list(devices) for driver, devices in found.items()}
        physical = {d.physical for devices in found.values() for d in devices}
        self.board.track(p.health_key for p in physical)
        self._health.follow(physical, host_root, self.host.handles, self.host.vendors)
        self._publish()
        # Only now: ``ready`` reads the drivers, and must not see one before its devices are published.
        self.drivers = drivers
        self._watch_directories()
        return problems

    # --- a gate found off: the last probe published again ----------------------------------------

    def _publish_again(self) -> None:
        """The last probe's devices, derived again under the gates now off, and served (the loop's thread)."""
        try:
            again = self.derivation.again()
        except Exception:  # as in probe: a bug must not end the plugin; the next probe tries again
            log.exception("publishing again failed", reason="probe-failed")
            return
        if again is not None:
            inventory, found = again
            self._carry_forward(inventory, found)
            self.serve(found)

    def _carry_forward(self, inventory: Inventory, found: Found) -> None:
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
            return self._as_published(driver, entry.snapshot)

        ledger = self.derivation.ledger(vendor)
        maker = vendor.dra.maker if vendor.dra is not None else None
        make = (lambda: maker(self.host.host_root, self.host.handles)) if maker is not None else None
        preparer = Preparer(driver, self.settings.node_name, vendor, self.api.get_resource_claim, checkpoint, specs,
                            current, configs, ledger, make)
        sockets = DriverSockets(driver, self.settings.registry_dir, self.settings.plugins_dir,
                                DraService(preparer, self.metrics), self.metrics)
        entry = _Driver(sockets, snapshot, preparer)
        sockets.start()
        return entry

    def _as_published(self, driver: str, snapshot: Devices) -> Devices:
        """What a prepare sees of the driver's devices: as published, under the feature gates the API
        server has off (a GPU published exclusive is prepared as one)."""
        if not self.gates.off:
            return snapshot
        view = self.gates.apply({driver: list(snapshot.by_name.values())})[driver]
        return dataclasses.replace(snapshot, by_name={d.name: d for d in view})

    def _taint_keys(self, driver: str) -> Mapping[str, str]:
        dra = self._vendor(driver).dra
        return dra.taint_keys if dra is not None else {}

    @staticmethod
    def _held(drivers: Mapping[str, _Driver], driver: str, name: str) -> bool:
        """A claim prepared on this node holds device ``name`` of ``driver``."""
        preparer = drivers[driver].preparer if driver in drivers else None
        return preparer is not None and preparer.holds.holding(name)

    def _publish(self) -> None:
        """Publish every driver's devices, the unhealthy ones tainted or left out (the loop's thread, a
        health check's, or the publisher's)."""
        with self._lock:
            faults = self.board.faults()
            keys = {driver: self._taint_keys(driver) for driver in self._devices}
            gone = self.gone.devices()
            self.publisher.publish(self.gates.apply(published(self._devices, faults, keys, gone=gone)))
            for driver, devices in self._devices.items():
                well = sum(1 for d in devices if d.health_key not in faults)
                self.metrics.devices.labels(driver=driver, health=HEALTHY).set(well)
                self.metrics.devices.labels(driver=driver, health=UNHEALTHY).set(
                    len(devices) - well + len(gone.get(driver, ())))

    def _on_dropped(self, driver: str, fields: frozenset[str], refused: str = "") -> bool:
        """The API server did not keep these fields, or refused a slice naming them (``refused``: its
        message) (the publisher's worker): the loop derives the last probe's devices again and publishes
        them without the feature gates that turned out off (``labeller.draplugin.gates``). Whether the
        fields are a gate's that is off."""
        if self.gates.dropped(driver, fields, refused):
            for gate in self.gates.off:
                self.metrics.gates_off.labels(gate=gate).set(1)
            self._republish.set()
            self._wake()
        return self.gates.off_for(fields)

    # --- health -----------------------------------------------------------------------------------

    def _devices_of(self, key: str) -> list[tuple[str, str]]:
        """(driver, device name) of every device whose health key is ``key``."""
        with self._lock:
            return [(driver, d.name) for driver, devices in self._devices.items() for d in devices
                    if d.health_key == key]

    def _on_health_change(self, key: str, is_healthy: bool, reason: str) -> None:
        for driver, name in self._devices_of(key):
            (log.info if is_healthy else log.warning)("device health changed", driver=driver, device=name,
                                                      health=HEALTHY if is_healthy else UNHEALTHY, reason=reason)
        self._publish()

    def _on_fault(self, key: str, reason: str) -> None:
        """An unhealthy device has a fault of another kind or code (an XID, then lost): its taints change."""
        for driver, name in self._devices_of(key):
            log.warning("unhealthy device has another fault", driver=driver, device=name, health=UNHEALTHY,
                        reason=reason)
        self._publish()

    # --- lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop serving: the sockets go (the kubelet deregisters the drivers), health checks stop; the
        slices stay for the next process to take over (the kubelet deletes them 30 s after a driver
        deregistered and did not come back)."""
        self._stop.set()
        if self.watch is not None:
            self.watch.close()
        self.publisher.join()
        for driver in self.drivers.values():
            driver.sockets.stop()
        self._health.stop()
        self.board.close()


def probe_inputs(host: Host, board: HealthBoard | None = None,
                 pending: Callable[[], object] = lambda: None) -> Callable[[], object]:
    """What the loop looks at between probes (whenever it is woken, and every second while
    ``DraPlugin.inputs_polled``), each a cheap stamp: the offer's inputs (NVIDIA's MPS readiness
    file), a simulated profile file's identity, each vendor's hardware stamp (``Discovery.changes``:
    KFD's topology generation), the hardware changes reported to the health board (a MIG
    reconfiguration NVML reports, a stamp the health monitor saw move) and ``pending`` (what the
    next probe would drop: ``DraPlugin.gone_due``). A change in any is a probe now; the periodic
    probe is only a safety net."""

    def inputs() -> object:
        stamp = None
        if host.simulation is not None:
            try:
                st = os.stat(host.simulation.path)
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                pass
        hardware = tuple(v.discovery.changes(host.host_root) for v in host.vendors if v.discovery.changes is not None)
        return (host.offer_inputs(), stamp, hardware, board.hardware_changes if board is not None else 0,
                pending())

    return inputs

