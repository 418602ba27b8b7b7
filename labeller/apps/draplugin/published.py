"""The devices the DRA plugin publishes (``labeller.apps.draplugin.app``): what the last probe found of
each driver served, as ResourceSlices (``publisher.SlicePublisher``), with their health.

- Published again whenever a health check marks a device Unhealthy or Healthy again, or an
  unhealthy one has another fault (the health board, ``labeller.process.health``): an unhealthy
  device stays in its slice with device taints saying why, and one gone from the probe stays a while
  tainted NoExecute while a claim here may use it (``labeller.apps.draplugin.taints``).
- Fields of a feature gate the API server has off are dropped by it (or refused, naming them): the
  publisher says so (``on_dropped``), the gate's fallback applies from then on
  (``gates.GateFallbacks``), and the loop is woken to derive the last probe's devices again
  (``republish_due``). Without DRADeviceTaints, an unhealthy device is left out of its slice instead
  of tainted, and a device gone from the probe is simply gone.

The loop's thread replaces the devices (``replace``); it, the health checks' threads and the
publisher's worker publish them, one at a time.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence

from labeller.apps.draplugin.gates import GateFallbacks
from labeller.apps.draplugin.metrics import DraMetrics
from labeller.apps.draplugin.prepare import Devices
from labeller.apps.draplugin.publisher import SliceApi, SlicePublisher
from labeller.apps.draplugin.taints import GATE, Gone, published
from labeller.process.health import HEALTHY, UNHEALTHY, HealthBoard
from labeller.model.resourceslices import DraDevice
from labeller.base.log import get_logger

log = get_logger(__name__)

Held = Callable[[str, str], bool]  # (driver, device name): a claim prepared on this node holds it


class PublishedDevices:
    """See the module docstring. ``taint_keys(driver)``: the keys of its vendor's device taints;
    ``wake``: the loop's (a gate turned out off)."""

    def __init__(self, api: SliceApi, node_name: str, metrics: DraMetrics, board: HealthBoard, gates: GateFallbacks,
                 gone: Gone, taint_keys: Callable[[str], Mapping[str, str]], wake: Callable[[], None]) -> None:
        self.metrics, self.board, self.gates, self.gone = metrics, board, gates, gone
        self.taint_keys, self.wake = taint_keys, wake
        self.publisher = SlicePublisher(api, node_name, metrics, threading.Event(), on_dropped=self._on_dropped)
        self._devices: dict[str, list[DraDevice]] = {}  # what the last probe found, unhealthy devices included
        self._lock = threading.Lock()  # ``_devices`` and the publishing of it, between the loop and health threads
        self._republish = threading.Event()  # a gate turned out off: derive and publish again (the loop's work)
        board.listeners.append(self._on_health_change)
        board.fault_listeners.append(self._on_fault)

    @property
    def last(self) -> Mapping[str, list[DraDevice]]:
        """What the last probe found (read on the loop's thread, the only one that replaces it)."""
        return self._devices

    def replace(self, found: Mapping[str, Sequence[DraDevice]], held: Held) -> None:
        """The devices of the drivers served from now on (the loop's thread); a device of the last probe
        missing from ``found`` stays published tainted while it is held or for the hold (``taints.Gone``)."""
        with self._lock:
            if GATE in self.gates.off:  # no taint to publish a gone device with: it is simply gone
                self.gone.clear()
            else:
                went, dropped = self.gone.update(self._devices, found, held)
                for driver, name in went:
                    log.warning("device gone from the probe: published tainted NoExecute while it may be in use",
                                driver=driver, device=name, reason="device-gone", hold_s=self.gone.hold_s)
                for driver, name in dropped:
                    log.info("device gone from the probe no longer published: no claim here holds it",
                             driver=driver, device=name, reason="device-gone")
            self._devices = {driver: list(devices) for driver, devices in found.items()}

    def publish(self) -> None:
        """Publish every driver's devices, the unhealthy ones tainted or left out (the loop's thread, a
        health check's, or the publisher's)."""
        with self._lock:
            faults = self.board.faults()
            keys = {driver: self.taint_keys(driver) for driver in self._devices}
            gone = self.gone.devices()
            self.publisher.publish(self.gates.apply(published(self._devices, faults, keys, gone=gone)))
            for driver, devices in self._devices.items():
                well = sum(1 for d in devices if d.health_key not in faults)
                self.metrics.devices.labels(driver=driver, health=HEALTHY).set(well)
                self.metrics.devices.labels(driver=driver, health=UNHEALTHY).set(
                    len(devices) - well + len(gone.get(driver, ())))

    # --- a gate found off -------------------------------------------------------------------------

    def as_published(self, driver: str, snapshot: Devices) -> Devices:
        """What a prepare sees of the driver's devices: as published, under the feature gates the API
        server has off (a GPU published exclusive is prepared as one)."""
        if not self.gates.off:
            return snapshot
        view = self.gates.apply({driver: list(snapshot.by_name.values())})[driver]
        return dataclasses.replace(snapshot, by_name={d.name: d for d in view})

    def _on_dropped(self, driver: str, fields: frozenset[str], refused: str = "") -> bool:
        """The API server did not keep these fields, or refused a slice naming them (``refused``: its
        message) (the publisher's worker): the loop derives the last probe's devices again and publishes
        them without the feature gates that turned out off (``labeller.apps.draplugin.gates``). Whether the
        fields are a gate's that is off."""
        if self.gates.dropped(driver, fields, refused):
            for gate in self.gates.off:
                self.metrics.gates_off.labels(gate=gate).set(1)
            self._republish.set()
            self.wake()
        return self.gates.off_for(fields)

    def republish_due(self) -> bool:
        """Whether a gate turned out off since the last call: the last probe's devices are to be
        derived again and published (the loop's work)."""
        if not self._republish.is_set():
            return False
        self._republish.clear()
        return True

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
        self.publish()

    def _on_fault(self, key: str, reason: str) -> None:
        """An unhealthy device has a fault of another kind or code (an XID, then lost): its taints change."""
        for driver, name in self._devices_of(key):
            log.warning("unhealthy device has another fault", driver=driver, device=name, health=UNHEALTHY,
                        reason=reason)
        self.publish()
