"""Health as device taints: what the DRA plugin publishes for a device that is not well.

Where the API server keeps ``Device.taints`` (Kubernetes 1.34: feature gate DRADeviceTaints, alpha,
off by default), an unhealthy device stays in its slice with one taint per kind of fault the health
checks reported (``labeller.model.vendor.plugin.Fault``), in the vendor's keys (``Dra.taint_keys``: NVIDIA's
driver's ``gpu.nvidia.com/xid``, ``gpu.nvidia.com/gpu-lost``, ``gpu.nvidia.com/unmonitored``; AMD's
``gpu.amd.com/kfd-node-lost``):

- an XID: ``NoSchedule``, the XID as value (the latest of them), as NVIDIA's driver does: no new claim
  gets the device, the pods using it keep running (many XIDs leave running work intact);
- a lost device (it stopped answering NVML, its KFD node is gone): ``NoExecute``. NVIDIA's driver
  says ``NoSchedule``; a lost GPU fails every pod using it, so where the device taint eviction
  controller runs (kube-controller-manager, same gate) they are evicted and their controllers place
  them elsewhere, rather than left running against a GPU that is not there;
- unmonitored (its events cannot be watched) and any other fault: ``NoSchedule``.

The taints go when the device recovers (the health board's recovery), and the slice says so again.

A device gone from the probe altogether (the node no longer shows it) is published as it was last
seen, tainted as lost (``NoExecute``), so that the pods using it are evicted: the eviction controller
only acts on a device it still finds in a slice, and a device simply dropped from the slice would
leave its pods running against nothing. It stays (``Gone``) while a claim prepared on this node
still holds it, and at least ``hold_s`` (the pods whose claims were allocated it but not prepared
yet), then goes at the next probe (the DRA plugin probes as soon as one is due: ``due``). It comes
back as itself, untainted, if the probe finds it again. A partition offered on counters (made at
prepare, ``labeller.dra.dynamicMig``) that is no longer offered is not such a device: it is an offer,
not hardware (one made for a claim is published as itself while it exists), and it could not be
published without the counters it draws on, which change with what is offered.

Where the API server drops the taints (the gate off), nothing changes from before taints: the gate's
fallback (``labeller.apps.draplugin.gates``: ``untainted``) leaves every tainted device out, so an unhealthy
device leaves its slice, and one gone from the probe is simply gone (the plugin no longer keeps it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence

from labeller.model.resourceslices import DeviceTaint, DraDevice
from labeller.model.vendor.plugin import Fault

GATE = "DRADeviceTaints"
NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"
EFFECTS = {Fault.XID: NO_SCHEDULE, Fault.LOST: NO_EXECUTE, Fault.UNMONITORED: NO_SCHEDULE, Fault.OTHER: NO_SCHEDULE}
GONE = Fault("gone from the probe", Fault.LOST)
DEFAULT_HOLD_S = 300.0


def taints(driver: str, keys: Mapping[str, str], reasons: Sequence[str]) -> tuple[DeviceTaint, ...]:
    """One taint per kind of fault among ``reasons`` (the latest reason of each kind), in kind order."""
    latest = {kind: code for kind, code in map(Fault.kind_of, reasons or [""])}
    return tuple(DeviceTaint(keys.get(kind, f"{driver}/unhealthy"), EFFECTS[kind], "" if code is None else str(code))
                 for kind, code in sorted(latest.items()))


def published(devices_by_driver: Mapping[str, Sequence[DraDevice]], faults: Mapping[str, Sequence[str]],
              keys: Mapping[str, Mapping[str, str]],
              gone: Mapping[str, Sequence[tuple[int, DraDevice]]] | None = None) -> dict[str, list[DraDevice]]:
    """What each driver publishes: its devices, those whose health key has ``faults`` (health key ->
    reasons) tainted, and the ``gone`` ones tainted as lost, each where it was (its position when last
    found: a lost GPU the probe then leaves out is published the same, not moved). ``keys``: each
    driver's taint keys by kind of fault."""
    out: dict[str, list[DraDevice]] = {}
    for driver, devices in devices_by_driver.items():
        driver_keys = keys.get(driver, {})
        out[driver] = [dataclasses.replace(d, taints=taints(driver, driver_keys, faults[d.health_key]))
                       if d.health_key in faults else d for d in devices]
        for position, device in (gone or {}).get(driver, ()):
            out[driver].insert(position, dataclasses.replace(device, taints=taints(driver, driver_keys, [GONE])))
    return out


class Gone:
    """Devices gone from the probe that are still published, tainted (see the module docstring)."""

    def __init__(self, hold_s: float = DEFAULT_HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s, self.clock = hold_s, clock
        # driver -> name -> (device, its position when last found, gone since)
        self._gone: dict[str, dict[str, tuple[DraDevice, int, float]]] = {}

    def update(self, before: Mapping[str, Sequence[DraDevice]], found: Mapping[str, Sequence[DraDevice]],
               held: Callable[[str, str], bool]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """After a probe: the devices of ``before`` (the last probe) missing from ``found``, of a driver
        still served, are gone from now on; one found again is not; one gone for ``hold_s`` that no
        prepared claim holds (``held(driver, name)``) goes for good. Returns the (driver, name) of those
        gone now, and of those that went for good."""
        now = self.clock()
        went, dropped = [], []
        for driver in set(self._gone) - set(found):
            del self._gone[driver]
        for driver, devices in found.items():
            names = {d.name for d in devices}
            gone = {name: entry for name, entry in self._gone.get(driver, {}).items() if name not in names}
            for position, device in enumerate(before.get(driver, ())):
                if device.name not in names and device.name not in gone and not device.consumes:
                    gone[device.name] = (device, position, now)
                    went.append((driver, device.name))
            kept = {name: entry for name, entry in gone.items() if now - entry[2] < self.hold_s or held(driver, name)}
            dropped += [(driver, name) for name in gone if name not in kept]
            self._gone[driver] = kept
        return went, dropped

    def due(self, held: Callable[[str, str], bool]) -> list[tuple[str, str]]:
        """The (driver, name) of the gone devices the next probe drops: gone for ``hold_s``, and held by
        no prepared claim (``held(driver, name)``)."""
        now = self.clock()
        return sorted((driver, name) for driver, gone in self._gone.items() for name, (_, _, since) in gone.items()
                      if now - since >= self.hold_s and not held(driver, name))

    def devices(self) -> dict[str, list[tuple[int, DraDevice]]]:
        """Each driver's gone devices with their positions, in position order."""
        return {driver: sorted(((position, device) for device, position, _ in gone.values()), key=lambda e: e[0])
                for driver, gone in self._gone.items() if gone}

    def clear(self) -> None:
        self._gone.clear()
