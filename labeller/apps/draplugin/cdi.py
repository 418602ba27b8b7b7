"""The CDI spec file of one prepared claim: ``<--cdi-spec-dir>/gpu-labeller-dra_<driver>_<claim UID>.json``.

Kind ``k8s.gpu-labeller.io/gpu``; one CDI device per allocated device, named ``<claim UID>-<device>``
(unique across claims, so two claims never define the same name), and per share of a device
(consumable capacity) ``<claim UID>-<device>-<share ID>``. The edits are the vendor's own,
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
A share of a GPU shared by memory adds gpushare's environment (``labeller.apps.draplugin.shares``).

Files are written atomically (a dot-file, then a rename: runtimes read only ``*.json``; no fsync,
as the checkpoint's, see there) and removed when the claim is unprepared; no other file in the
directory is ever touched. Nothing found in the directory is trusted (``labeller.base.ownfiles``): the
directory itself is never a symlink, and a symlink, FIFO or directory at a claim's file name
refuses that claim (``NotOurs``), its target never opened; unprepare leaves it alone. Temporary files
a killed plugin left (``.gpu-labeller-dra_<driver>_*.tmp``) are removed when the driver starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labeller.base import ownfiles
from labeller.model.config import Config
from labeller.model.vendor import Vendor
from labeller.model.resourceslices import DraDevice
from labeller.base.log import get_logger

log = get_logger(__name__)

KIND = "k8s.gpu-labeller.io/gpu"
FILE_PREFIX = "gpu-labeller-dra_"


def cdi_name(claim_uid: str, device: str, share_id: str | None = None) -> str:
    """``<claim UID>-<device>``, and ``-<share ID>`` for a share of a device (consumable capacity): a
    claim holding two shares of one device has a CDI device for each."""
    return f"{claim_uid}-{device}" if share_id is None else f"{claim_uid}-{device}-{share_id}"


def cdi_id(claim_uid: str, device: str, share_id: str | None = None) -> str:
    """The fully qualified CDI device ID the kubelet hands the runtime."""
    return f"{KIND}={cdi_name(claim_uid, device, share_id)}"


@dataclass(frozen=True)
class SpecDevice:
    """One CDI device of a claim's spec: its name (``cdi_name``), the device it gives the container,
    and edits added to the vendor's (what configs applied, a share's environment)."""

    name: str
    device: DraDevice
    edits: tuple[Mapping[str, Any], ...] = ()


def claim_spec(vendor: Vendor, devices: Sequence[SpecDevice], config: Config, host_root: Path,
               env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The claim's CDI spec, built from the vendor's spec for these devices (a device shared twice by
    the claim counted once), each CDI device's edits followed by its own, ``env`` added to what every
    device of the claim gets. ValueError when the vendor writes none for one of them."""
    unique = list({d.device.physical.visible_id: d.device for d in devices}.values())
    vendor_spec = vendor.devices.plugin_parts().cdi_spec([d.physical for d in unique], config, host_root)
    edits = {d["name"]: d["containerEdits"] for d in (vendor_spec or {}).get("devices", [])}
    missing = [d.name for d in unique if d.physical.visible_id not in edits]
    if vendor_spec is None or missing:
        raise ValueError(f"no CDI edits for device(s) {', '.join(missing or [d.name for d in unique])}")
    common = dict(vendor_spec.get("containerEdits") or {})
    if env:
        kept = [e for e in common.get("env", []) if e.split("=", 1)[0] not in env]
        common["env"] = [*kept, *(f"{key}={value}" for key, value in sorted(env.items()))]
    return {
        "cdiVersion": vendor_spec["cdiVersion"],
        "kind": KIND,
        "devices": [{"name": d.name, "containerEdits": _merged(edits[d.device.physical.visible_id], d.edits)}
                    for d in devices],
        "containerEdits": common,
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
