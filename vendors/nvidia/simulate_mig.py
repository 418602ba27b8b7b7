"""The simulated NVML's MIG layout on disk: the profile's ``nvidia.state_file``.

A real driver keeps the GPU and compute instances made through NVML whatever process made them, so
a DRA plugin that restarts finds the MIG devices it made. The simulated NVML lives in its process;
where the profile names a state file, every GPU instance and compute instance made or destroyed is
written there (atomically: a temporary file, then a rename), and a simulation built later (a
restarted plugin, an edited profile) takes each GPU's MIG layout from it instead of the profile's
``mig_devices``. Nothing in it is trusted: a file over ``LIMIT`` bytes, bad JSON or a field of the
wrong kind is a ValueError naming the file and the entry.

Format::

    {"version": 1, "gpus": {"GPU-...": [{"gi": 1, "profile": "1g.5gb", "start": 0,
                                         "cis": [{"ci": 0, "slices": 1, "uuid": "MIG-..."}]}]}}
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vendors.sysfs import Untrusted, read_bytes

VERSION = 1
LIMIT = 1 << 20  # bytes: a 64-GPU node with every MIG device made is under 64 KiB


@dataclass(frozen=True)
class GpuInstanceState:
    gi: int
    profile: str  # its GPU instance profile's name ("1g.5gb")
    start: int  # the first memory slice of its placement
    cis: tuple[tuple[int, int, str], ...]  # (compute instance id, compute slices, MIG device UUID)


def _fail(path: Path, message: str) -> ValueError:
    return ValueError(f"nvidia.state_file ({path}): {message}")


def _int(value: Any, path: Path, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1024:
        raise _fail(path, f"{where}: {json.dumps(value)[:40]} is not a small non-negative integer")
    return value


def _text(value: Any, path: Path, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 128:
        raise _fail(path, f"{where}: {json.dumps(value)[:60]} is not a string")
    return value


def load(path: Path) -> dict[str, list[GpuInstanceState]]:
    """Each GPU's MIG layout, by GPU UUID; empty when there is no file yet."""
    try:
        data = read_bytes(path, LIMIT)
    except Untrusted as exc:
        raise _fail(path, str(exc)) from None
    if data is None:
        return {}
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise _fail(path, f"not JSON: {str(exc)[:80]}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("gpus"), dict):
        raise _fail(path, f"not a version {VERSION} MIG layout")
    out: dict[str, list[GpuInstanceState]] = {}
    for uuid, layout in doc["gpus"].items():
        if not isinstance(layout, list):
            raise _fail(path, f"gpus.{uuid[:60]}: not a list")
        entries = []
        for n, entry in enumerate(layout):
            where = f"gpus.{uuid[:60]}[{n}]"
            if not isinstance(entry, dict) or not isinstance(entry.get("cis"), list):
                raise _fail(path, f"{where}: not a GPU instance")
            cis = []
            for m, ci in enumerate(entry["cis"]):
                if not isinstance(ci, dict):
                    raise _fail(path, f"{where}.cis[{m}]: not a compute instance")
                cis.append((_int(ci.get("ci"), path, f"{where}.cis[{m}].ci"),
                            _int(ci.get("slices"), path, f"{where}.cis[{m}].slices"),
                            _text(ci.get("uuid"), path, f"{where}.cis[{m}].uuid")))
            entries.append(GpuInstanceState(_int(entry.get("gi"), path, f"{where}.gi"),
                                            _text(entry.get("profile"), path, f"{where}.profile"),
                                            _int(entry.get("start"), path, f"{where}.start"), tuple(cis)))
        out[uuid] = entries
    return out


def save(path: Path, gpus: Iterable[tuple[str, Iterable[Any], Iterable[Any]]]) -> None:
    """Write the MIG layout of ``gpus`` in place of the file's: (UUID, GPU instances, MIG devices) each, as
    the simulated NVML holds them (``FakeGpuInstance``, ``FakeMig``)."""
    doc: dict[str, Any] = {"version": VERSION, "gpus": {}}
    for uuid, gis, migs in gpus:
        by_gi: dict[int, list[Any]] = {}
        for mig in migs:
            by_gi.setdefault(mig.gpu_instance_id, []).append(mig)
        doc["gpus"][uuid] = [
            {"gi": gi.id, "profile": gi.profile.name, "start": gi.placement_start,
             "cis": [{"ci": mig.compute_instance_id, "slices": mig.compute_slices, "uuid": mig.uuid}
                     for mig in sorted(by_gi.get(gi.id, []), key=lambda m: m.compute_instance_id)]}
            for gi in sorted(gis, key=lambda g: g.id)]
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(doc, out, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
