"""What one driver made for its claims, on disk: ``<plugins dir>/<driver>/made/<device>.json``.

A device published before it exists (a MIG device of ``labeller.dra.dynamicMig``) is made at prepare
and undone at unprepare by the vendor's ``DeviceMaker``. Each is recorded here, so that a restarted
plugin undoes what it made for claims it never finished preparing, and nothing else:

1. before making, ``begin`` writes the intent: the device, the claim and the plan (``DraDevice.make``:
   the GPU, the profile, the placement);
2. once made, ``done`` adds what the maker recorded (the GPU and compute instance ids, the MIG UUID);
3. at unprepare, once undone, ``remove``.

At start (``Preparer``) a record whose claim is not in the checkpoint was made for a prepare that
never completed: what it made is undone (``DeviceMaker.unmake``, or ``abandon`` for an intent that
was never done), and the record removed; so none is leaked, and a MIG device with no record (someone
else's) is never touched. The records' names (``names``) are the devices the plugin made, which
publish as the devices they were made for (``DraState.made``).

The directory is made with the first record. One small file per device, written atomically without
fsync (as the checkpoint's, see there).
Nothing in the directory is trusted (``labeller.base.ownfiles``): a record that is not a regular file of
at most ``RECORD_LIMIT`` bytes holding exactly what this plugin writes is moved aside
(``.bad``) with a warning; temporary files a killed plugin left are removed.

Record format, version 1::

    {"version": 1, "device": "gpu-2-mig-1g5gb-19-0", "claim": "<claim UID>",
     "plan": {"gpu": "GPU-...", "profile": "1g.5gb", "profileId": 19, "start": 0, "size": 1, "slices": 1},
     "made": {"gpu": "GPU-...", "gi": 1, "ci": 0, "uuid": "MIG-..."}}     ("made": null until done)
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labeller.base import ownfiles
from labeller.apps.draplugin.checkpoint import UID
from labeller.model.labels import is_dns_label
from labeller.base.log import get_logger

log = get_logger(__name__)

DIRECTORY = "made"
VERSION = 1
RECORD_LIMIT = 16 * 1024
_RECORD = re.compile(r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)\.json")
_STALE = re.compile(r"\..+\.json\..+\.tmp")


@dataclass(frozen=True)
class Entry:
    device: str
    claim: str  # the UID of the claim it was made for
    plan: Mapping[str, Any]  # what was to be made (DraDevice.make)
    made: Mapping[str, Any] | None = None  # what the maker recorded once it was made

    def document(self) -> dict[str, Any]:
        return {"version": VERSION, "device": self.device, "claim": self.claim, "plan": dict(self.plan),
                "made": None if self.made is None else dict(self.made)}


class BadEntry(ValueError):
    """A record that is not what this plugin writes."""


def parse(data: bytes, device: str) -> Entry:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BadEntry(f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict) or set(doc) != {"version", "device", "claim", "plan", "made"}:
        raise BadEntry("not a record of what the plugin made")
    if doc["version"] != VERSION or doc["device"] != device:
        raise BadEntry(f"version {json.dumps(doc['version'])[:20]} for {json.dumps(doc['device'])[:80]}")
    if not isinstance(doc["claim"], str) or not UID.fullmatch(doc["claim"]):
        raise BadEntry(f"claim {json.dumps(doc['claim'])[:80]} is not a UID")
    if not isinstance(doc["plan"], dict) or not (doc["made"] is None or isinstance(doc["made"], dict)):
        raise BadEntry("plan or made is not an object")
    return Entry(device, doc["claim"], doc["plan"], doc["made"])


class Ledger:
    """The records of one driver, in ``<plugins dir>/<driver>/made``, read once and kept in memory.
    Calls for one device must not overlap (the preparer holds its claim's lock and the device's
    hold); calls for different devices may. OSError from the constructor when the directory cannot be
    made or read."""

    def __init__(self, plugins_dir: Path, driver: str) -> None:
        self.plugins_dir, self.driver = plugins_dir, driver
        self.directory = plugins_dir / driver / DIRECTORY
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._changes = 0  # records written or removed since start: see ``changes``
        try:
            with self._open(create=False) as fd:
                ownfiles.remove_stale(fd, _STALE)
                found = [m.group(1) for name in ownfiles.names(fd) if (m := _RECORD.fullmatch(name))]
                self._entries = {entry.device: entry for device in sorted(found)
                                 if (entry := self._read(fd, device)) is not None}
        except FileNotFoundError:  # made with the first record
            pass

    @contextmanager
    def _open(self, create: bool = True) -> Iterator[int]:
        with ownfiles.directory(self.plugins_dir, self.driver, DIRECTORY, mode=0o700, create=create) as fd:
            yield fd

    def _read(self, fd: int, device: str) -> Entry | None:
        found = ownfiles.read_record(fd, f"{device}.json", RECORD_LIMIT, lambda data: parse(data, device), (BadEntry,))
        if not isinstance(found, ownfiles.MovedAside):
            return found
        log.warning("a record of a made device that is not the plugin's; moved aside", reason="bad-ledger",
                    driver=self.driver, device=device, moved_to=str(self.directory / found.name), error=found.problem)
        return None

    def names(self) -> frozenset[str]:
        """The devices made (or being made) for claims."""
        with self._lock:
            return frozenset(self._entries)

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def get(self, device: str) -> Entry | None:
        with self._lock:
            return self._entries.get(device)

    @property
    def changes(self) -> int:
        """How many times a record was written or removed since the ledger was opened: a reader that
        must agree with the hardware (the DRA plugin's probe) reads it before and after."""
        with self._lock:
            return self._changes

    def of_claim(self, claim: str) -> list[Entry]:
        with self._lock:
            return [entry for entry in self._entries.values() if entry.claim == claim]

    def _write(self, entry: Entry) -> None:
        if not is_dns_label(entry.device):
            raise ValueError(f"{entry.device!r} is not a device's name")
        with self._open() as fd:
            ownfiles.replace(fd, f"{entry.device}.json", (json.dumps(entry.document(), separators=(",", ":")) +
                                                          "\n").encode(), 0o600)
        with self._lock:
            self._entries[entry.device] = entry
            self._changes += 1

    def begin(self, device: str, claim: str, plan: Mapping[str, Any]) -> None:
        """Record the intent to make ``device`` for ``claim`` (OSError: nothing recorded, make nothing)."""
        self._write(Entry(device, claim, plan))

    def done(self, device: str, made: Mapping[str, Any]) -> None:
        """Record what making ``device`` did (OSError: the intent stays, which undoes it after a restart)."""
        entry = self.get(device)
        if entry is None:
            raise KeyError(device)
        self._write(Entry(device, entry.claim, entry.plan, made))

    def remove(self, device: str) -> None:
        """Forget ``device``; ``ownfiles.NotOurs`` when its name holds something else than a record."""
        try:
            with self._open(create=False) as fd:
                ownfiles.remove(fd, f"{device}.json")
        except FileNotFoundError:
            pass
        with self._lock:
            self._entries.pop(device, None)
            self._changes += 1
