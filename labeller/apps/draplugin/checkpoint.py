"""The claims one driver has prepared, on disk: ``<plugins dir>/<driver>/claims/<claim UID>.json``.

One small file per prepared claim, written atomically (a temporary file, then a rename) before
NodePrepareResources answers and removed after NodeUnprepareResources cleaned up, so a plugin
killed at any moment restarts knowing every claim it answered for: a repeated prepare is answered
from it, an unprepare after a restart finds what the previous process prepared, and the devices
prepared claims hold are known again (``Preparer``'s exclusivity). A prepare reads one file: it
costs the same with one claim prepared on the node or a thousand.

The files are not fsynced: a killed process leaves them in the page cache, and a node that loses
power restarts its pods, whose claims the kubelet prepares again (the CDI spec files in /var/run
are gone too). An fsync would cost every prepare milliseconds on a network disk for nothing.

Nothing in the directory is trusted (``labeller.base.ownfiles``): ``<driver>`` and ``claims`` are never
followed through a symlink, a record is opened without following a link and without waiting (a
FIFO), must be a regular file of at most ``RECORD_LIMIT`` bytes, and must say exactly what this
plugin would have answered for that claim: its UID, driver, this node's pool, well-formed names, and
for each device the one CDI device ID the plugin makes for that claim and device (``cdi_id``).
Anything else (a FIFO, a directory, a link, a huge file, bad JSON, a foreign CDI ID such as
``nvidia.com/gpu=all``) is moved aside (``<uid>.json.bad``, or ``.bad.1``... when that name is taken)
with a warning, and the claim is prepared again from the API. Temporary files a killed plugin left
(``.<uid>.json.*.tmp``) are removed at start.

Record format, version 4 (version 3, without ``consumedCapacity`` and with a shared device's CDI ID
not naming its share, version 2, without ``configs`` either, and version 1, without ``shareID`` and
``adminAccess`` either, are still read: nothing was applied, and a version 1 claim's devices are
exclusive)::

    {"version": 4, "driver": "gpu.nvidia.com", "uid": "<claim UID>", "namespace": "ns", "name": "claim",
     "devices": [{"requests": ["gpu"], "pool": "<node>", "device": "gpu-0",
                  "cdiDeviceIDs": ["k8s.gpu-labeller.io/gpu=<claim UID>-gpu-0-<share ID>"],
                  "shareID": "<share ID>", "adminAccess": false, "consumedCapacity": {"memory": "4Gi"}}],
     "configs": [{"devices": ["gpu-0"], "applied": {"kind": "GpuConfig", "strategy": "TimeSlicing",
                                                    "interval": "Long", "gpus": ["GPU-..."]}}]}

A device allocated as a share (a ``shareID``: consumable capacity) is listed once per share, with
the capacity the share consumes; its CDI device names the share, so two shares of one device in one
claim are two CDI devices.

``configs`` says what each opaque config applied to which of the claim's devices, as the vendor's
``ConfigHandler.apply`` recorded it (and ``ConfigApi.read_applied`` reads it back, or the record is
not the plugin's): unprepare undoes it, and a restarted plugin recovers it (an MPS daemon found or
started again).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labeller.base import ownfiles
from labeller.model import quantity
from labeller.apps.draplugin.cdi import cdi_id
from labeller.model.labels import is_dns_label, is_dns_subdomain
from labeller.model.vendor.dra import Applied
from labeller.base.log import get_logger

log = get_logger(__name__)

DIRECTORY = "claims"
VERSION = 4
READABLE = (1, 2, 3, 4)
RECORD_LIMIT = 64 * 1024  # bytes; a claim of 32 devices (the API's most) is under 8 KiB
UID = re.compile(r"[0-9A-Za-z][-0-9A-Za-z]{0,127}")
_RECORD = re.compile(rf"({UID.pattern})\.json")
_STALE = re.compile(rf"\.{UID.pattern}\.json\..+\.tmp")
# a capacity's name: a C identifier, optionally after a DNS subdomain and a slash
_CAPACITY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?/)?[A-Za-z_][A-Za-z0-9_]{0,31}")
# a request's name, or "<request>/<subrequest>" for one of a firstAvailable list
_REQUEST = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?")


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a prepared claim, as NodePrepareResources answered it."""

    requests: tuple[str, ...]  # the claim's requests it was allocated for
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None  # set when every allocation of the device to the claim may share it
    admin: bool = False  # allocated for admin access: it holds the device from no one
    # what a share consumes of the device's capacities, as the allocation says: (capacity, quantity), by name
    consumed: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> tuple[str, str | None]:
        """What the claim holds: the device, or one share of it."""
        return self.device, self.share_id


