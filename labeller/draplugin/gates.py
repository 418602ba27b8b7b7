"""ResourceSlice fields behind Kubernetes feature gates, and what the plugin publishes where the API
server has a gate off.

Kubernetes adds DRA features as alpha fields behind feature gates, off by default (1.34:
``DRAConsumableCapacity``, ``DRAPartitionableDevices``, ``DRADeviceTaints``, ...). An API server with
the gate off does not refuse such a field: it drops it from what it stores and answers the write with
the slice as stored (``dropDisabledFields`` of its ResourceSlice strategy). So the plugin publishes
what the node can do, and learns from the answer: the publisher hands the fields the answers lack to
``GateFallbacks.dropped`` (``SlicePublisher.on_dropped``), which matches them to the gates below,
logs one line per gate found off (``reason=feature-gate-off``: the gate, the driver, the fields, what
is published instead) and from then on ``apply`` gives every driver's devices as published without
that gate (``Gate.fallback``): today's behaviour, not a slice the scheduler reads wrong. Fields no gate
here names are logged once (``reason=fields-dropped``) and left as the server keeps them.

A gate found off stays off until the plugin restarts: finding out that a server gained a gate would
take a write while nothing changes. One server serves every driver, so a gate off for one is off for all.

A feature that publishes gated fields adds one ``Gate`` to ``GATES``: the paths of the fields it adds
(as ``publisher.dropped`` names them, ``*`` for any one key such as a capacity's name) and the fallback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from labeller.draplugin import taints
from labeller.resourceslices import DraDevice, exclusive, untainted

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Gate:
    name: str  # the Kubernetes feature gate, as --feature-gates names it
    fields: tuple[str, ...]  # the paths it adds to a slice's spec; "*" stands for any one key
    fallback: Callable[[Sequence[DraDevice]], list[DraDevice]]  # one driver's devices as published without it
    instead: str  # what is published then, for people

    def names(self, path: str) -> bool:
        """Whether ``path`` (a dropped field) is one of this gate's fields, or inside one."""
        parts = path.split(".")
        return any(len(parts) >= len(pattern) and all(p in ("*", part) for p, part in zip(pattern, parts))
                   for pattern in (f.split(".") for f in self.fields))


GATES: tuple[Gate, ...] = (
    Gate("DRAConsumableCapacity", ("devices[].allowMultipleAllocations", "devices[].capacity.*.requestPolicy"),
         exclusive, "each device to one claim at a time (sharing.memory then only through the scheduler extender)"),
    Gate(taints.GATE, ("devices[].taints",),
         untainted, "an unhealthy device left out of its slice, one gone from the probe removed at once (no taints)"),
)


class GateFallbacks:
    """Which gates the API server has off, as its answers told; thread-safe (the publisher's worker
    reports, the plugin's threads apply)."""

    def __init__(self, gates: Iterable[Gate] = GATES) -> None:
        self.gates = tuple(gates)
        self._lock = threading.Lock()
        self._off: list[Gate] = []
        self._told: set[str] = set()  # dropped fields no gate names, already logged

    @property
    def off(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(g.name for g in self._off)

    def dropped(self, driver: str, paths: Iterable[str]) -> bool:
        """The server did not keep these fields of ``driver``'s slices; True when that turned a gate off
        (publish again, with ``apply``)."""
        paths = set(paths)
        changed = False
        with self._lock:
            for gate in self.gates:
                fields = sorted(p for p in paths if gate.names(p))
                if fields and gate not in self._off:
                    self._off.append(gate)
                    changed = True
                    log.warning(f"the API server does not keep {gate.name}'s fields (feature gate off there): "
                                "publishing without them", reason="feature-gate-off", gate=gate.name, driver=driver,
                                fields=fields, instead=gate.instead)
                paths -= set(fields)
            unknown = sorted(paths - self._told)
            self._told |= paths
        if unknown:
            log.warning("the API server did not keep fields the plugin wrote", reason="fields-dropped",
                        driver=driver, fields=unknown)
        return changed

    def apply(self, devices_by_driver: Mapping[str, Sequence[DraDevice]]) -> dict[str, list[DraDevice]]:
        """Each driver's devices as published with the gates found off."""
        with self._lock:
            off = list(self._off)
        out = {}
        for driver, devices in devices_by_driver.items():
            published = list(devices)
            for gate in off:
                published = gate.fallback(published)
            out[driver] = published
        return out
