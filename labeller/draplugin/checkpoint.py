"""The claims one driver has prepared, on disk: ``<plugins dir>/<driver>/claims/<claim UID>.json``.

One small file per prepared claim, written atomically (a temporary file, then a rename) before
NodePrepareResources answers and removed after NodeUnprepareResources cleaned up, so a plugin
killed at any moment restarts knowing every claim it answered for: a repeated prepare is answered
from it, and an unprepare after a restart finds what the previous process prepared. Nothing is
held in memory, and a prepare costs the same with one claim prepared on the node or a thousand.

The files are not fsynced: a killed process leaves them in the page cache, and a node that loses
power restarts its pods, whose claims the kubelet prepares again (the CDI spec files in /var/run
are gone too). An fsync would cost every prepare milliseconds on a network disk for nothing.

A file that cannot be read is moved aside (``<uid>.json.bad``) with an error line and the claim is
prepared again from the API; an unprepare still removes a claim's CDI spec file, whose name the
claim's UID alone gives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from labeller.outputs import write_atomic

log = structlog.get_logger(__name__)

DIRECTORY = "claims"
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

    def document(self, driver: str) -> dict[str, Any]:
        return {"version": VERSION, "driver": driver, "uid": self.uid, "namespace": self.namespace,
                "name": self.name,
                "devices": [{"requests": list(d.requests), "pool": d.pool, "device": d.device,
                             "cdiDeviceIDs": list(d.cdi_ids)} for d in self.devices]}

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> PreparedClaim:
        devices = tuple(PreparedDevice(tuple(d["requests"]), str(d["pool"]), str(d["device"]), tuple(d["cdiDeviceIDs"]))
                        for d in doc["devices"])
        return cls(str(doc["uid"]), str(doc["namespace"]), str(doc["name"]), devices)


class Checkpoint:
    """The prepared claims of one driver, a file each in ``<data dir>/claims``. Calls for one claim
    must not overlap (the preparer holds the claim's lock); calls for different claims may."""

    def __init__(self, data_dir: Path, driver: str) -> None:
        self.directory = data_dir / DIRECTORY
        self.driver = driver
        self.directory.mkdir(parents=True, exist_ok=True)
        count = len(self.uids())
        if count:
            log.info("prepared claims found in the checkpoint", driver=driver, claims=count, path=str(self.directory))

    def path(self, uid: str) -> Path:
        return self.directory / f"{uid}.json"

    def get(self, uid: str) -> PreparedClaim | None:
        path = self.path(uid)
        try:
            doc = json.loads(path.read_text())
            if doc.get("version") != VERSION or doc.get("driver") != self.driver or doc.get("uid") != uid:
                raise ValueError(f"version {doc.get('version')!r} of driver {doc.get('driver')!r} "
                                 f"for {doc.get('uid')!r}")
            return PreparedClaim.from_document(doc)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = path.with_name(path.name + ".bad")
            path.replace(aside)
            log.error("checkpoint of a claim unreadable; moved aside, the claim is prepared again",
                      reason="bad-checkpoint", driver=self.driver, uid=uid, moved_to=str(aside), error=str(exc))
            return None

    def uids(self) -> set[str]:
        return {p.stem for p in self.directory.glob("*.json")}

    def add(self, claim: PreparedClaim) -> None:
        """Record ``claim`` (OSError when it cannot be written: then nothing changed)."""
        text = json.dumps(claim.document(self.driver), separators=(",", ":")) + "\n"
        write_atomic(self.path(claim.uid), text, 0o600, durable=False)

    def remove(self, uid: str) -> None:
        self.path(uid).unlink(missing_ok=True)