@dataclass(frozen=True)
class AppliedConfig:
    """What one opaque config applied to some devices of the claim (by name)."""

    devices: tuple[str, ...]
    applied: Applied


# (a record's applied config, the claim's UID) -> it, read back by the vendor; ValueError when it is not one
ReadApplied = Callable[[Mapping[str, Any], str], Applied]


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    configs: tuple[AppliedConfig, ...] = ()

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def document(self, driver: str) -> dict[str, Any]:
        return {"version": VERSION, "driver": driver, "uid": self.uid, "namespace": self.namespace,
                "name": self.name,
                "devices": [{"requests": list(d.requests), "pool": d.pool, "device": d.device,
                             "cdiDeviceIDs": list(d.cdi_ids), "shareID": d.share_id, "adminAccess": d.admin,
                             "consumedCapacity": dict(d.consumed)}
                            for d in self.devices],
                "configs": [{"devices": list(c.devices), "applied": dict(c.applied.record)} for c in self.configs]}


class BadRecord(ValueError):
    """A record that is not what this plugin writes; the message says what is wrong with it."""


def _field(doc: dict[str, Any], key: str, kind: type, where: str = "") -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRecord(f"{where}{key} is {json.dumps(value)[:80]}, not a {kind.__name__}")
    return value


def parse(data: bytes, uid: str, driver: str, pool: str, read_applied: ReadApplied | None = None) -> PreparedClaim:
    """The claim a record holds; BadRecord unless it is exactly what this plugin writes for ``uid``."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, nesting beyond the parser's depth
        raise BadRecord(f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict):
        raise BadRecord("not a JSON object")
    if doc.get("version") not in READABLE:
        raise BadRecord(f"version {json.dumps(doc.get('version'))[:40]}, not one of {list(READABLE)}")
    if doc.get("driver") != driver or doc.get("uid") != uid:
        raise BadRecord(f"it is for {json.dumps(doc.get('uid'))[:80]} of driver {json.dumps(doc.get('driver'))[:80]}")
    namespace, name = _field(doc, "namespace", str), _field(doc, "name", str)
    if not is_dns_label(namespace) or not is_dns_subdomain(name):
        raise BadRecord(f"{namespace[:80]!r}/{name[:80]!r} is not a claim's name")
    entries = _field(doc, "devices", list)
    if not entries:
        raise BadRecord("no devices")
    devices = [_device(entry, uid, pool, doc["version"], f"devices[{i}].") for i, entry in enumerate(entries)]
    if len({d.key for d in devices}) != len(devices):
        raise BadRecord("a device (or a share of one) listed twice")
    configs = _configs(doc, uid, {d.device for d in devices}, read_applied) if doc["version"] >= 3 else ()
    return PreparedClaim(uid, namespace, name, tuple(devices), configs)


def _configs(doc: dict[str, Any], uid: str, names: set[str], read: ReadApplied | None) -> tuple[AppliedConfig, ...]:
    out = []
    for i, entry in enumerate(_field(doc, "configs", list)):
        where = f"configs[{i}]."
        if not isinstance(entry, dict) or set(entry) != {"devices", "applied"}:
            raise BadRecord(f"{where[:-1]} is not a JSON object of devices and applied")
        devices = _field(entry, "devices", list, where)
        if not devices or not all(isinstance(d, str) and d in names for d in devices):
            raise BadRecord(f"{where}devices {json.dumps(devices)[:120]} are not the claim's")
        applied = _field(entry, "applied", dict, where)
        if read is None:
            raise BadRecord(f"{where}applied: the driver applies no config")
        try:
            out.append(AppliedConfig(tuple(devices), read(applied, uid)))
        except ValueError as exc:
            raise BadRecord(f"{where}applied: {str(exc)[:200]}") from None
    return tuple(out)


def _device(entry: Any, uid: str, pool: str, version: int, where: str) -> PreparedDevice:
    if not isinstance(entry, dict):
        raise BadRecord(f"{where[:-1]} is not a JSON object")
    device = _field(entry, "device", str, where)
    if not is_dns_label(device):
        raise BadRecord(f"{where}device {device[:80]!r} is not a device's name")
    if _field(entry, "pool", str, where) != pool:
        raise BadRecord(f"{where}pool {entry['pool'][:80]!r} is not this node's ({pool})")
    requests = _field(entry, "requests", list, where)
    if not requests or not all(isinstance(r, str) and _REQUEST.fullmatch(r) for r in requests):
        raise BadRecord(f"{where}requests {json.dumps(requests)[:80]} are not requests' names")
    share_id, admin = None, False
    consumed: tuple[tuple[str, str], ...] = ()
    if version >= 2:
        share_id = entry.get("shareID")
        if share_id is not None and not (isinstance(share_id, str) and UID.fullmatch(share_id)):
            raise BadRecord(f"{where}shareID {json.dumps(share_id)[:80]} is not a UID")
        admin = _field(entry, "adminAccess", bool, where)
    if version >= 4:
        consumed = _consumed(_field(entry, "consumedCapacity", dict, where), where)
    ids = _field(entry, "cdiDeviceIDs", list, where)
    if ids != [cdi_id(uid, device, share_id if version >= 4 else None)]:
        raise BadRecord(f"{where}cdiDeviceIDs {json.dumps(ids)[:120]} are not the plugin's for {device}")
    return PreparedDevice(tuple(requests), pool, device, tuple(ids), share_id, admin, consumed)


def _consumed(value: dict[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    """A share's consumed capacities: capacity names to quantities of at least 0."""
    for name, amount in value.items():
        parsed = quantity.parse(amount) if isinstance(amount, str) else None
        if not _CAPACITY.fullmatch(name) or parsed is None or parsed < 0:
            raise BadRecord(f"{where}consumedCapacity {json.dumps(value)[:120]} is not capacities and quantities")
    return tuple(sorted(value.items()))


