"""NodePrepareResources and NodeUnprepareResources for one driver, claim by claim.

Preparing a claim: check the names the kubelet gives (namespace a DNS-1123 label, name a DNS-1123
subdomain, a UID; nothing else ever reaches an API path), read the ResourceClaim (its UID must
match), take the ``status.allocation.devices.results`` of this driver (none: refused), check that
each device is one of this node's (its pool is the node's), healthy, and held by no other prepared
claim (``Holds``; a share of a device, consumable capacity, is held with what it consumes, and the
shares of a device never pass its capacities: ``labeller.apps.draplugin.shares``), decode its opaque
configs for the driver and match them to the devices (``labeller.apps.draplugin.configs``), apply them
(``ConfigHandler.apply``: a time slice set, an MPS daemon started), write the claim's CDI spec file
(with what the configs add, and a share's gpushare environment), record the claim and
what was applied in the checkpoint, and answer the CDI device IDs of exactly those devices. Anything
wrong fails that claim alone, with a message naming the device or the config's entry, key and value
(what was applied by then is undone); the other claims of the call are prepared.

A device published before it exists (a MIG device of ``labeller.dra.dynamicMig``: ``DraDevice.make``)
is made first, after the holds and before the configs, by the vendor's ``DeviceMaker``, each step
recorded in the driver's ledger (``labeller.apps.draplugin.ledger``: the intent, then what was made); the
claim's CDI spec names the device made (its GPU's and instances' device nodes). A claim that fails
after that has what it made undone; unpreparing undoes it after the configs. At start, what was made
for a claim the checkpoint does not hold (a prepare that never completed) is undone, and nothing else.

A claim already in the checkpoint is answered from it without reading the API (the kubelet calls
again after a restart, and for every pod that shares the claim): it is prepared once. Unpreparing
undoes what its configs applied (the last claim time-slicing a GPU sets it back to Default, its MPS
daemons stop; with no record, whatever the vendor still finds of the claim, such as an MPS daemon a
killed plugin started and never recorded), then removes the spec file and the checkpoint entry;
what cannot be undone fails the unprepare, files kept, for the kubelet to try again. A claim
unknown to the checkpoint is fine (already unprepared, or prepared by a process that died before
writing it: its spec file, named by the UID, is removed all the same). Only regular files are
removed: a symlink or anything else at a claim's file name is left alone and logged. The kubelet
unprepares a shared claim after its last pod on the node.

Calls for different claims run concurrently; calls for the same claim one at a time.
"""

from __future__ import annotations

import dataclasses
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labeller.base import ownfiles
from labeller.model.config import Config
from labeller.apps.draplugin import shares
from labeller.apps.draplugin.cdi import ClaimSpecs, SpecDevice, cdi_id, cdi_name, claim_spec
from labeller.apps.draplugin.checkpoint import UID, AppliedConfig, Checkpoint, PreparedClaim, PreparedDevice
from labeller.apps.draplugin.configs import DriverConfigs, Group
from labeller.apps.draplugin.ledger import Entry, Ledger
from labeller.model.labels import is_dns_label, is_dns_subdomain
from labeller.model.offer import PhysicalDevice
from labeller.model.resourceslices import DraDevice
from labeller.model.vendor import Vendor
from labeller.model.sharing import MEMORY
from labeller.model.vendor.dra import ConfigRefused, DeviceMaker, MakeRefused, Share
from labeller.base.log import get_logger

log = get_logger(__name__)

Obj = dict[str, Any]
ClaimReader = Callable[[str, str], Obj]  # (namespace, name) -> the ResourceClaim; raises on failure
LOCK_STRIPES = 64


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        """As a log line or an error may show it: bounded, and one line whatever the kubelet sent."""
        return f"{_shown(self.namespace, 63)}/{_shown(self.name, 253)}"


def _shown(text: str, limit: int) -> str:
    return text[:limit].encode("unicode_escape").decode("ascii")


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
        raise ClaimError(f"claim {claim}: {claim.uid[:128]!r} is not a UID")


