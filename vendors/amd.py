"""AMD backend: pure sysfs (KFD topology, DRM cards, amdgpu module files), no libdrm or ROCm.

What AMD's k8s-node-labeller reads through libdrm (family, marketing name) is derived here from
sysfs and the ``amdgpu.ids`` table instead. pyamdgpuinfo, when installed, may only fill gaps
(marketing name, VRAM size) through ``Enricher``; it is never required.

Every KFD node with a render minor is one compute node: a whole GPU, or one compute partition
(XCP) of it. Nodes are grouped into physical GPUs by PCI domain + bus + device (AMD's e8120e33)
and ``unique_id``. ``probe`` never raises: trouble becomes a ``BackendReport``.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from labeller.inventory import (
    AMD_VENDOR_ID,
    AmdComputeNode,
    AmdGpu,
    AmdInventory,
    BackendReport,
    BackendStatus,
    PciGpu,
)
from vendors.sysfs import numa_node, read_int, read_properties, read_text

KFD_TOPOLOGY_DIRS = ("sys/class/kfd/kfd/topology", "sys/devices/virtual/kfd/kfd/topology")
AMDGPU_MODULE = "sys/module/amdgpu"
PCI_AMDGPU_DRIVER = "sys/module/amdgpu/drivers/pci:amdgpu"
DRM_CLASS = "sys/class/drm"
DEBUGFS_DRI = "sys/kernel/debug/dri"
HOST_AMDGPU_IDS = "usr/share/libdrm/amdgpu.ids"

LINK_XGMI = 11
LINK_PCIE = 2

# Partition modes with a fixed partition count; CPX has one partition per XCC, which depends on the chip.
PARTITIONS_BY_MODE = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4}


# --- pure helpers -------------------------------------------------------------------------------


def pci_address(domain: int, location_id: int) -> str:
    """The PCI address KFD encodes: location_id = bus << 8 | device << 3 | function."""
    bus, device, function = location_id >> 8 & 0xFF, location_id >> 3 & 0x1F, location_id & 0x7
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def physical_function(bdf: str) -> str:
    """XCP partitions differ only in the function number: the physical GPU is function 0."""
    return bdf[:-1] + "0"


def family_of(gfx_target_version: int | None, device_id: int) -> str | None:
    """libdrm's family code (amdgpu_drm.h AMDGPU_FAMILY_*), derived from KFD's gfx target version.

    Old kernels have no gfx_target_version; then a small device-id table covers the ROCm parts
    of that era. None when unknown (AMD's labeller skips such a GPU too).
    """
    if gfx_target_version is None or gfx_target_version <= 0:
        return _family_by_device_id(device_id)
    major, minor, step = gfx_target_version // 10000, gfx_target_version // 100 % 100, gfx_target_version % 100
    if major == 7:
        return "KV" if step in (0, 3, 5) else "CI"
    if major == 8:
        return "CZ" if (minor, step) in ((0, 1), (1, 0)) else "VI"
    if major == 9:
        return "RV" if minor == 0 and step in (2, 9, 12) else "AI"
    if major == 10:
        return _GC10_FAMILIES.get((minor, step), "NV")
    if major == 11:
        if minor == 0:
            return "GC_11_0_1" if step == 3 else "GC_11_0_0"
        return "GC_11_5_0" if minor == 5 else None
    if major == 12 and minor == 0:
        return "GC_12_0_0"
    return None


_GC10_FAMILIES = {(3, 3): "VGH", (3, 5): "YC", (3, 6): "GC_10_3_6", (3, 7): "GC_10_3_7"}

# (first, last) PCI device id -> family, for kernels without gfx_target_version.
_FAMILY_BY_DEVICE_RANGE = (
    (0x6860, 0x687F, "AI"),  # Vega10 (MI25, RX Vega)
    (0x69A0, 0x69AF, "AI"),  # Vega12
    (0x66A0, 0x66AF, "AI"),  # Vega20 (MI50/MI60)
    (0x7388, 0x7390, "AI"),  # Arcturus (MI100)
    (0x7400, 0x740F, "AI"),  # Aldebaran (MI200)
    (0x15D8, 0x15DD, "RV"),  # Raven, Picasso
    (0x1636, 0x1638, "RV"),  # Renoir, Cezanne
    (0x67C0, 0x67FF, "VI"),  # Polaris10/11
    (0x6980, 0x699F, "VI"),  # Polaris12
    (0x6920, 0x693F, "VI"),  # Tonga
    (0x7300, 0x7300, "VI"),  # Fiji
    (0x7310, 0x736F, "NV"),  # Navi10/12/14
)


def _family_by_device_id(device_id: int) -> str | None:
    for first, last, family in _FAMILY_BY_DEVICE_RANGE:
        if first <= device_id <= last:
            return family
    return None


_IDS_LINE = re.compile(r"^([0-9A-Fa-f]{4}),\s*([0-9A-Fa-f]{2}),\s*(.+?)\s*$")


@functools.lru_cache(maxsize=4)
def _parse_amdgpu_ids(path: Path) -> dict[tuple[int, int], str]:
    text = read_text(path) or ""
    table: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        match = _IDS_LINE.match(line)
        if match:
            table[(int(match.group(1), 16), int(match.group(2), 16))] = match.group(3)
    return table


def _bundled_amdgpu_ids() -> Path:
    return Path(str(resources.files("vendors") / "data" / "amdgpu.ids"))


def _lookup(table: dict[tuple[int, int], str], device_id: int, revision: int | None) -> str | None:
    if revision is not None:
        return table.get((device_id, revision))
    names = {name for (dev, _), name in table.items() if dev == device_id}
    return names.pop() if len(names) == 1 else None


def marketing_name(host_root: Path, device_id: int, revision: int | None) -> str | None:
    """libdrm's marketing name from amdgpu.ids: the host's copy, then (for GPUs newer than the host's
    libdrm) the one shipped here. Without a revision, only a name every revision shares."""
    for path in (host_root / HOST_AMDGPU_IDS, _bundled_amdgpu_ids()):
        name = _lookup(_parse_amdgpu_ids(path), device_id, revision)
        if name:
            return name
    return None


# The blocks AMD's labeller queries, as debugfs names them; GMC is called MC there too.
FIRMWARE_BLOCKS = ("VCE", "UVD", "MC", "ME", "PFP", "CE", "RLC", "MEC", "SMC", "SDMA0")
# Kernels since 2021 print the SMC line with a program number: "SMC feature version: 0, program: 0, firmware ...".
_FIRMWARE_LINE = re.compile(r"^(\w+) feature version: (\d+), (?:program: \d+, )?firmware version: (0x[0-9a-fA-F]+)")


def parse_firmware_info(text: str) -> tuple[tuple[str, int, int], ...]:
    """(block, feature, version) for AMD's blocks from debugfs ``amdgpu_firmware_info``."""
    found: dict[str, tuple[str, int, int]] = {}
    for line in text.splitlines():
        match = _FIRMWARE_LINE.match(line.strip())
        if match and match.group(1) in FIRMWARE_BLOCKS:
            found.setdefault(match.group(1), (match.group(1), int(match.group(2)), int(match.group(3), 16)))
    return tuple(found[block] for block in FIRMWARE_BLOCKS if block in found)


# --- optional enrichment (pyamdgpuinfo) ----------------------------------------------------------


@dataclass(frozen=True)
class EnrichedGpu:
    """What an enrichment source knows about one GPU; matched by render minor or PCI address."""

    render_minor: int | None
    bdf: str | None
    name: str | None
    vram_bytes: int | None


Enricher = Callable[[Path], list[EnrichedGpu]]


def _all_char_devices(directory: Path) -> bool:
    try:
        entries = list(directory.iterdir())
        return bool(entries) and all(stat.S_ISCHR(e.stat().st_mode) for e in entries if not e.is_dir())
    except OSError:
        return False


def pyamdgpuinfo_enricher(host_root: Path) -> list[EnrichedGpu]:
    """Marketing names and VRAM from pyamdgpuinfo (GPL, optional).

    pyamdgpuinfo opens ``/dev/dri/*`` itself and segfaults on entries that are not DRM character
    devices, so it runs only when both the host's and this process's ``/dev/dri`` hold nothing else.
    """
    if not _all_char_devices(host_root / "dev/dri") or not _all_char_devices(Path("/dev/dri")):
        return []
    try:
        import pyamdgpuinfo
    except ImportError:
        return []
    found: list[EnrichedGpu] = []
    try:
        for index in range(pyamdgpuinfo.detect_gpus()):
            gpu = pyamdgpuinfo.get_gpu(index)
            base = os.path.basename(str(gpu.path))
            minor = int(base[len("renderD"):]) if base.startswith("renderD") and base[7:].isdigit() else None
            vram = (gpu.memory_info or {}).get("vram_size")
            found.append(EnrichedGpu(minor, gpu.pci_slot, gpu.name, vram if isinstance(vram, int) else None))
    except (OSError, RuntimeError, ValueError, TypeError, AttributeError):
        return found
    return found


# --- reading sysfs ------------------------------------------------------------------------------


def _topology_dir(host_root: Path) -> Path | None:
    for relative in KFD_TOPOLOGY_DIRS:
        path = host_root / relative / "nodes"
        if path.is_dir():
            return path
    return None


def _node_index(path: Path) -> int | None:
    return int(path.name) if path.name.isdigit() else None


def _links(node_dir: Path) -> tuple[tuple[int, int], ...]:
    links: list[tuple[int, int]] = []
    for kind in ("io_links", "p2p_links"):
        try:
            link_dirs = sorted(node_dir.joinpath(kind).iterdir(), key=lambda p: (len(p.name), p.name))
        except OSError:
            continue
        for link_dir in link_dirs:
            props = read_properties(link_dir / "properties") or {}
            if "node_to" in props and "type" in props:
                links.append((props["node_to"], props["type"]))
    return tuple(links)


REQUIRED_GPU_KEYS = ("simd_count", "simd_per_cu", "location_id", "device_id")


def _compute_node(node_dir: Path, index: int, problems: list[str]) -> tuple[AmdComputeNode, dict[str, int]] | None:
    """The GPU compute node in one KFD topology node dir; None for CPU nodes and broken nodes."""
    props = read_properties(node_dir / "properties")
    if props is None:
        problems.append(f"KFD node {index}: properties unreadable")
        return None
    if "simd_count" not in props and "cpu_cores_count" not in props:
        problems.append(f"KFD node {index}: properties has no recognisable content")
        return None
    if props.get("drm_render_minor", 0) <= 0:  # CPU node (AMD's rule too)
        return None
    missing = [key for key in REQUIRED_GPU_KEYS if key not in props]
    if missing:
        problems.append(f"KFD node {index}: properties lacks {', '.join(missing)}")
        return None
    bank = read_properties(node_dir / "mem_banks/0/properties") or {}
    node = AmdComputeNode(
        kfd_node=index,
        gpu_id=read_int(node_dir / "gpu_id", 10),
        render_minor=props["drm_render_minor"],
        card=None,
        simd_count=props["simd_count"],
        simd_per_cu=props["simd_per_cu"],
        vram_bytes=bank.get("size_in_bytes"),
        gfx_target_version=props.get("gfx_target_version"),
        location_id=props["location_id"],
        domain=props.get("domain", 0),
        links=_links(node_dir),
    )
    return node, props


@dataclass(frozen=True)
class _DrmCards:
    by_render_minor: dict[int, int]  # renderD minor -> card number (PCI and XCP cards alike)
    by_pci_address: dict[str, int]  # PCI address -> card number (PCI cards only: XCP cards have none)


def _drm_cards(host_root: Path) -> _DrmCards:
    """From ``card<N>/device/drm/renderD<M>`` and ``card<N>/device/uevent`` (PCI_SLOT_NAME)."""
    cards = _DrmCards({}, {})
    try:
        found = [p for p in (host_root / DRM_CLASS).iterdir() if re.fullmatch(r"card\d+", p.name)]
    except OSError:
        return cards
    for card in found:
        number = int(card.name[4:])
        uevent = read_text(card / "device/uevent") or ""
        slot = next((line[14:] for line in uevent.splitlines() if line.startswith("PCI_SLOT_NAME=")), None)
        if slot:
            cards.by_pci_address[slot.lower()] = number
        try:
            names = os.listdir(card / "device/drm")
        except OSError:
            continue
        for name in names:
            if name.startswith("renderD") and name[7:].isdigit():
                cards.by_render_minor[int(name[7:])] = number
    return cards


@dataclass(frozen=True)
class _CardFiles:
    """The PCI-level files of a GPU's primary DRM card (XCP cards have none)."""

    device_id: int | None = None
    revision: int | None = None
    vendor_id: int | None = None
    product_name: str | None = None
    numa_node: int | None = None


def _card_files(host_root: Path, card: int | None) -> _CardFiles:
    if card is None:
        return _CardFiles()
    device = host_root / DRM_CLASS / f"card{card}" / "device"
    return _CardFiles(
        device_id=read_int(device / "device"),
        revision=read_int(device / "revision"),
        vendor_id=read_int(device / "vendor"),
        product_name=read_text(device / "product_name") or None,
        numa_node=numa_node(read_int(device / "numa_node")),
    )


@dataclass(frozen=True)
class _PartitionFiles:
    compute: str | None
    memory: str | None
    compute_supported: bool
    memory_supported: bool
    numa_node: int | None


def _partition_files(host_root: Path, bdf: str) -> _PartitionFiles:
    directory = host_root / PCI_AMDGPU_DRIVER / bdf
    return _PartitionFiles(
        compute=(read_text(directory / "current_compute_partition") or "").lower() or None,
        memory=(read_text(directory / "current_memory_partition") or "").lower() or None,
        compute_supported=(directory / "available_compute_partition").exists(),
        memory_supported=(directory / "available_memory_partition").exists(),
        numa_node=numa_node(read_int(directory / "numa_node")),
    )


def _firmware(host_root: Path, card: int | None) -> tuple[tuple[str, int, int], ...]:
    if card is None:
        return ()
    text = read_text(host_root / DEBUGFS_DRI / str(card) / "amdgpu_firmware_info")
    return parse_firmware_info(text) if text else ()


# --- assembling GPUs ----------------------------------------------------------------------------


@dataclass
class _Group:
    bdf: str
    unique_id: int
    nodes: list[AmdComputeNode]
    device_id: int  # from KFD, decimal there


def _group_nodes(found: Iterable[tuple[AmdComputeNode, dict[str, int]]]) -> list[_Group]:
    groups: dict[tuple[str, int], _Group] = {}
    for node, props in found:
        bdf = physical_function(pci_address(node.domain, node.location_id))
        key = (bdf, props.get("unique_id", 0))
        group = groups.setdefault(key, _Group(bdf, key[1], [], props["device_id"]))
        group.nodes.append(node)
    for group in groups.values():
        group.nodes.sort(key=lambda n: (n.location_id, n.kfd_node))
    return sorted(groups.values(), key=lambda g: (g.bdf, g.unique_id))


def _build_gpu(host_root: Path, group: _Group, cards: _DrmCards, pci: dict[str, PciGpu]) -> AmdGpu:
    nodes = [replace(n, card=cards.by_render_minor.get(n.render_minor)) for n in group.nodes]
    # The PCI device's own card holds device, revision and product_name; the first partition's card
    # is that card only while partition 0 is visible.
    primary_card = cards.by_pci_address.get(group.bdf, nodes[0].card)
    primary = _card_files(host_root, primary_card)
    pci_gpu = pci.get(group.bdf)
    partitions = _partition_files(host_root, group.bdf)
    gpu_numa = primary.numa_node
    if gpu_numa is None:
        gpu_numa = pci_gpu.numa_node if pci_gpu else partitions.numa_node
    device_id = primary.device_id or (pci_gpu.device_id if pci_gpu else 0) or group.device_id
    revision = primary.revision if primary.revision is not None else (pci_gpu.revision if pci_gpu else None)
    product = primary.product_name or marketing_name(host_root, device_id, revision)
    return AmdGpu(
        bdf=group.bdf,
        device_id=device_id,
        revision=revision,
        product_name=product,
        family=family_of(nodes[0].gfx_target_version, device_id),
        nodes=tuple(replace(n, numa_node=gpu_numa) for n in nodes),
        compute_partition=partitions.compute,
        memory_partition=partitions.memory,
        compute_partitioning_supported=partitions.compute_supported,
        memory_partitioning_supported=partitions.memory_supported,
        numa_node=gpu_numa,
        unique_id=str(group.unique_id) if group.unique_id else None,
        expected_partitions=PARTITIONS_BY_MODE.get(partitions.compute or ""),
        firmware=_firmware(host_root, primary_card),
    )


def _with_expected_partitions(gpus: list[AmdGpu]) -> list[AmdGpu]:
    """Fill the expected partition count where the mode does not fix it (CPX, or no partition files).

    Identical GPUs in the same mode are partitioned alike, so the largest partition count among
    them is what each should show; a GPU showing fewer has partitions the driver did not expose.
    """
    most: dict[tuple[int, str | None], int] = defaultdict(int)
    for gpu in gpus:
        key = (gpu.device_id, gpu.compute_partition)
        most[key] = max(most[key], len(gpu.nodes))
    out = []
    for gpu in gpus:
        expected = gpu.expected_partitions or most[(gpu.device_id, gpu.compute_partition)]
        out.append(replace(gpu, expected_partitions=expected if expected > 1 else gpu.expected_partitions))
    return out


def _enrich(gpus: list[AmdGpu], extra: list[EnrichedGpu]) -> list[AmdGpu]:
    """Fill missing marketing names and VRAM sizes; never overrides what sysfs said."""
    by_minor = {e.render_minor: e for e in extra if e.render_minor is not None}
    by_bdf = {e.bdf: e for e in extra if e.bdf}
    out = []
    for gpu in gpus:
        nodes = []
        for node in gpu.nodes:
            match = by_minor.get(node.render_minor)
            if node.vram_bytes is None and match is not None and match.vram_bytes:
                node = replace(node, vram_bytes=match.vram_bytes)
            nodes.append(node)
        first = by_bdf.get(gpu.bdf) or by_minor.get(gpu.nodes[0].render_minor)
        name = gpu.product_name or (first.name if first else None)
        out.append(replace(gpu, nodes=tuple(nodes), product_name=name or None))
    return out


def _amd_pci(pci_gpus: tuple[PciGpu, ...]) -> dict[str, PciGpu]:
    return {g.bdf: g for g in pci_gpus if g.vendor_id == AMD_VENDOR_ID}


def _no_kfd_report(host_root: Path, amd_pci: dict[str, PciGpu]) -> BackendReport:
    if not amd_pci:
        return BackendReport("amd", "absent", "no AMD GPU on the PCI bus and no KFD topology")
    if not (host_root / AMDGPU_MODULE).is_dir():
        reason = "the amdgpu module is not loaded"
    else:
        reason = "amdgpu is loaded but the KFD topology is missing (KFD disabled or still initialising)"
    return BackendReport("amd", "unavailable", f"{len(amd_pci)} AMD GPU(s) on the PCI bus but {reason}")


def _has_gaps(gpu: AmdGpu) -> bool:
    return gpu.product_name is None or any(n.vram_bytes is None for n in gpu.nodes)


def _missing_from_kfd(amd_pci: dict[str, PciGpu], gpus: list[AmdGpu]) -> list[str]:
    """amdgpu-bound (or unbound) GPUs on the bus that KFD does not show: likely a failed device init."""
    seen = {g.bdf for g in gpus}
    return [f"{bdf}: AMD GPU on the PCI bus but not in the KFD topology"
            for bdf in sorted(set(amd_pci) - seen) if amd_pci[bdf].driver in (None, "amdgpu")]


def _partition_note(gpu: AmdGpu) -> str | None:
    if gpu.expected_partitions and len(gpu.nodes) < gpu.expected_partitions:
        return f"{gpu.bdf}: {len(gpu.nodes)} of {gpu.expected_partitions} partitions in the KFD topology"
    return None


def probe(
    host_root: Path, pci_gpus: tuple[PciGpu, ...], enricher: Enricher | None = pyamdgpuinfo_enricher
) -> tuple[AmdInventory | None, BackendReport]:
    """AMD GPUs under ``host_root``. Never raises."""
    try:
        return _probe(host_root, pci_gpus, enricher)
    except Exception as exc:  # noqa: BLE001 - a backend bug must not take the other vendors down
        return None, BackendReport("amd", "error", f"AMD probe failed: {type(exc).__name__}: {exc}")


def _probe(
    host_root: Path, pci_gpus: tuple[PciGpu, ...], enricher: Enricher | None
) -> tuple[AmdInventory | None, BackendReport]:
    amd_pci = _amd_pci(pci_gpus)
    topology = _topology_dir(host_root)
    if topology is None:
        return None, _no_kfd_report(host_root, amd_pci)
    try:
        node_dirs = [(i, p) for p in topology.iterdir() if (i := _node_index(p)) is not None]
    except OSError as exc:
        return None, BackendReport("amd", "error", f"cannot list {topology}: {exc.strerror}")
    problems: list[str] = []  # per-device trouble that does not stop the probe
    found = [c for i, p in sorted(node_dirs) if (c := _compute_node(p, i, problems)) is not None]
    cards = _drm_cards(host_root)
    gpus = _with_expected_partitions([_build_gpu(host_root, g, cards, amd_pci) for g in _group_nodes(found)])
    notes = [note for gpu in gpus if (note := _partition_note(gpu))]
    if enricher is not None and any(_has_gaps(g) for g in gpus):
        try:
            gpus = _enrich(gpus, enricher(host_root))
        except Exception as exc:  # noqa: BLE001 - optional enrichment must never cost the sysfs result
            notes.append(f"enrichment skipped: {type(exc).__name__}: {exc}")
    problems.extend(_missing_from_kfd(amd_pci, gpus))
    if not gpus:
        status: BackendStatus = "error" if problems else ("unavailable" if amd_pci else "absent")
        detail = "KFD topology has no GPU node" + (f" ({len(amd_pci)} AMD GPU(s) on the PCI bus)" if amd_pci else "")
        return None, BackendReport("amd", status, detail, tuple(problems))
    inventory = AmdInventory(
        driver_version=read_text(host_root / AMDGPU_MODULE / "version") or "",
        driver_src_version=read_text(host_root / AMDGPU_MODULE / "srcversion") or "",
        gpus=tuple(gpus),
    )
    nodes = sum(len(g.nodes) for g in gpus)
    detail = "; ".join([f"{len(gpus)} GPU(s), {nodes} compute node(s)", *notes])
    return inventory, BackendReport("amd", "ok", detail, tuple(problems))
