"""The CDI spec file of one prepared claim: ``<--cdi-spec-dir>/gpu-labeller-dra_<driver>_<claim UID>.json``.

Kind ``k8s.gpu-labeller.io/gpu``; one CDI device per allocated device, named ``<claim UID>-<device>``
(unique across claims, so two claims never define the same name). The edits are the vendor's own,
from the spec the device plugin writes for the same devices (``PluginParts.cdi_spec``): NVIDIA's
device nodes (``/dev/nvidia<minor>``, a MIG device's capability nodes, the control nodes) and driver
files, AMD's ``/dev/kfd`` plus the device's or partition's render node (and card). The spec-wide
edits are the vendor's too, NVIDIA's ``NVIDIA_VISIBLE_DEVICES=void`` among them, as NVIDIA's DRA
driver writes it: a container sees the devices CDI gives it, and a legacy NVIDIA runtime hook (which
injects the GPUs that variable names) injects none. Naming the claim's GPUs there would hand them all
to every container that uses any one of them (a claim's spec-wide edits reach each such container:
NVIDIA's gpu-test4 gives each of four containers one MIG device of one claim). What an opaque config
applied adds its own edits to the devices it applied to (an MPS daemon's ``CUDA_MPS_PIPE_DIRECTORY``
and its pipe and ``/dev/shm`` mounts), as NVIDIA's driver adds them to its claim's devices.

Files are written atomically (a dot-file, then a rename: runtimes read only ``*.json``; no fsync,
as the checkpoint's, see there) and removed when the claim is unprepared; no other file in the
directory is ever touched. Nothing found in the directory is trusted (``labeller.ownfiles``): the
directory itself is never a symlink, and a symlink, FIFO or directory at a claim's file name
refuses that claim (``NotOurs``), its target never opened; unprepare leaves it alone. Temporary files
a killed plugin left (``.gpu-labeller-dra_<driver>_*.tmp``) are removed when the driver starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from labeller import ownfiles
from labeller.config import Config
from labeller.vendor import Vendor
from labeller.resourceslices import DraDevice

log = structlog.get_logger(__name__)

KIND = "k8s.gpu-labeller.io/gpu"
FILE_PREFIX = "gpu-labeller-dra_"


def cdi_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_id(claim_uid: str, device: str) -> str:
    """The fully qualified CDI device ID the kubelet hands the runtime."""
    return f"{KIND}={cdi_name(claim_uid, device)}"


def claim_spec(claim_uid: str, vendor: Vendor, devices: Sequence[DraDevice], config: Config,
               host_root: Path, extra: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> dict[str, Any]:
    """The claim's CDI spec, built from the vendor's spec for these devices, each device's edits
    followed by ``extra``'s for it (by device name: what configs applied). ValueError when the
    vendor writes none for one of them."""
    vendor_spec = vendor.devices.plugin_parts().cdi_spec([d.physical for d in devices], config, host_root)
    edits = {d["name"]: d["containerEdits"] for d in (vendor_spec or {}).get("devices", [])}
    missing = [d.name for d in devices if d.physical.visible_id not in edits]
    if vendor_spec is None or missing:
        raise ValueError(f"no CDI edits for device(s) {', '.join(missing or [d.name for d in devices])}")
    return {
        "cdiVersion": vendor_spec["cdiVersion"],
        "kind": KIND,
        "devices": [{"name": cdi_name(claim_uid, d.name),
                     "containerEdits": _merged(edits[d.physical.visible_id], (extra or {}).get(d.name, ()))}
                    for d in devices],
        "containerEdits": dict(vendor_spec.get("containerEdits") or {}),
    }


def _merged(edits: Mapping[str, Any], more: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``edits`` with each of ``more``'s lists (env, mounts, deviceNodes, hooks) appended."""
    out = dict(edits)
    for added in more:
        for key, values in added.items():
            out[key] = [*out.get(key, []), *values]
    return out


class ClaimSpecs:
    """The spec files of one driver's prepared claims in ``directory``. OSError from the constructor
    when the directory cannot be made or is not one."""

    def __init__(self, directory: Path, driver: str) -> None:
        self.directory, self.driver = directory, driver
        self._prefix = f"{FILE_PREFIX}{driver}_"
        with ownfiles.own_directory(directory) as fd:
            stale = ownfiles.remove_stale(fd, re.compile(rf"\.{re.escape(self._prefix)}.+\.tmp"))
        if stale:
            log.info("temporary CDI spec files of a killed plugin removed", driver=driver, path=str(directory),
                     files=sorted(stale))

    def _name(self, claim_uid: str) -> str:
        return f"{self._prefix}{claim_uid}.json"

    def path(self, claim_uid: str) -> Path:
        return self.directory / self._name(claim_uid)

    def present(self, claim_uid: str) -> bool:
        """Whether the claim's file is there, a regular file (not a link to one)."""
        with ownfiles.own_directory(self.directory) as fd:
            return ownfiles.is_regular(fd, self._name(claim_uid))

    def write(self, claim_uid: str, spec: dict[str, Any]) -> Path:
        """Write the claim's file; ``ownfiles.NotOurs`` when something else than a regular file holds its name."""
        with ownfiles.own_directory(self.directory) as fd:
            ownfiles.replace(fd, self._name(claim_uid), (json.dumps(spec, indent=2) + "\n").encode())
        return self.path(claim_uid)

    def remove(self, claim_uid: str) -> bool:
        """Remove the claim's file; False when there was none, ``ownfiles.NotOurs`` (left alone) when
        its name holds something else than a regular file."""
        with ownfiles.own_directory(self.directory) as fd:
            return ownfiles.remove(fd, self._name(claim_uid))
