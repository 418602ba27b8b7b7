"""The DRA plugin: ``DraPlugin``, the ``dra-plugin`` command's service on the process loop
(``labeller.process.loop``).

Each probe (at start, every ``--probe-interval``, after SIGHUP or a named-config change, and as
soon as what it reads changes: the simulated profile file, a vendor's hardware stamp such as KFD's
topology generation, a MIG reconfiguration NVML reports; see ``probe_inputs``) turns the node's
inventory and offer into the DRA devices of each vendor the config serves through DRA
(``Host.dra_devices``), one driver per vendor present:

- a driver new to the plugin gets its sockets (``server.DriverSockets``: registration with the
  kubelet, the DRA service), its checkpoint and its claim preparer; a driver no longer there (the
  config moved its vendor back to the device plugin) loses them, and its slices are deleted
  (``drivers.DriverSet``);
- the devices of every driver are published (``published.PublishedDevices`` over
  ``publisher.SlicePublisher``), and published again
  whenever a health check marks a device Unhealthy or Healthy again (the device plugin's health
  board and the vendors' checkers, ``labeller.process.health``): an unhealthy device stays in its
  slice with device taints saying why, and one gone from the probe stays a while tainted NoExecute
  (``labeller.apps.draplugin.taints``). A claim that names an unhealthy device is refused;
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

Idle, the plugin sleeps until something happens: inotify (``labeller.base.inotify``) on the registration
and DRA socket directories and the profile file's directory wakes the loop, whose ``work`` then
re-creates a socket that is gone (a kubelet restart deletes the registration socket), which
registers the driver again, and looks at the inputs. Where inotify cannot be used, ``work`` looks
at the sockets every ``tick_seconds`` instead (``drivers.DriverSet.tick``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from labeller.model.config import ConfigError
from labeller.apps.draplugin.derive import Derivation, Found
from labeller.apps.draplugin.drivers import Driver, DriverSet, dra_vendor, held
from labeller.apps.draplugin.gates import GateFallbacks
from labeller.apps.draplugin.metrics import DraMetrics
from labeller.apps.draplugin.published import PublishedDevices
from labeller.apps.draplugin.publisher import SliceApi, SlicePublisher
from labeller.apps.draplugin.settings import DraSettings
from labeller.apps.draplugin.taints import Gone
from labeller.host.machine import Host
from labeller.base.inotify import DirectoryWatch
from labeller.model.inventory import Inventory, ProbeError
from labeller.process.health import HealthBoard, HealthChecks
from labeller.model.resourceslices import DraDevice
from labeller.base.log import get_logger

log = get_logger(__name__)

Obj = dict[str, Any]


class DraApi(SliceApi, Protocol):
    """The cluster adapter's calls the plugin makes (``labeller.cluster.kube.Kube``)."""

    def get_resource_claim(self, namespace: str, name: str) -> Obj: ...


def failed_vendors(inventory: Inventory) -> set[str]:
    """Vendors whose backend could not describe their GPUs this time (NVML missing, no KFD topology)."""
    return {r.backend for r in inventory.reports if r.status in ("unavailable", "error")}


def _taint_keys(host: Host, driver: str) -> Mapping[str, str]:
    dra = dra_vendor(host, driver).dra
    return dra.taint_keys if dra is not None else {}


class DraPlugin:
    """See the module docstring. A ``Service`` of the process loop; ``close`` when the loop is done."""

    def __init__(self, host: Host, settings: DraSettings, api: DraApi, metrics: DraMetrics | None = None) -> None:
        self.host = host
        self.metrics = metrics or DraMetrics()
        self.board = HealthBoard((), settings.recovery_seconds)
        gates = GateFallbacks()
        self.published = PublishedDevices(  # the gone devices kept only while the API server keeps taints
            api, settings.node_name, self.metrics, self.board, gates, Gone(settings.gone_hold_seconds),
            lambda driver: _taint_keys(host, driver), lambda: self._wake())
        self._health = HealthChecks(self.board, settings.health_env, settings.health_poll_seconds, stamps=True)
        self.probes = 0  # probes done (a test awaits the next one)
        self._served: tuple[str, ...] | None = None  # the drivers served, as last said
        self.derivation = Derivation(host, settings.plugins_dir, gates)  # each probe's devices
        self.driver_set = DriverSet(host, settings, self.metrics, self.derivation, api.get_resource_claim,
                                    self.published.as_published)
        self._wake: Callable[[], None] = lambda: None  # the loop's, from ``begin``
        self.board.hardware_listeners.append(lambda reason: self._wake())

    @property
    def drivers(self) -> Mapping[str, Driver]:
        """The drivers served (``DriverSet.running``)."""
        return self.driver_set.running

    @property
    def publisher(self) -> SlicePublisher:
        return self.published.publisher

    @property
    def gates(self) -> GateFallbacks:
        return self.published.gates

    @property
    def gone(self) -> Gone:
        return self.published.gone

    @property
    def watch(self) -> DirectoryWatch | None:
        """The socket and profile directories, from ``begin``."""
        return self.driver_set.watch

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
        self.driver_set.begin(wake)
        self.publisher.start()

    def inputs_polled(self) -> bool:
        """Whether the loop must look at ``probe_inputs`` on a schedule: something in them can change
        with no one waking it (NVIDIA's MPS readiness goes stale; a profile file inotify cannot watch;
        a vendor's hardware stamp while no health monitor polls it; a device gone from the probe whose
        hold ends)."""
        watching = self.driver_set.watching
        return (self.host.offer_inputs() is not None or (self.host.simulation is not None and not watching)
                or not self._health.polls_stamps or bool(self.gone.devices()))

    def gone_due(self) -> object:
        """The devices gone from the probe that the next probe drops (``Gone.due``): one more is a
        reason to probe now (``probe_inputs``), not at the next ``--probe-interval``."""
        drivers = self.drivers
        return tuple(self.gone.due(lambda driver, name: held(drivers, driver, name)))

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
        """Publish again if a gate turned out off; look at the sockets (``DriverSet.tick``); when to look
        next."""
        if self.published.republish_due():
            self._publish_again()
        return self.driver_set.tick(now)

    # --- what is served ------------------------------------------------------------------------

    def serve(self, found: Mapping[str, Sequence[DraDevice]]) -> list[str]:
        """Serve exactly these drivers and devices from now on (the loop's thread); what kept a driver
        from being served (its claims' files cannot be kept: it publishes nothing, tried again next probe)."""
        drivers, problems = self.driver_set.start(found, self.board.healthy)
        found = {driver: devices for driver, devices in found.items() if driver in drivers}
        self.published.replace(found, lambda driver, name: held(drivers, driver, name))
        physical = {d.physical for devices in found.values() for d in devices}
        self.board.track(p.health_key for p in physical)
        self._health.follow(physical, self.host.host_root, self.host.handles, self.host.vendors)
        self.published.publish()
        # Only now: ``ready`` reads the drivers, and must not see one before its devices are published.
        self.driver_set.running_now(drivers)
        return problems

    def _publish_again(self) -> None:
        """A gate found off: the last probe's devices, derived again under the gates now off, and served
        (the loop's thread)."""
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
        for driver, devices in self.published.last.items():
            if driver not in found and dra_vendor(self.host, driver).name in failed:
                found[driver] = devices

    # --- lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop serving: the sockets go (the kubelet deregisters the drivers), health checks stop; the
        slices stay for the next process to take over (the kubelet deletes them 30 s after a driver
        deregistered and did not come back)."""
        self.publisher.stop.set()
        if self.watch is not None:
            self.watch.close()
        self.publisher.join()
        self.driver_set.stop()
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

