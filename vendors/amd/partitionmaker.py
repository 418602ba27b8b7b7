"""AMD compute partitions made at prepare (``labeller.dra.dynamicMig``): the GPU switched to the
partition's mode when it is in another, through sysfs, as ``amd-smi set --compute-partition`` does.

Making ``gpu-<PCI address>-<mode>-<i>`` (its ``DraDevice.make``: the GPU, the mode, the partition and
how many the mode has): when the GPU's ``current_compute_partition`` says another mode, the mode is
written there (upper-case, as amdgpu reads it). The plugin's holds have already refused a claim for
a partition of another mode than one a prepared claim holds, so a switch only happens on a GPU no
claim holds; amdgpu refuses one while a process outside Kubernetes has the GPU open (EBUSY), which
is the claim's error. Once switched, the KFD topology and DRM cards are read again (the GPU's nodes
are laid out anew) until they show the mode's partitions (``SWITCH_TIMEOUT_S``), and the claim gets
the KFD node and render node of partition ``i`` (the ``i``-th by PCI function).

Unmaking leaves the mode as it is: the next claim that wants another switches it, and a claim of
the same mode needs no switch. Calls for one GPU run one at a time (a lock per GPU).

In a simulation the write goes to the simulated driver (``SimulatedAmd.write_compute_partition``),
which lays the simulated KFD topology out again as amdgpu does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labeller.model.resourceslices import DraDevice
from labeller.model.vendor.dra import DeviceMaker, Made, MakeRefused
from vendors import pci
from vendors.amd import devices as kfd
from vendors.amd import probe as backend
from vendors.amd.facts import PCI_AMDGPU_DRIVER, PCI_CLASSES, PCI_VENDOR_ID
from vendors.amd.model import AmdGpu, AmdInventory
from vendors.sysfs import Untrusted, read_text
from labeller.base.log import get_logger

log = get_logger(__name__)

SWITCH_TIMEOUT_S = 10.0  # a real switch re-initialises the GPU's partitions: a second or two
_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def _lock(bdf: str) -> threading.Lock:
    with _locks_lock:
        return _locks.setdefault(bdf, threading.Lock())


class PartitionMaker(DeviceMaker):
    """``simulated``: a simulation's AMD stand-in, which takes the writes a real node's sysfs takes."""

    def __init__(self, host_root: Path, simulated: Any = None) -> None:
        self.host_root, self.simulated = host_root, simulated

    def _current(self, bdf: str) -> str | None:
        try:
            return (read_text(self.host_root / PCI_AMDGPU_DRIVER / bdf / "current_compute_partition") or "").lower() \
                or None
        except Untrusted as exc:
            raise MakeRefused(f"GPU {bdf}: {exc}") from None

    def _switch(self, bdf: str, mode: str) -> None:
        try:
            if self.simulated is not None and hasattr(self.simulated, "write_compute_partition"):
                self.simulated.write_compute_partition(self.host_root, bdf, mode)
            else:
                (self.host_root / PCI_AMDGPU_DRIVER / bdf / "current_compute_partition").write_text(mode.upper())
        except OSError as exc:
            raise MakeRefused(f"GPU {bdf}: cannot switch its compute partition mode to {mode.upper()}: "
                              f"{exc.strerror or exc} (a process outside Kubernetes may have it open)") from None

    def _gpu(self, bdf: str) -> AmdGpu | None:
        pci_gpus, _ = pci.scan(self.host_root, {PCI_VENDOR_ID: PCI_CLASSES})
        part, _ = backend.probe(self.host_root, pci_gpus, None, self.simulated)
        found = part.gpus if isinstance(part, AmdInventory) else ()
        return next((gpu for gpu in found if gpu.bdf == bdf), None)

    def make(self, device: DraDevice) -> Made:
        plan = device.make or {}
        bdf, mode = str(plan.get("gpu", "")), str(plan.get("mode", ""))
        index, count = plan.get("partition"), plan.get("partitions")
        if not isinstance(index, int) or not isinstance(count, int) or not 0 <= index < count:
            raise MakeRefused(f"partition {device.name}: the plan names no partition")
        with _lock(bdf):
            was = self._current(bdf)
            if was != mode:
                self._switch(bdf, mode)
                log.info("compute partition mode switched", vendor="amd", device=bdf, mode=mode, was=was,
                         partition=device.name)
            deadline = time.monotonic() + SWITCH_TIMEOUT_S
            while True:
                gpu = self._gpu(bdf)
                if gpu is not None and gpu.compute_partition == mode and len(gpu.nodes) == count:
                    break
                if time.monotonic() > deadline:
                    shown = "not found" if gpu is None else f"{gpu.compute_partition}, {len(gpu.nodes)} KFD node(s)"
                    raise MakeRefused(f"GPU {bdf}: after switching to {mode.upper()} the KFD topology shows {shown}, "
                                      f"not {count} partitions")
                time.sleep(0.05)
        node = sorted(gpu.nodes, key=lambda n: n.location_id)[index]
        physical = next(d for d in kfd.devices((gpu,)) if d.node.kfd_node == node.kfd_node)
        return Made({"gpu": bdf, "mode": mode, "partition": index, "switchedFrom": was if was != mode else None},
                    physical)

    def unmake(self, record: Mapping[str, Any]) -> None:
        """Nothing: the mode stays for the next claim (see the module docstring)."""

    def abandon(self, plan: Mapping[str, Any]) -> None:
        """Nothing: a switch left half done is a mode like any other."""


def maker(host_root: Path, handles: Mapping[str, Any]) -> DeviceMaker:
    return PartitionMaker(host_root, handles.get("amd"))
