"""The claims one driver has prepared, on disk: ``<plugins dir>/<driver>/checkpoint.json``.

Written atomically (a temporary file, fsync, rename) before NodePrepareResources answers and after
NodeUnprepareResources cleaned up, so a plugin killed at any moment restarts knowing every claim it
answered for: a repeated prepare is answered from it, and an unprepare after a restart finds what
the previous process prepared. A file that cannot be read is moved aside (``checkpoint.json.bad``)
with an error line, and the plugin starts empty: an unprepare still removes a claim's CDI spec file,
whose name the claim's UID alone gives.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from labeller.outputs import write_atomic

log = structlog.get_logger(__name__)

FILE_NAME = "checkpoint.json"
VERSION = 1


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a prepared claim, as NodePrepareResources answered it."""

    requests: tuple[str, ...]  # the claim's requests it was allocated for
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]

    def document(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name,
                "devices": [{"requests": list(d.requests), "pool": d.pool, "device": d.device,
                             "cdiDeviceIDs": list(d.cdi_ids)} for d in self.devices]}

    @classmethod
    def from_document(cls, uid: str, doc: dict[str, Any]) -> PreparedClaim:
        devices = tuple(PreparedDevice(tuple(d["requests"]), str(d["pool"]), str(d["device"]), tuple(d["cdiDeviceIDs"]))
                        for d in doc["devices"])
        return cls(uid, str(doc["namespace"]), str(doc["name"]), devices)


class Checkpoint:
    """The prepared claims of one driver, by claim UID; thread-safe, every change written at once."""

    def __init__(self, directory: Path, driver: str) -> None:
        self.path = directory / FILE_NAME
        self.driver = driver
        self._lock = threading.Lock()
        self._claims = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(text)
            if doc.get("version") != VERSION or doc.get("driver") != self.driver:
                raise ValueError(f"version {doc.get('version')!r} of driver {doc.get('driver')!r}")
            claims = {uid: PreparedClaim.from_document(uid, claim) for uid, claim in doc["claims"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(FILE_NAME + ".bad")
            self.path.replace(aside)
            log.error("checkpoint unreadable; moved aside, starting with no prepared claims", reason="bad-checkpoint",
                      driver=self.driver, path=str(self.path), moved_to=str(aside), error=str(exc))
            return {}
        if claims:
            log.info("prepared claims restored from the checkpoint", driver=self.driver, claims=len(claims),
                     path=str(self.path))
        return claims

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(uid)

    def uids(self) -> set[str]:
        with self._lock:
            return set(self._claims)

    def add(self, claim: PreparedClaim) -> None:
        """Record ``claim`` (OSError when the file cannot be written: then nothing changed)."""
        with self._lock:
            self._swap({**self._claims, claim.uid: claim})

    def remove(self, uid: str) -> None:
        with self._lock:
            if uid in self._claims:
                self._swap({u: c for u, c in self._claims.items() if u != uid})

    def _swap(self, claims: dict[str, PreparedClaim]) -> None:
        doc = {"version": VERSION, "driver": self.driver,
               "claims": {uid: claim.document() for uid, claim in sorted(claims.items())}}
        write_atomic(self.path, json.dumps(doc, separators=(",", ":")) + "\n", 0o600)
        self._claims = claims
