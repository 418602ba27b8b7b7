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

A server may instead refuse a slice for good (400, 422) naming fields it carries: a release that
takes a gate's fields only in another layout (from Kubernetes 1.35 a slice holds either
``sharedCounters`` or ``devices``, ``only one of ...``). The publisher hands those fields over the
same way, with the server's message (``refused``); a gate whose fields they are is off from then on,
said in the same one line with the message: the slice is published without them rather than
refused forever.

Some fallbacks are more than a filter of what was published: without ``DRAPartitionableDevices``
the vendors publish the partitions that exist instead of those they would make at prepare, so the
DRA plugin derives the devices again, telling the vendors (``DraState.counters``); ``unpartitioned``
then leaves out anything still drawing on counters.

A gate found off stays off until the plugin restarts: finding out that a server gained a gate would
take a write while nothing changes. One server serves every driver, so a gate off for one is off for all.

A feature that publishes gated fields adds one ``Gate`` to ``GATES``: the paths of the fields it adds
(as ``slicecontent.dropped`` names them, ``*`` for any one key such as a capacity's name) and the fallback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from labeller.apps.draplugin import taints
from labeller.model.resourceslices import DraDevice, unpartitioned, unshared, untainted
from labeller.base.log import get_logger

log = get_logger(__name__)


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


PARTITIONABLE_DEVICES = "DRAPartitionableDevices"

# In the order their fallbacks apply: the partitions that exist first, so the other fallbacks see them.
GATES: tuple[Gate, ...] = (
    Gate(PARTITIONABLE_DEVICES, ("sharedCounters", "devices[].consumesCounters"), unpartitioned,
         "the partitions that exist (MIG devices, AMD partitions in their current mode), none made at prepare "
         "(labeller.dra.dynamicMig then changes nothing)"),
    Gate("DRAConsumableCapacity", ("devices[].allowMultipleAllocations", "devices[].capacity.*.requestPolicy"),
         unshared, "each device to one claim at a time (sharing.memory then only through the scheduler extender)"),
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

    def dropped(self, driver: str, paths: Iterable[str], refused: str = "") -> bool:
        """The server did not keep these fields of ``driver``'s slices, or (``refused``: its message)
        refused a slice naming them; True when that turned a gate off (publish again, with ``apply``)."""
        paths = set(paths)
        changed = False
        with self._lock:
            for gate in self.gates:
                fields = sorted(p for p in paths if gate.names(p))
                if fields and gate not in self._off:
                    self._off.append(gate)
                    changed = True
                    if refused:
                        log.warning(f"the API server refuses {gate.name}'s fields as written: publishing without "
                                    "them", reason="feature-gate-off", gate=gate.name, driver=driver, fields=fields,
                                    instead=gate.instead, refused=refused[:300])
                    else:
                        log.warning(f"the API server does not keep {gate.name}'s fields (feature gate off there): "
                                    "publishing without them", reason="feature-gate-off", gate=gate.name,
                                    driver=driver, fields=fields, instead=gate.instead)
                paths -= set(fields)
            unknown = [] if refused else sorted(paths - self._told)  # a refusal names more than its cause
            if not refused:
                self._told |= paths
        if unknown:
            log.warning("the API server did not keep fields the plugin wrote", reason="fields-dropped",
                        driver=driver, fields=unknown)
        return changed

    def off_for(self, paths: Iterable[str]) -> bool:
        """Whether any of these fields is a gate's that is off."""
        with self._lock:
            return any(gate.names(p) for gate in self._off for p in paths)

    def apply(self, devices_by_driver: Mapping[str, Sequence[DraDevice]]) -> dict[str, list[DraDevice]]:
        """Each driver's devices as published with the gates found off."""
        with self._lock:
            off = [gate for gate in self.gates if gate in self._off]
        out = {}
        for driver, devices in devices_by_driver.items():
            published = list(devices)
            for gate in off:
                published = gate.fallback(published)
            out[driver] = published
        return out
