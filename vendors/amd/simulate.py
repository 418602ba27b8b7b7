"""Simulated AMD sysfs trees for profiles, read back by the real backend (``vendors.amd``).

A profile's ``amd:`` section either names a captured sysfs tree (``sysfs:``), which is copied under
the simulated root, or lists GPUs inline (``gpus:``), from which a realistic tree is generated:
KFD topology (CPU nodes first), mem banks, io_links, DRM cards, amdgpu module and partition files,
and debugfs ``amdgpu_firmware_info`` for GPUs given a captured one (``firmware_info``).
Either way PCI device entries are written for each physical GPU, as real captures lack them.
Schema in docs/profiles.md; every problem is a ValueError naming the key.

The stand-in ``build`` returns (``SimulatedAmd``) is also the simulated amdgpu driver's side of a
write to a generated GPU's ``current_compute_partition``: ``write_compute_partition`` switches the
GPU's compute partition mode as amdgpu does, the KFD topology and DRM cards laid out again for the
new mode's partitions (the DRA plugin's partitions made at prepare, ``labeller.dra.dynamicMig``).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from vendors.amd.facts import (
    AMDGPU_MODULE,
    DEBUGFS_DRI,
    DRM_CLASS,
    FIRMWARE_INFO,
    KFD_TOPOLOGY_DIRS,
    LINK_PCIE,
    LINK_XGMI,
    PARTITIONS_BY_MODE,
    PCI_AMDGPU_DRIVER,
    PCI_VENDOR_ID,
    pci_address,
    physical_function,
)
from vendors.amd.probe import Enricher, EnrichedGpu
from vendors.sim_pci import write_device, write_host_bridge
from vendors.sysfs import Untrusted, read_properties, read_text

SECTION_KEYS = ("sysfs", "revision", "compute_partition", "memory_partition", "gpus", "driver_version",
                "driver_src_version")
GPU_KEYS = (
    "device_id", "revision", "product_name", "gfx_target_version", "simd_count", "simd_per_cu", "vram_bytes",
    "numa_node", "compute_partition", "memory_partition", "partitions", "xgmi", "firmware_info", "repeat",
)
COMPUTE_MODES = ("spx", "dpx", "tpx", "qpx", "cpx")
MEMORY_MODES = ("nps1", "nps2", "nps4", "nps8")
PCI_CLASS_DISPLAY_OTHER = 0x038000
MAX_GPUS = 64
CPU_CORES_PER_NODE = 48


# --- validation ---------------------------------------------------------------------------------


def _int(entry: Mapping[str, Any], key: str, where: str, default: int | None = None, minimum: int = 1) -> int:
    value = entry.get(key, default)
    if isinstance(value, str):
        try:
            value = int(value, 16 if key in ("device_id", "revision") else 0)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}.{key}: "
                         f"{'required integer' if value is None else f'must be an integer, got {value!r}'}")
    if value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{where}.{key}: must be {kind}, got {value}")
    return value


def _choice(entry: Mapping[str, Any], key: str, where: str, allowed: tuple[str, ...]) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in allowed:
        raise ValueError(f"{where}.{key}: must be one of {', '.join(allowed)}, got {value!r}")
    return value.lower()


def _string(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}.{key}: must be a string, got {value!r}")
    return value


def _check_keys(entry: Any, known: tuple[str, ...], where: str) -> Mapping[str, Any]:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: must be a mapping")
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key (known here: {', '.join(known)})")
    return entry


@dataclass(frozen=True)
class SimGpu:
    """One physical GPU to generate, with per-partition figures already divided."""

    device_id: int
    revision: int
    product_name: str | None
    gfx_target_version: int
    simd_per_partition: int
    simd_per_cu: int
    vram_per_partition: int
    numa_node: int
    compute_partition: str | None
    memory_partition: str | None
    partitions: int
    xgmi: bool
    firmware_info: str | None = None  # debugfs amdgpu_firmware_info text for the GPU's card


def _partitions(entry: Mapping[str, Any], where: str, mode: str | None) -> int:
    if "partitions" in entry:
        count = _int(entry, "partitions", where)
        if count > 8:
            raise ValueError(f"{where}.partitions: at most 8 (the PCI function bits), got {count}")
        return count
    if mode == "cpx":
        raise ValueError(f"{where}.partitions: required when compute_partition is cpx (one per XCC)")
    return PARTITIONS_BY_MODE.get(mode or "spx", 1)


_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _builtin_debugfs() -> Path:
    return Path(str(resources.files("vendors") / "profiles" / "debugfs"))


def _firmware_info(entry: Mapping[str, Any], where: str, base_dir: Path) -> str | None:
    """``firmware_info``: a captured ``amdgpu_firmware_info`` file next to the profile, or a built-in one."""
    name = _string(entry, "firmware_info", where)
    if name is None:
        return None
    if not _FILE_NAME.fullmatch(name):
        raise ValueError(f"{where}.firmware_info: a file name next to the profile, without '/', got {name!r}")
    for candidate in (base_dir / name, _builtin_debugfs() / name / FIRMWARE_INFO):
        try:
            text = read_text(candidate)
        except Untrusted as exc:
            raise ValueError(f"{where}.firmware_info: {exc}") from None
        if text is not None:
            return text
    known = ", ".join(sorted(p.name for p in _builtin_debugfs().iterdir() if p.is_dir()))
    raise ValueError(f"{where}.firmware_info: {name!r} is neither a file next to the profile nor a built-in capture "
                     f"({known})")


def parse_gpu(entry: Any, where: str, base_dir: Path) -> tuple[SimGpu, int]:
    """A validated inline GPU and its repeat count."""
    entry = _check_keys(entry, GPU_KEYS, where)
    mode = _choice(entry, "compute_partition", where, COMPUTE_MODES)
    partitions = _partitions(entry, where, mode)
    simd_count = _int(entry, "simd_count", where)
    vram_bytes = _int(entry, "vram_bytes", where)
    if simd_count % partitions:
        raise ValueError(f"{where}.simd_count: {simd_count} does not divide into {partitions} partitions")
    xgmi = entry.get("xgmi", False)
    if not isinstance(xgmi, bool):
        raise ValueError(f"{where}.xgmi: must be true or false, got {xgmi!r}")
    gpu = SimGpu(
        device_id=_int(entry, "device_id", where),
        revision=_int(entry, "revision", where, default=0, minimum=0),
        product_name=_string(entry, "product_name", where),
        gfx_target_version=_int(entry, "gfx_target_version", where),
        simd_per_partition=simd_count // partitions,
        simd_per_cu=_int(entry, "simd_per_cu", where, default=4),
        vram_per_partition=vram_bytes // partitions,
        numa_node=_int(entry, "numa_node", where, default=0, minimum=-1),
        compute_partition=mode,
        memory_partition=_choice(entry, "memory_partition", where, MEMORY_MODES),
        partitions=partitions,
        xgmi=xgmi,
        firmware_info=_firmware_info(entry, where, base_dir),
    )
    return gpu, _int(entry, "repeat", where, default=1)


def parse_gpus(value: Any, base_dir: Path) -> list[SimGpu]:
    if not isinstance(value, list) or not value:
        raise ValueError("amd.gpus: must be a non-empty list")
    gpus: list[SimGpu] = []
    for i, entry in enumerate(value):
        gpu, repeat = parse_gpu(entry, f"amd.gpus[{i}]", base_dir)
        gpus.extend([gpu] * repeat)
    if len(gpus) > MAX_GPUS:
        raise ValueError(f"amd.gpus: at most {MAX_GPUS} GPUs in all, got {len(gpus)}")
    return gpus


# --- writing files -------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _properties(values: Mapping[str, int]) -> str:
    return "\n".join(f"{key} {value}" for key, value in values.items())


def write_pci_device(root: Path, bdf: str, device_id: int, revision: int, numa_node: int) -> None:
    write_device(root, bdf, PCI_VENDOR_ID, device_id, PCI_CLASS_DISPLAY_OTHER, revision=revision, numa_node=numa_node)


def _write_module(root: Path, driver_version: str | None, driver_src_version: str | None) -> None:
    module = root / AMDGPU_MODULE
    (module / "drivers").mkdir(parents=True, exist_ok=True)
    if driver_version:
        _write(module / "version", driver_version)
    if driver_src_version:
        _write(module / "srcversion", driver_src_version)


@dataclass(frozen=True)
class _Placed:
    """A generated KFD GPU node: where its partition sits and which physical GPU it belongs to."""

    kfd_node: int
    gpu: SimGpu
    gpu_index: int
    partition: int
    bus: int


def _bus(gpu_index: int) -> int:
    # The real MI300X capture's buses are 0x05, 0x27, 0x47, ...: one per 0x20, spread over the root ports.
    return 0x05 + 0x20 * (gpu_index % 8) + 2 * (gpu_index // 8)


def _place(gpus: list[SimGpu], cpu_nodes: int) -> list[_Placed]:
    placed: list[_Placed] = []
    for gpu_index, gpu in enumerate(gpus):
        for partition in range(gpu.partitions):
            placed.append(_Placed(cpu_nodes + len(placed), gpu, gpu_index, partition, _bus(gpu_index)))
    return placed


def _cpu_node(topology: Path, index: int) -> None:
    node = topology / "nodes" / str(index)
    _write(node / "properties", _properties({
        "cpu_cores_count": CPU_CORES_PER_NODE, "simd_count": 0, "mem_banks_count": 1, "caches_count": 0,
        "io_links_count": 0, "p2p_links_count": 0, "cpu_core_id_base": index * CPU_CORES_PER_NODE,
        "simd_id_base": 0, "gfx_target_version": 0, "vendor_id": 0, "device_id": 0, "location_id": 0,
        "domain": 0, "drm_render_minor": 0, "hive_id": 0, "unique_id": 0,
    }))
    _write(node / "gpu_id", "0")
    _write(node / "name", "")
    _write(node / "mem_banks/0/properties", _properties({"heap_type": 0, "size_in_bytes": 1 << 38, "flags": 0}))


def _gpu_node(topology: Path, item: _Placed, all_nodes: list[_Placed], cpu_nodes: int) -> None:
    gpu = item.gpu
    node = topology / "nodes" / str(item.kfd_node)
    peers = [p for p in all_nodes if gpu.xgmi and p.gpu.xgmi and p.kfd_node != item.kfd_node]
    cpu = min(max(gpu.numa_node, 0), cpu_nodes - 1)
    links = [(cpu, LINK_PCIE)] + [(p.kfd_node, LINK_XGMI) for p in peers]
    xcc = max(1, 8 // gpu.partitions) if gpu.partitions > 1 else 8
    _write(node / "properties", _properties({
        "cpu_cores_count": 0, "simd_count": gpu.simd_per_partition, "mem_banks_count": 1, "caches_count": 0,
        "io_links_count": len(links), "p2p_links_count": 0, "cpu_core_id_base": 0,
        "simd_id_base": 2147487744 + 16 * item.kfd_node, "max_waves_per_simd": 8, "wave_front_size": 64,
        "simd_per_cu": gpu.simd_per_cu, "gfx_target_version": gpu.gfx_target_version, "vendor_id": PCI_VENDOR_ID,
        "device_id": gpu.device_id, "location_id": item.bus << 8 | item.partition, "domain": 0,
        "drm_render_minor": 128 + item.kfd_node - cpu_nodes, "hive_id": 1 if gpu.xgmi else 0,
        "local_mem_size": 0, "unique_id": 0x1000 + item.gpu_index, "num_xcc": xcc,
    }))
    _write(node / "gpu_id", str(10000 + 97 * item.kfd_node))
    _write(node / "name", "ip discovery")
    _write(node / "mem_banks/0/properties",
           _properties({"heap_type": 1, "size_in_bytes": gpu.vram_per_partition, "flags": 0}))
    for number, (peer, kind) in enumerate(links):
        _write(node / "io_links" / str(number) / "properties",
               _properties({"type": kind, "node_from": item.kfd_node, "node_to": peer,
                            "weight": 15 if kind == LINK_XGMI else 20}))


def _drm_card(root: Path, item: _Placed, card: int, render_minor: int, bdf: str) -> None:
    """Partition 0 is the PCI device; further partitions are ``amdgpu_xcp`` platform devices without PCI files."""
    device = root / DRM_CLASS / f"card{card}" / "device"
    (device / "drm" / f"card{card}").mkdir(parents=True, exist_ok=True)
    (device / "drm" / f"renderD{render_minor}").mkdir(parents=True, exist_ok=True)
    if item.partition:
        return
    gpu = item.gpu
    _write(device / "vendor", f"0x{PCI_VENDOR_ID:04x}")
    _write(device / "device", f"0x{gpu.device_id:04x}")
    _write(device / "revision", f"0x{gpu.revision:02x}")
    _write(device / "numa_node", str(gpu.numa_node))
    _write(device / "product_name", gpu.product_name or "")
    _write(device / "uevent", f"DRIVER=amdgpu\nPCI_ID=1002:{gpu.device_id:04X}\nPCI_SLOT_NAME={bdf}")
    if gpu.firmware_info is not None:
        _write(root / DEBUGFS_DRI / str(card) / FIRMWARE_INFO, gpu.firmware_info)


def _partition_files(root: Path, gpu: SimGpu, bdf: str) -> None:
    directory = root / PCI_AMDGPU_DRIVER / bdf
    _write(directory / "numa_node", str(gpu.numa_node))
    if gpu.compute_partition:
        _write(directory / "current_compute_partition", gpu.compute_partition.upper())
        _write(directory / "available_compute_partition", ", ".join(m.upper() for m in available_modes(gpu)))
    if gpu.memory_partition:
        _write(directory / "current_memory_partition", gpu.memory_partition.upper())
        _write(directory / "available_memory_partition", "NPS1, NPS4")


def available_modes(gpu: SimGpu) -> tuple[str, ...]:
    """The compute partition modes a simulated MI300-class GPU offers: every one in NPS1, only CPX in
    another memory partition mode (an MI300X in NPS4 runs in CPX alone)."""
    return ("spx", "dpx", "qpx", "cpx") if gpu.memory_partition in (None, "nps1") else ("cpx",)


def generate(gpus: list[SimGpu], root: Path, driver_version: str | None, driver_src_version: str | None) -> None:
    topology = root / KFD_TOPOLOGY_DIRS[0]
    cpu_nodes = max(1, max(g.numa_node for g in gpus) + 1)
    for index in range(cpu_nodes):
        _cpu_node(topology, index)
    placed = _place(gpus, cpu_nodes)
    for card, item in enumerate(placed):
        bdf = pci_address(0, item.bus << 8 | item.partition)
        _gpu_node(topology, item, placed, cpu_nodes)
        _drm_card(root, item, card, 128 + card, bdf)
        if item.partition == 0:
            _partition_files(root, item.gpu, bdf)
            write_pci_device(root, bdf, item.gpu.device_id, item.gpu.revision, item.gpu.numa_node)
    _write(topology / "generation_id", "1")  # bumped by the driver when nodes come or go
    _write_module(root, driver_version, driver_src_version)


# --- captured trees ----------------------------------------------------------------------------


def _builtin_trees() -> Path:
    return Path(str(resources.files("vendors") / "profiles" / "sysfs"))


def _link_problem(tree: Path, parent: Path) -> str | None:
    """What is wrong with the symlinks of ``tree`` (itself or inside it), or None.

    A link may lead anywhere inside ``parent``, but not outside it, and not nowhere (copying the
    tree would fail on a broken link)."""
    home = parent.resolve()
    if not tree.resolve().is_relative_to(home):
        return f"leads outside {parent} (through {tree})"
    for directory, subdirectories, files in os.walk(tree):
        for name in [*subdirectories, *files]:
            entry = Path(directory, name)
            if not entry.is_symlink():
                continue
            if not entry.resolve().is_relative_to(home):
                return f"leads outside {parent} (through {entry})"
            if not entry.exists():
                return f"has a broken symlink: {entry}"
    return None


def _tree(name: str, base_dir: Path) -> Path:
    """The captured tree ``name``: a directory inside the profile's directory, else a built-in one.

    The tree is copied into the simulated root, so a profile must not reach the rest of the
    machine: an absolute path, ``..``, or a symlink that leads outside the profile's directory (or
    the built-in set) is refused."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ValueError(f"amd.sysfs: {name!r} must name a directory inside the profile's directory or a "
                         "built-in tree, not an absolute path or one with '..'")
    for parent in (base_dir, _builtin_trees()):
        candidate = parent / name
        if candidate.is_dir():
            problem = _link_problem(candidate, parent)
            if problem is not None:
                raise ValueError(f"amd.sysfs: {name!r} {problem}")
            return candidate
    known = ", ".join(sorted(p.name for p in _builtin_trees().iterdir() if p.is_dir()))
    raise ValueError(f"amd.sysfs: {name!r} is neither a directory next to the profile nor a built-in tree ({known})")


