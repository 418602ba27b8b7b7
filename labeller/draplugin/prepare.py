"""NodePrepareResources and NodeUnprepareResources for one driver, claim by claim.

Preparing a claim: read the ResourceClaim the kubelet names (namespace, name; its UID must match),
take the ``status.allocation.devices.results`` of this driver, check that each device is one of this
node's (its pool is the node's) and healthy, write the claim's CDI spec file, record the claim in
the checkpoint, and answer the CDI device IDs of exactly those devices. Anything wrong fails that
claim alone, with a message naming the device; the other claims of the call are prepared.

A claim already in the checkpoint is answered from it without reading the API (the kubelet calls
again after a restart, and for every pod that shares the claim): it is prepared once. Unpreparing
removes the spec file and the checkpoint entry; a claim unknown to the checkpoint is fine (already
unprepared, or prepared by a process that died before writing it: its spec file, named by the UID,
is removed all the same). The kubelet unprepares a shared claim after its last pod on the node.

Calls for different claims run concurrently; calls for the same claim one at a time.
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from labeller.config import Config
from labeller.draplugin.cdi import ClaimSpecs, cdi_id, claim_spec
from labeller.draplugin.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from labeller.resourceslices import DraDevice
from labeller.vendor import Vendor

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
ClaimReader = Callable[[str, str], Obj]  # (namespace, name) -> the ResourceClaim; raises on failure
LOCK_STRIPES = 64
UID = re.compile(r"[0-9A-Za-z][-0-9A-Za-z]{0,127}")


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Devices:
    """What one driver serves now: its devices by name (unhealthy ones included), whether a health
    key is healthy, and what the vendor's CDI spec is built with."""

    by_name: Mapping[str, DraDevice]
    healthy: Callable[[str], bool]
    config: Config
    host_root: Path


class ClaimError(Exception):
    """This claim cannot be prepared (or unprepared); the message says why, naming the device."""


def _check_uid(claim: ClaimRef) -> None:
    """A UID names files (the checkpoint's, the CDI spec's): letters, digits and dashes only."""
    if not UID.fullmatch(claim.uid):
        raise ClaimError(f"claim {claim}: {claim.uid!r} is not a UID")


class Preparer:
    def __init__(self, driver: str, pool: str, vendor: Vendor, read_claim: ClaimReader, checkpoint: Checkpoint,
                 specs: ClaimSpecs, devices: Callable[[], Devices]) -> None:
        self.driver, self.pool, self.vendor = driver, pool, vendor
        self.read_claim, self.checkpoint, self.specs, self.devices = read_claim, checkpoint, specs, devices
        self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]

    def _lock(self, uid: str) -> threading.Lock:
        return self._stripes[zlib.crc32(uid.encode()) % LOCK_STRIPES]

    def prepare(self, claim: ClaimRef) -> PreparedClaim:
        """Prepare ``claim`` (once); ClaimError says why it cannot be."""
        _check_uid(claim)
        with self._lock(claim.uid):
            done = self.checkpoint.get(claim.uid)
            if done is not None and (not done.devices or self.specs.path(claim.uid).exists()):
                return done
            prepared = self._prepare(claim)
            try:
                self.checkpoint.add(prepared)
            except OSError as exc:
                self.specs.remove(claim.uid)
                raise ClaimError(f"{self.driver}: claim {claim}: cannot write its checkpoint "
                                 f"{self.checkpoint.path(claim.uid)}: {exc.strerror or exc}") from None
            return prepared

    def _prepare(self, claim: ClaimRef) -> PreparedClaim:
        results = self._allocated(claim)
        now = self.devices()
        problems: list[str] = []
        chosen: dict[str, DraDevice] = {}
        requests: dict[str, list[str]] = {}
        for result in results:
            name = str(result.get("device", ""))
            pool = str(result.get("pool", ""))
            device = now.by_name.get(name)
            if pool != self.pool:
                problems.append(f"device {name} is in pool {pool}, not this node's ({self.pool})")
            elif device is None:
                problems.append(f"device {name} is not on this node")
            elif not now.healthy(device.health_key):
                problems.append(f"device {name} is unhealthy")
            else:
                chosen[name] = device
                requests.setdefault(name, []).append(str(result.get("request", "")))
        if problems:
            raise ClaimError(f"{self.driver}: claim {claim}: {'; '.join(problems)}")
        devices = list(chosen.values())
        if devices:
            try:
                self.specs.write(claim.uid, claim_spec(claim.uid, self.vendor, devices, now.config, now.host_root))
            except (OSError, ValueError) as exc:
                raise ClaimError(f"{self.driver}: claim {claim}: cannot write its CDI spec "
                                 f"{self.specs.path(claim.uid)}: {exc}") from None
        return PreparedClaim(claim.uid, claim.namespace, claim.name, tuple(
            PreparedDevice(tuple(requests[d.name]), self.pool, d.name, (cdi_id(claim.uid, d.name),)) for d in devices))

    def _allocated(self, claim: ClaimRef) -> list[Obj]:
        """This driver's allocation results in the claim; ClaimError when it cannot be read or is not allocated."""
        try:
            obj = self.read_claim(claim.namespace, claim.name)
        except Exception as exc:  # noqa: BLE001 - the adapter's errors say what happened (not found, forbidden, no answer)
            raise ClaimError(f"{self.driver}: claim {claim}: cannot read the ResourceClaim: {exc}") from None
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        if uid != claim.uid:
            raise ClaimError(f"{self.driver}: claim {claim}: the ResourceClaim has UID {uid}, not {claim.uid} "
                             "(deleted and created again?)")
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise ClaimError(f"{self.driver}: claim {claim}: not allocated")
        results = (allocation.get("devices") or {}).get("results") or []
        return [r for r in results if r.get("driver") == self.driver]

    def unprepare(self, claim: ClaimRef) -> None:
        """Undo ``prepare`` (nothing to do is fine); ClaimError when a file cannot be removed."""
        _check_uid(claim)
        with self._lock(claim.uid):
            try:
                removed = self.specs.remove(claim.uid)
                self.checkpoint.remove(claim.uid)
            except OSError as exc:
                raise ClaimError(f"{self.driver}: claim {claim}: {exc}") from None
            if removed:
                log.debug("CDI spec removed", driver=self.driver, claim=str(claim), uid=claim.uid)