class Checkpoint:
    """The prepared claims of one driver, a file each in ``<plugins dir>/<driver>/claims``. Calls for
    one claim must not overlap (the preparer holds the claim's lock); calls for different claims may.
    OSError from the constructor when the directory cannot be made or is not one."""

    def __init__(self, plugins_dir: Path, driver: str, pool: str, read_applied: ReadApplied | None = None) -> None:
        self.plugins_dir, self.driver, self.pool, self.read_applied = plugins_dir, driver, pool, read_applied
        self.directory = plugins_dir / driver / DIRECTORY
        with self._open() as fd:
            stale = ownfiles.remove_stale(fd, _STALE)
        if stale:
            log.info("temporary checkpoint files of a killed plugin removed", driver=driver,
                     path=str(self.directory), files=sorted(stale))

    @contextmanager
    def _open(self) -> Iterator[int]:
        with ownfiles.directory(self.plugins_dir, self.driver, DIRECTORY, mode=0o700) as fd:
            yield fd

    def path(self, uid: str) -> Path:
        return self.directory / f"{uid}.json"

    def get(self, uid: str) -> PreparedClaim | None:
        """The claim's record; None when there is none, or when it was not one this plugin wrote
        (moved aside, with a warning). OSError when the directory or the file cannot be read."""
        with self._open() as fd:
            return self._get(fd, uid)

    def _get(self, fd: int, uid: str) -> PreparedClaim | None:
        found = ownfiles.read_record(fd, f"{uid}.json", RECORD_LIMIT,
                                     lambda data: parse(data, uid, self.driver, self.pool, self.read_applied),
                                     (BadRecord,))
        if not isinstance(found, ownfiles.MovedAside):
            return found
        log.warning("a checkpoint record that is not the plugin's; moved aside, the claim is prepared again",
                    reason="bad-checkpoint", driver=self.driver, uid=uid, moved_to=str(self.directory / found.name),
                    error=found.problem)
        return None

    def claims(self) -> list[PreparedClaim]:
        """Every prepared claim on record (bad records moved aside)."""
        with self._open() as fd:
            uids = [m.group(1) for name in ownfiles.names(fd) if (m := _RECORD.fullmatch(name))]
            return [claim for uid in sorted(uids) if (claim := self._get(fd, uid)) is not None]

    def add(self, claim: PreparedClaim) -> None:
        """Record ``claim`` (OSError when it cannot be written: then nothing changed)."""
        text = json.dumps(claim.document(self.driver), separators=(",", ":")) + "\n"
        with self._open() as fd:
            ownfiles.replace(fd, f"{claim.uid}.json", text.encode(), 0o600)

    def remove(self, uid: str) -> None:
        """Forget the claim; ``ownfiles.NotOurs`` (left alone) when its name holds something else than a record."""
        with self._open() as fd:
            ownfiles.remove(fd, f"{uid}.json")