def _pci_from_topology(root: Path, revision: int) -> list[str]:
    """PCI entries for the physical GPUs of a captured KFD topology that has none; their addresses."""
    nodes = root / KFD_TOPOLOGY_DIRS[0] / "nodes"
    seen: set[str] = set()
    for properties in sorted(nodes.glob("*/properties")):
        props = read_properties(properties) or {}
        if props.get("drm_render_minor", 0) <= 0 or "location_id" not in props:
            continue
        bdf = physical_function(pci_address(props.get("domain", 0), props["location_id"]))
        if bdf not in seen and not (root / "sys/bus/pci/devices" / bdf).exists():
            write_pci_device(root, bdf, props.get("device_id", 0), revision, -1)
        seen.add(bdf)
    return sorted(seen)


def copy_tree(name: str, root: Path, base_dir: Path, revision: int) -> list[str]:
    shutil.copytree(_tree(name, base_dir), root, dirs_exist_ok=True)
    return _pci_from_topology(root, revision)


def _declared_partitions(section: Mapping[str, Any], root: Path, bdfs: list[str]) -> None:
    """``compute_partition``/``memory_partition`` of a captured tree: the amdgpu partition files a
    capture lacks, written for every physical GPU (numa_node -1, as the capture's PCI entries)."""
    compute = _choice(section, "compute_partition", "amd", COMPUTE_MODES)
    memory = _choice(section, "memory_partition", "amd", MEMORY_MODES)
    if compute is None and memory is None:
        return
    for bdf in bdfs:
        _partition_files(root, replace(_DECLARED, compute_partition=compute, memory_partition=memory, numa_node=-1),
                         bdf)