def _check_names(claim: ClaimRef) -> None:
    """The namespace and name go into an API path: Kubernetes names only."""
    if not is_dns_label(claim.namespace):
        raise ClaimError(f"claim {claim}: namespace {claim.namespace[:63]!r} is not a DNS-1123 label")
    if not is_dns_subdomain(claim.name):
        raise ClaimError(f"claim {claim}: name {claim.name[:253]!r} is not a DNS-1123 subdomain")


Variant = Callable[[str], "tuple[str, str] | None"]  # device name -> (group, variant): DraDevice.exclusive


class Holds:
    """Which prepared claims hold each device of the driver: what the checkpoint holds at start,
    then every claim prepared or unprepared since. A device held exclusively by one claim is refused
    to another, unless both allocations may share it (both carry a ``shareID``: consumable capacity
    of a device that allows multiple allocations), and the shares of a device never consume more
    than its capacities (``shares.over_capacity``); an admin-access allocation holds nothing and is
    refused nothing, as upstream's scheduler counts it. Devices of one group (``variant``: an AMD
    GPU's partitions) are refused to a claim while another claim holds one of another variant (a
    partition of another compute partition mode)."""

    def __init__(self, claims: Iterable[PreparedClaim], variant: Variant | None = None) -> None:
        self._lock = threading.Lock()
        self._variant: Variant = variant or (lambda name: None)
        self._claims: dict[str, PreparedClaim] = {}
        # device -> (claim UID, share ID) -> that allocation of the device
        self._holders: dict[str, dict[tuple[str, str | None], PreparedDevice]] = {}
        for claim in claims:
            self._put(claim)

    def take(self, claim: PreparedClaim, capacities: Mapping[str, Mapping[str, int]] | None = None) -> list[str]:
        """Hold ``claim``'s devices for it (replacing what it held), or, when another claim holds one
        of them or its shares would pass a device's ``capacities`` (device -> capacity -> total), nothing:
        why, one line per device."""
        with self._lock:
            conflicts = []
            for device in claim.devices:
                others = self._conflicting(claim.uid, device)
                if others:
                    more = f" and {len(others) - 1} other(s)" if len(others) > 1 else ""
                    same = any(d.device == device.device for d in others[0].devices)
                    what = (f"device {device.device} is prepared for claim {others[0]} ({others[0].uid}){more}, and "
                            "the allocations do not both allow sharing it" if same else
                            f"device {device.device}: its GPU is held in another mode ({self._mode(others[0])}) by "
                            f"claim {others[0]} ({others[0].uid}){more}")
                    conflicts.append(what)
            for name, totals in sorted((capacities or {}).items()):
                mine = [d for d in claim.devices if d.device == name and not d.admin]
                theirs = [(self._claims[uid], held) for (uid, _), held in self._holders.get(name, {}).items()
                          if uid != claim.uid]
                conflicts += shares.over_capacity(name, mine, theirs, totals)
            if not conflicts:
                self._put(claim)
            return list(dict.fromkeys(conflicts))

    def _conflicting(self, uid: str, device: PreparedDevice) -> list[PreparedClaim]:
        holders = self._holders.get(device.device, {})
        found = dict.fromkeys(other for (other, _), held in holders.items()
                              if other != uid and not _may_share(device, held))
        variant = self._variant(device.device)
        if variant is not None and not device.admin:
            for name, others in self._holders.items():
                theirs = self._variant(name) if name != device.device else None
                if theirs is not None and theirs[0] == variant[0] and theirs[1] != variant[1]:
                    found.update(dict.fromkeys(other for (other, _), held in others.items()
                                               if other != uid and not held.admin))
        return [self._claims[other] for other in found]

    def _mode(self, claim: PreparedClaim) -> str:
        return ", ".join(sorted({v[1] for d in claim.devices if (v := self._variant(d.device)) is not None}))

    def restore(self, uid: str, claim: PreparedClaim | None) -> None:
        """What ``uid`` holds is ``claim``'s devices again (a prepare that failed after ``take``), or nothing."""
        with self._lock:
            if claim is None:
                self._drop(uid)
            else:
                self._put(claim)

    def release(self, uid: str) -> None:
        with self._lock:
            self._drop(uid)

    def others(self, uid: str, device: str) -> tuple[str, ...]:
        """The other claims (UIDs) that hold ``device``, admin access left out."""
        with self._lock:
            return tuple(dict.fromkeys(other for (other, _), held in self._holders.get(device, {}).items()
                                       if other != uid and not held.admin))

    def claim(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(uid)

    def holding(self, device: str) -> bool:
        """A prepared claim holds ``device`` (admin access included)."""
        with self._lock:
            return device in self._holders

    def _put(self, claim: PreparedClaim) -> None:
        self._drop(claim.uid)
        self._claims[claim.uid] = claim
        for device in claim.devices:
            self._holders.setdefault(device.device, {})[(claim.uid, device.share_id)] = device

    def _drop(self, uid: str) -> None:
        claim = self._claims.pop(uid, None)
        for device in claim.devices if claim is not None else ():
            holders = self._holders[device.device]
            holders.pop((uid, device.share_id), None)
            if not holders:
                del self._holders[device.device]


def _may_share(wanted: PreparedDevice, held: PreparedDevice) -> bool:
    return wanted.admin or held.admin or (wanted.share_id is not None and held.share_id is not None)


class Preparer:
    def __init__(self, driver: str, pool: str, vendor: Vendor, read_claim: ClaimReader, checkpoint: Checkpoint,
                 specs: ClaimSpecs, devices: Callable[[], Devices], configs: DriverConfigs,
                 ledger: Ledger | None = None, maker: Callable[[], DeviceMaker] | None = None) -> None:
        self.driver, self.pool, self.vendor = driver, pool, vendor
        self.read_claim, self.checkpoint, self.specs, self.devices = read_claim, checkpoint, specs, devices
        self.configs = configs
        self.ledger, self._make_maker = ledger, maker
        self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]
        prepared = checkpoint.claims()
        self.holds = Holds(prepared, self._exclusive)
        self._reconcile({claim.uid for claim in prepared})
        for claim in prepared:
            for applied in claim.configs:  # what a previous process applied: known again, its daemons found
                try:
                    configs.handler.recover(claim.uid, applied.applied)
                except Exception:  # a bug here must not keep the driver from serving its other claims
                    log.exception("what a prepared claim's config applied could not be recovered",
                                  reason="config-not-recovered", driver=driver, uid=claim.uid)

    def _lock(self, uid: str) -> threading.Lock:
        return self._stripes[zlib.crc32(uid.encode()) % LOCK_STRIPES]

    def prepare(self, claim: ClaimRef) -> PreparedClaim:
        """Prepare ``claim`` (once); ClaimError says why it cannot be."""
        _check_uid(claim)
        _check_names(claim)
        with self._lock(claim.uid):
            try:
                done = self.checkpoint.get(claim.uid)
                if done is not None and self.specs.present(claim.uid):
                    return done
            except OSError as exc:
                raise ClaimError(f"{self.driver}: claim {claim}: cannot read its checkpoint "
                                 f"{self.checkpoint.path(claim.uid)}: {exc.strerror or exc}") from None
            if done is None:
                self.holds.release(claim.uid)  # its record was moved aside: it holds nothing now
            now = self.devices()
            prepared, groups = self._prepare(claim, now)
            totals = {d.device: shares.capacities(now.by_name[d.device]) for d in prepared.devices if d.consumed}
            conflicts = self.holds.take(prepared, totals)
            if conflicts:
                raise ClaimError(f"{self.driver}: claim {claim}: {'; '.join(conflicts)}")
            made: dict[str, PhysicalDevice] = {}
            try:
                made = self._make(claim, prepared, now)
                applied = self._apply(claim, prepared, groups, now)
                prepared = dataclasses.replace(prepared, configs=tuple(applied))
                try:
                    self._write(claim, prepared, now, made)
                except ClaimError:
                    self._undo(claim, applied, quiet=True)
                    raise
            except ClaimError:
                self._unmake_quietly(claim, made)
                self.holds.restore(claim.uid, done)
                raise
            if applied:
                self.holds.restore(claim.uid, prepared)  # with what it applied, for unprepare
            return prepared

    def _apply(self, claim: ClaimRef, prepared: PreparedClaim, groups: list[Group], now: Devices
               ) -> list[AppliedConfig]:
        """Apply each config to its devices (with what the claim holds of those it shares); ClaimError
        (what was applied undone) when one cannot be, or when a device no config covers cannot be
        given without one (``ConfigHandler.blocked``)."""
        covered = {name for group in groups for name in group.devices}
        plain = [now.by_name[name] for name in dict.fromkeys(d.device for d in prepared.devices if not d.admin)
                 if name not in covered]
        if (why := self.configs.blocked(claim.uid, plain)) is not None:
            raise ClaimError(f"{self.driver}: claim {claim}: {why}")
        held = {d.device: self.holds.others(claim.uid, d.device) for d in prepared.devices if d.consumed}
        share_of = {name: Share(sum(shares.amount(d, MEMORY) for d in prepared.devices if d.device == name), others)
                    for name, others in held.items()}
        done: list[AppliedConfig] = []
        for group in groups:
            try:
                applied = self.configs.handler.apply(claim.uid, group.config.config,
                                                     [now.by_name[name] for name in group.devices],
                                                     {n: share_of[n] for n in group.devices if n in share_of})
            except ConfigRefused as exc:
                self._undo(claim, done, quiet=True)
                raise ClaimError(f"{self.driver}: claim {claim}: {group.config.where}: {exc}") from None
            done.append(AppliedConfig(group.devices, applied))
        return done

    def _undo(self, claim: ClaimRef, applied: list[AppliedConfig] | tuple[AppliedConfig, ...], quiet: bool) -> None:
        """Undo ``applied``, last first; ClaimError naming what could not be undone (with ``quiet``: logged)."""
        problems = []
        for config in reversed(applied):
            try:
                self.configs.handler.undo(claim.uid, config.applied)
            except ConfigRefused as exc:
                problems.append(f"{config.applied.record.get('kind')} of {', '.join(config.devices)}: {exc}")
        if problems and quiet:
            log.error("a config applied to a claim that failed was not undone", reason="config-not-undone",
                      driver=self.driver, claim=str(claim), uid=claim.uid, error="; ".join(problems))
        elif problems:
            raise ClaimError(f"{self.driver}: claim {claim}: cannot undo its configs: {'; '.join(problems)}")

    def _write(self, claim: ClaimRef, prepared: PreparedClaim, now: Devices,
               made: Mapping[str, PhysicalDevice] | None = None) -> None:
        """The claim's CDI spec file (a device made for it: the one made), then its checkpoint record;
        ClaimError (neither written) when one cannot be."""
        extra: dict[str, list[Mapping[str, Any]]] = {}
        for config in prepared.configs:
            for name in config.devices if config.applied.edits else ():
                extra.setdefault(name, []).append(config.applied.edits)
        memory = now.config.sharing.memory
        per_share, claim_env = shares.environment(prepared.devices, now.by_name, memory.unit_bytes if memory else None)
        devices = []
        for held in prepared.devices:
            edits = list(extra.get(held.device, ()))
            if held.key in per_share:
                edits.append({"env": [f"{key}={value}" for key, value in sorted(per_share[held.key].items())]})
            device = now.by_name[held.device]
            if made and held.device in made:
                device = dataclasses.replace(device, physical=made[held.device])
            devices.append(SpecDevice(cdi_name(claim.uid, held.device, held.share_id), device, tuple(edits)))
        try:
            self.specs.write(claim.uid, claim_spec(self.vendor, devices, now.config, now.host_root, claim_env))
        except (OSError, ValueError) as exc:
            raise ClaimError(f"{self.driver}: claim {claim}: cannot write its CDI spec "
                             f"{self.specs.path(claim.uid)}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            self.checkpoint.add(prepared)
        except OSError as exc:
            try:
                self.specs.remove(claim.uid)
            except OSError:
                pass  # the checkpoint's error is the one to tell
            raise ClaimError(f"{self.driver}: claim {claim}: cannot write its checkpoint "
                             f"{self.checkpoint.path(claim.uid)}: {exc.strerror or exc}") from None

    def _prepare(self, claim: ClaimRef, now: Devices) -> tuple[PreparedClaim, list[Group]]:
        """What preparing ``claim`` answers, from its allocation, and the configs its devices get;
        ClaimError when it cannot be prepared."""
        allocation, results = self._allocated(claim)
        if not results:
            raise ClaimError(f"{self.driver}: claim {claim}: no device of {self.driver} allocated")
        problems: list[str] = []
        chosen: dict[tuple[str, str | None], list[Obj]] = {}
        for result in results:
            name = str(result.get("device", ""))
            pool = str(result.get("pool", ""))
            device = now.by_name.get(name)
            share_id = result.get("shareID")
            if pool != self.pool:
                problems.append(f"device {name} is in pool {pool}, not this node's ({self.pool})")
            elif device is None:
                problems.append(f"device {name} is not on this node")
            elif not now.healthy(device.health_key):
                problems.append(f"device {name} is unhealthy")
            elif share_id is not None and not (isinstance(share_id, str) and UID.fullmatch(share_id)):
                problems.append(f"device {name}: shareID {str(share_id)[:64]!r} is not a UID")
            elif (problem := shares.problem(name, result, device)) is not None:
                problems.append(problem)
            else:
                chosen.setdefault((name, share_id), []).append(result)
        if problems:
            raise ClaimError(f"{self.driver}: claim {claim}: {'; '.join(problems)}")
        try:
            groups = self.configs.groups(allocation, results, now.by_name)
        except ConfigRefused as exc:
            raise ClaimError(f"{self.driver}: claim {claim}: {exc}") from None
        devices = tuple(self._device(claim.uid, name, share_id, allocated)
                        for (name, share_id), allocated in chosen.items())
        return PreparedClaim(claim.uid, claim.namespace, claim.name, devices), groups

    def _device(self, uid: str, name: str, share_id: str | None, allocated: list[Obj]) -> PreparedDevice:
        """One device, or one share of it, as prepared, from its allocation results in the claim (a
        share has one): it may be shared when it is a share, it is admin access when every result is."""
        consumed = shares.consumed(allocated[0]) or () if share_id is not None else ()
        return PreparedDevice(tuple(str(r.get("request", "")) for r in allocated), self.pool, name,
                              (cdi_id(uid, name, share_id),), share_id,
                              all(r.get("adminAccess") is True for r in allocated), consumed)

    def _allocated(self, claim: ClaimRef) -> tuple[Obj, list[Obj]]:
        """The claim's allocation and this driver's results in it; ClaimError when it cannot be read or
        is not allocated."""
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
        if not isinstance(allocation, dict):
            raise ClaimError(f"{self.driver}: claim {claim}: status.allocation is not an object")
        results = (allocation.get("devices") or {}).get("results") or []
        return allocation, [r for r in results if isinstance(r, dict) and r.get("driver") == self.driver]

    # --- devices made at prepare ------------------------------------------------------------------

    def _exclusive(self, name: str) -> tuple[str, str] | None:
        device = self.devices().by_name.get(name)
        return device.exclusive if device is not None else None

    @property
    def maker(self) -> DeviceMaker | None:
        """The vendor's maker, on the host's current handles (a simulated profile edited is a new NVML)."""
        return self._make_maker() if self._make_maker is not None else None

    def _make(self, claim: ClaimRef, prepared: PreparedClaim, now: Devices) -> dict[str, PhysicalDevice]:
        """Make the claim's devices that do not exist yet, each recorded in the ledger; by name, the unit
        each is. ClaimError (what this call made undone) when one cannot be made."""
        made: dict[str, PhysicalDevice] = {}
        try:
            for held in prepared.devices:
                device = now.by_name[held.device]
                if device.make is not None:
                    made[device.name] = self._make_one(claim, device)
        except ClaimError:
            self._unmake_quietly(claim, made)
            raise
        return made

    def _make_one(self, claim: ClaimRef, device: DraDevice) -> PhysicalDevice:
        maker, ledger = self.maker, self.ledger
        if maker is None or ledger is None or device.make is None:
            raise ClaimError(f"{self.driver}: claim {claim}: device {device.name} is made at prepare, and this "
                             "driver makes no device")
        where = f"{self.driver}: claim {claim}: device {device.name}"
        old = ledger.get(device.name)
        if old is not None and old.claim != claim.uid:
            raise ClaimError(f"{where} is made for claim {old.claim}")
        try:
            if old is not None:  # what an earlier prepare of the claim made and lost (its CDI spec went)
                self._unmake(old)
            ledger.begin(device.name, claim.uid, device.make)
        except (MakeRefused, OSError) as exc:
            raise ClaimError(f"{where}: cannot record it: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            result = maker.make(device)
        except MakeRefused as exc:
            self._forget(device.name)
            raise ClaimError(f"{self.driver}: claim {claim}: {exc}") from None
        try:
            ledger.done(device.name, result.record)
        except OSError as exc:
            self._unmake_quietly(claim, {device.name: result.physical})
            raise ClaimError(f"{where}: cannot record it: {exc.strerror or exc}") from None
        return result.physical

    def _unmake(self, entry: Entry) -> None:
        """Undo what ``entry`` records and forget it; MakeRefused or OSError (kept) when it cannot be."""
        maker = self.maker
        if maker is None:
            raise MakeRefused("this driver makes no device")
        if entry.made is not None:
            maker.unmake(entry.made)
        else:
            maker.abandon(entry.plan)
        assert self.ledger is not None  # an entry comes from it
        self.ledger.remove(entry.device)

    def _forget(self, device: str) -> None:
        """Forget an intent that made nothing (logged where the record cannot be removed: a restart undoes it)."""
        try:
            if self.ledger is not None:
                self.ledger.remove(device)
        except OSError as exc:
            log.error("the record of a device that was not made cannot be removed", reason="ledger-not-removed",
                      driver=self.driver, device=device, error=str(exc))

    def _unmake_quietly(self, claim: ClaimRef, made: Mapping[str, PhysicalDevice]) -> None:
        """Undo what a prepare that failed made; what cannot be undone is logged (and kept: a restart retries)."""
        for name in made:
            entry = self.ledger.get(name) if self.ledger is not None else None
            if entry is None:
                continue
            try:
                self._unmake(entry)
            except (MakeRefused, OSError) as exc:
                log.error("a device made for a claim that failed was not undone", reason="device-not-undone",
                          driver=self.driver, claim=str(claim), device=name, error=str(exc))

    def _reconcile(self, prepared: set[str]) -> None:
        """At start: undo what was made for claims the checkpoint does not hold (prepares that never
        completed), and records of intents that were never done."""
        for entry in self.ledger.entries() if self.ledger is not None else ():
            if entry.claim in prepared and entry.made is not None:
                continue
            try:
                self._unmake(entry)
            except (MakeRefused, OSError) as exc:
                log.error("a device made for a claim that was never prepared could not be undone; retried at the "
                          "next start", reason="device-not-undone", driver=self.driver, device=entry.device,
                          uid=entry.claim, error=str(exc))
                continue
            log.info("a device made for a claim that was never prepared undone", reason="made-unprepared",
                     driver=self.driver, device=entry.device, uid=entry.claim)

    def unprepare(self, claim: ClaimRef) -> None:
        """Undo ``prepare`` (nothing to do is fine); ClaimError when a file cannot be removed. A file
        of the claim that is not a regular file is not the plugin's: left alone, and logged."""
        _check_uid(claim)
        with self._lock(claim.uid):
            prepared = self.holds.claim(claim.uid)
            if prepared is not None:
                self._undo(claim, prepared.configs, quiet=False)
            else:
                try:
                    self.configs.forget(claim.uid)
                except ConfigRefused as exc:
                    raise ClaimError(f"{self.driver}: claim {claim}: cannot undo its configs: {exc}") from None
            for entry in self.ledger.of_claim(claim.uid) if self.ledger is not None else ():
                try:
                    self._unmake(entry)
                except (MakeRefused, OSError) as exc:
                    raise ClaimError(f"{self.driver}: claim {claim}: cannot undo device {entry.device}: "
                                     f"{getattr(exc, 'strerror', None) or exc}") from None
            for what, remove in (("CDI spec", self.specs.remove), ("checkpoint record", self.checkpoint.remove)):
                try:
                    remove(claim.uid)
                except ownfiles.NotOurs as exc:
                    log.warning(f"the claim's {what} is not a file the plugin wrote; left alone",
                                reason="not-ours", driver=self.driver, claim=str(claim), uid=claim.uid, error=str(exc))
                except OSError as exc:
                    raise ClaimError(f"{self.driver}: claim {claim}: cannot remove its {what}: "
                                     f"{exc.strerror or exc}") from None
            self.holds.release(claim.uid)
