"""Compute partitions made at prepare (``labeller.dra.dynamicMig``): an AMD GPU that can switch its
compute partition mode (its ``available_compute_partition`` file lists the modes) as KEP-4815's
partitionable device.

Each such GPU publishes one counter set, ``gpu-<PCI address>-counter-set`` (the address as a DNS
label: ``gpu-0000-05-00-0-counter-set``), and one device per partition of every mode it offers,
``gpu-<PCI address>-<mode>-<i>`` (``gpu-0000-05-00-0-dpx-1``: the second partition of DPX), named
after the GPU's address, which no switch changes (its DRM cards and KFD nodes do). A mode of ``k``
partitions splits the GPU's XCCs (accelerator complex dies: KFD's ``num_xcc``, 8 on an MI300X) in
``k`` runs: SPX one of all 8, DPX two of 4, QPX four of 2, CPX eight of 1. Each device draws on
the counters ``xcc-<i>`` (1 each) of its run, and on ``memory`` (bytes) and ``compute-units``, a
``k``-th of the GPU's each.

Counters are sums: they keep two partitions of the same XCCs apart, but cannot say that a GPU's
partitions share one mode, so the scheduler may give one claim a DPX partition and another a CPX
partition of the same GPU. The plugin holds a GPU in the mode of the claims prepared on it: the
device's ``exclusive`` (the GPU, the mode) has a claim for a partition of another mode refused
until those claims are unprepared (the kubelet tries again), and prepare switches the mode only
when no claim holds the GPU (``vendors.amd.partitionmaker``). The memory partition mode (NPS) is
published (``partitionProfile``) and never switched: that reloads the driver.

A GPU without the files, one whose KFD nodes do not all show (a mode with partitions missing) or
do not say their XCCs, is published as without dynamicMig, and says why once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from labeller.model.resourceslices import Attribute, Capacity, CounterSet, CounterUse, DraDevice
from vendors.amd.devices import AmdDevice
from vendors.amd.facts import PARTITIONS_BY_MODE
from vendors.amd.model import AmdGpu
from labeller.base.log import get_logger

log = get_logger(__name__)

_said: set[tuple[str, str]] = set()  # (GPU, reason) already logged: a probe repeats every interval


def base_name(gpu: AmdGpu) -> str:
    return "gpu-" + re.sub(r"[^0-9a-f]+", "-", gpu.bdf.lower())


def partitions(mode: str, xccs: int) -> int | None:
    """How many partitions ``mode`` splits a GPU of ``xccs`` XCCs into; None where they do not divide."""
    count = xccs if mode == "cpx" else PARTITIONS_BY_MODE.get(mode)
    return count if count and xccs % count == 0 else None


def _why_not(gpu: AmdGpu, current: list[AmdDevice]) -> str | None:
    if not gpu.compute_partitioning_supported or not gpu.available_compute_partitions or not gpu.compute_partition:
        return "its amdgpu files offer no compute partition switch (available_compute_partition)"
    if gpu.expected_partitions and len(gpu.nodes) != gpu.expected_partitions:
        return f"{len(gpu.nodes)} of its {gpu.expected_partitions} partitions are in the KFD topology"
    if not current or any(n.num_xcc is None or n.num_xcc <= 0 for n in gpu.nodes):
        return "its KFD nodes do not say their XCCs (num_xcc)"
    return None


def partitioned(gpu: AmdGpu, current: list[AmdDevice], attributes: Mapping[str, Attribute]) -> list[DraDevice] | None:
    """The GPU's counter set and one device per partition of each mode; None (said once) where its mode
    cannot be switched. ``current``: its KFD nodes' devices as without dynamicMig; ``attributes``: what
    each of its devices carries of the GPU (its first device's, without ``type`` and ``partitionProfile``)."""
    why = _why_not(gpu, current)
    if why is not None:
        if (gpu.bdf, why) not in _said:
            _said.add((gpu.bdf, why))
            log.warning("compute partitions are not switched at prepare on this GPU; its partitions are published "
                        "as they are", vendor="amd", device=gpu.bdf, reason="dynamic-partitions-unavailable",
                        detail=why)
        return None
    xccs = sum(n.num_xcc or 0 for n in gpu.nodes)
    memory = sum(n.vram_bytes for n in gpu.nodes if n.vram_bytes) if all(n.vram_bytes for n in gpu.nodes) else 0
    simd = sum(n.simd_count for n in gpu.nodes)
    cus = sum(n.simd_count // n.simd_per_cu for n in gpu.nodes if n.simd_per_cu > 0)
    pci = f"/sys/bus/pci/drivers/amdgpu/{gpu.bdf}"
    source = f"KFD topology nodes of {gpu.bdf} in {gpu.compute_partition}: num_xcc, simd_count, mem_banks"
    rule = "the GPU's whole: the sum over its KFD nodes in the current mode"
    counters = {f"xcc-{i}": Capacity(1, "sysfs", source, "1 for each of the GPU's XCCs") for i in range(xccs)}
    if memory:
        counters["memory"] = Capacity(memory, "sysfs", source, rule)
    if cus:
        counters["compute-units"] = Capacity(cus, "sysfs", source, rule)
    counter_set = CounterSet(f"{base_name(gpu)}-counter-set", counters)
    here = sorted(current, key=lambda d: d.node.location_id)
    out = []
    for mode in gpu.available_compute_partitions:
        count = partitions(mode, xccs)
        if count is None:
            continue
        for index in range(count):
            name = f"{base_name(gpu)}-{mode}-{index}"
            run = range(index * xccs // count, (index + 1) * xccs // count)
            takes = {f"xcc-{i}": 1 for i in run}
            capacity = {"simdUnits": Capacity(simd // count, "sysfs", source, f"the GPU's SIMDs / {count}")}
            if memory:
                takes["memory"] = memory // count
                capacity["memory"] = Capacity(memory // count, "sysfs", source, f"the GPU's VRAM / {count}")
            if cus:
                takes["compute-units"] = cus // count
                capacity["computeUnits"] = Capacity(cus // count, "sysfs", source, f"the GPU's CUs / {count}")
            extra = {"type": Attribute("amdgpu" if count == 1 else "amdgpu-partition", "sysfs",
                                       f"{pci}/available_compute_partition lists {mode}",
                                       f"partition {index} of {count} in {mode}, made at prepare "
                                       "(labeller.dra.dynamicMig)")}
            if gpu.memory_partition:
                extra["partitionProfile"] = Attribute(f"{mode}_{gpu.memory_partition}", "sysfs",
                                                      f"{pci}/current_memory_partition = {gpu.memory_partition!r}",
                                                      "<compute>_<memory>, the compute mode it is made in")
            is_now = mode == gpu.compute_partition and len(here) == count
            physical = here[index] if is_now else replace(here[0], visible_id=name, names=(name,), partition=mode)
            out.append(DraDevice(name, physical, {**attributes, **extra}, capacity,
                                 consumes=(CounterUse(counter_set, takes),),
                                 make={"gpu": gpu.bdf, "mode": mode, "partition": index, "partitions": count},
                                 exclusive=(gpu.bdf, mode)))
    return out