# Only the partition fields of this placeholder are read (_partition_files).
_DECLARED = SimGpu(device_id=0, revision=0, product_name=None, gfx_target_version=0, simd_per_partition=0,
                   simd_per_cu=0, vram_per_partition=0, numa_node=-1, compute_partition=None, memory_partition=None,
                   partitions=1, xgmi=False)


def no_enrichment(host_root: Path) -> list[EnrichedGpu]:
    """A simulated node's enricher: pyamdgpuinfo would describe the host's own GPUs, never these."""
    return []


# What a partition switch lays out again: KFD's topology, the DRM cards, the amdgpu partition files.
_LAID_OUT = (KFD_TOPOLOGY_DIRS[0], DRM_CLASS, PCI_AMDGPU_DRIVER)


class SimulatedAmd:
    """A simulated node's AMD stand-in: an enricher that finds nothing (as ``no_enrichment``), and the
    simulated driver of its generated GPUs (``gpus``; None for a captured tree, which cannot be laid
    out again)."""

    def __init__(self, gpus: list[SimGpu] | None, driver_version: str | None, driver_src_version: str | None) -> None:
        self.gpus = gpus
        self.driver_version, self.driver_src_version = driver_version, driver_src_version
        self._lock = threading.Lock()

    def __call__(self, host_root: Path) -> list[EnrichedGpu]:
        return []

    def write_compute_partition(self, host_root: Path, bdf: str, mode: str) -> None:
        """What amdgpu does when ``mode`` is written to the GPU's current_compute_partition: OSError
        (EINVAL) for a mode it does not offer, or a GPU that is not one of its own; else the GPU is
        switched, and its KFD nodes and DRM cards (and those of the GPUs after it, whose numbers
        move) laid out again. Each directory is replaced by a rename."""
        mode = mode.strip().lower()
        with self._lock:
            gpus = list(self.gpus or [])
            index = next((i for i in range(len(gpus)) if pci_address(0, _bus(i) << 8) == bdf), None)
            if index is None or mode not in available_modes(gpus[index]) or gpus[index].compute_partition is None:
                raise OSError(errno.EINVAL, f"{bdf}: cannot switch to compute partition {mode!r}")
            gpu = gpus[index]
            xccs = 8 if gpu.compute_partition != "cpx" else gpu.partitions
            partitions = xccs if mode == "cpx" else PARTITIONS_BY_MODE[mode]
            simd, vram = gpu.simd_per_partition * gpu.partitions, gpu.vram_per_partition * gpu.partitions
            gpus[index] = replace(gpu, compute_partition=mode, partitions=partitions,
                                  simd_per_partition=simd // partitions, vram_per_partition=vram // partitions)
            fresh = Path(tempfile.mkdtemp(prefix=".amd-layout-", dir=host_root))
            try:
                generate(gpus, fresh, self.driver_version, self.driver_src_version)
                for relative in _LAID_OUT:
                    old, new = host_root / relative, fresh / relative
                    aside = fresh / "old" / relative
                    aside.parent.mkdir(parents=True, exist_ok=True)
                    os.rename(old, aside)
                    os.rename(new, old)
            finally:
                shutil.rmtree(fresh, ignore_errors=True)
            self.gpus = gpus


def absent() -> Enricher:
    return no_enrichment


def build(section: Any, root: Path, base_dir: Path) -> Enricher:
    """Write the AMD part of a simulated node under ``root`` and return its stand-in (an enricher
    that finds nothing); ValueError naming the key on bad input."""
    section = _check_keys(section, SECTION_KEYS, "amd")
    write_host_bridge(root)
    sysfs = _string(section, "sysfs", "amd")
    driver_version = _string(section, "driver_version", "amd")
    driver_src_version = _string(section, "driver_src_version", "amd")
    if (sysfs is None) == ("gpus" not in section):
        raise ValueError("amd: give exactly one of sysfs (a captured tree) or gpus (inline GPUs)")
    if sysfs is not None:
        bdfs = copy_tree(sysfs, root, base_dir, _int(section, "revision", "amd", default=0, minimum=0))
        _declared_partitions(section, root, bdfs)
        if driver_version or driver_src_version:
            _write_module(root, driver_version, driver_src_version)
        return SimulatedAmd(None, driver_version, driver_src_version)
    for key in ("revision", "compute_partition", "memory_partition"):
        if key in section:
            raise ValueError(f"amd.{key}: only for sysfs trees; inline GPUs set gpus[*].{key}")
    gpus = parse_gpus(section["gpus"], base_dir)
    generate(gpus, root, driver_version, driver_src_version)
    return SimulatedAmd(gpus, driver_version, driver_src_version)
