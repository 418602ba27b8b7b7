"""AMD backend: pure sysfs (KFD topology, DRM cards, amdgpu module files), no libdrm or ROCm.

What AMD's k8s-node-labeller reads through libdrm (family, marketing name) is derived here from
sysfs and the ``amdgpu.ids`` table instead. pyamdgpuinfo, when installed, may only fill gaps
(marketing name, VRAM size) through ``Enricher``; it is never required.

Every KFD node with a render minor is one compute node: a whole GPU, or one compute partition
(XCP) of it. Nodes are grouped into physical GPUs by PCI domain + bus + device (AMD's e8120e33)
and ``unique_id``. ``probe`` never raises: trouble becomes a ``BackendReport``.
"""

from __future__ import annotations

import os
import re
import stat
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from labeller.model.config import Config
from labeller.model.inventory import BackendReport, BackendStatus, PciGpu
from vendors.amd.facts import (
    AMDGPU_MODULE,
    DEBUGFS_DRI,
    DRM_CLASS,
    FIRMWARE_INFO,
    KFD_TOPOLOGY_DIRS,
    PARTITIONS_BY_MODE,
    PCI_AMDGPU_DRIVER,
    PCI_VENDOR_ID,
    pci_address,
    physical_function,
)
from vendors.amd.ids import family_of, marketing_name
from vendors.amd.model import AmdComputeNode, AmdGpu, AmdInventory
from vendors.amd.settings import AmdSettings
from vendors.plausible import (
    MAX_CUS,
    MAX_DEVICE_ID,
    MAX_DOMAIN,
    MAX_LOCATION_ID,
    MAX_MEMORY_BYTES,
    MAX_SIMD_PER_CU,
    MAX_SIMDS,
    first_problem,
    outside,
)
from vendors.sysfs import Untrusted, list_dir, numa_node, read_int, read_properties, read_text

# Where the probe says to look when firmware labels are on but debugfs cannot be read.
FIRMWARE_HINT = ("debugfs must be mounted there and read as uid 0 "
                 "(the Helm chart does both when config.labeller.labels.firmware is true)")


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
        names = list_dir(directory)
        if not names:
            return False
        modes = [(directory / name).stat().st_mode for name in names]
    except (OSError, Untrusted):
        return False
    return all(stat.S_ISCHR(mode) for mode in modes if not stat.S_ISDIR(mode))


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
# Every reader raises ``Untrusted`` for a file that exists but cannot be believed (vendors.sysfs);
# the probe turns that into a problem for the KFD node, the GPU or the whole backend it concerns.


def _topology_dir(host_root: Path) -> Path | None:
    for relative in KFD_TOPOLOGY_DIRS:
        path = host_root / relative / "nodes"
        if path.is_dir():
            return path
    return None


def _links(node_dir: Path) -> tuple[tuple[int, int], ...]:
    links: list[tuple[int, int]] = []
    for kind in ("io_links", "p2p_links"):
        names = list_dir(node_dir / kind) or []
        for name in sorted(names, key=lambda n: (len(n), n)):
            props = read_properties(node_dir / kind / name / "properties") or {}
            if "node_to" in props and "type" in props:
                links.append((props["node_to"], props["type"]))
    return tuple(links)


REQUIRED_GPU_KEYS = ("simd_count", "simd_per_cu", "location_id", "device_id")


class _BadNode(Exception):
    """A KFD node that cannot be believed; ``bdf`` names its GPU when its address is known."""

    def __init__(self, message: str, bdf: str | None = None):
        super().__init__(message)
        self.bdf = bdf


def _implausible(props: dict[str, int], bank: dict[str, int]) -> str | None:
    """The first value of a GPU node outside physical bounds (vendors.plausible), or None."""
    simd, per_cu = props["simd_count"], props["simd_per_cu"]
    return first_problem(
        outside("simd_count", simd, 1, MAX_SIMDS),
        outside("simd_per_cu", per_cu, 1, MAX_SIMD_PER_CU),
        outside("CU count (simd_count / simd_per_cu)", simd // per_cu, 1, MAX_CUS) if per_cu > 0 else None,
        outside("device_id", props["device_id"], 1, MAX_DEVICE_ID),
        outside("gfx_target_version", props.get("gfx_target_version", 0), 0, 999999),
        (outside("mem_banks/0 size_in_bytes", bank["size_in_bytes"], 0, MAX_MEMORY_BYTES)
         if "size_in_bytes" in bank else None),
    )


def _compute_node(node_dir: Path, index: int) -> tuple[AmdComputeNode, dict[str, int]] | None:
    """The GPU compute node in one KFD topology node dir; None for a CPU node; ``_BadNode`` for a
    node that cannot be read or whose values are outside physical bounds."""
    try:
        props = read_properties(node_dir / "properties")
    except Untrusted as exc:
        raise _BadNode(f"KFD node {index}: {exc}") from None
    if props is None:
        raise _BadNode(f"KFD node {index}: no properties file")
    if "simd_count" not in props and "cpu_cores_count" not in props:
        raise _BadNode(f"KFD node {index}: properties has no recognisable content")
    if props.get("drm_render_minor", 0) <= 0:  # CPU node (AMD's rule too)
        return None
    missing = [key for key in REQUIRED_GPU_KEYS if key not in props]
    if missing:
        raise _BadNode(f"KFD node {index}: properties lacks {', '.join(missing)}")
    domain = props.get("domain", 0)
    address = first_problem(outside("location_id", props["location_id"], 0, MAX_LOCATION_ID),
                            outside("domain", domain, 0, MAX_DOMAIN))
    if address:
        raise _BadNode(f"KFD node {index}: {address}")
    bdf = physical_function(pci_address(domain, props["location_id"]))
    try:
        bank = read_properties(node_dir / "mem_banks/0/properties") or {}
        gpu_id = read_int(node_dir / "gpu_id", 10)
        links = _links(node_dir)
    except Untrusted as exc:
        raise _BadNode(f"KFD node {index} ({bdf}): {exc}", bdf) from None
    reason = _implausible(props, bank)
    if reason:
        raise _BadNode(f"KFD node {index} ({bdf}): {reason}, beyond any real GPU", bdf)
    node = AmdComputeNode(
        kfd_node=index,
        gpu_id=gpu_id,
        render_minor=props["drm_render_minor"],
        card=None,
        simd_count=props["simd_count"],
        simd_per_cu=props["simd_per_cu"],
        vram_bytes=bank.get("size_in_bytes"),
        gfx_target_version=props.get("gfx_target_version"),
        location_id=props["location_id"],
        domain=domain,
        links=links,
        num_xcc=props.get("num_xcc"),
    )
    return node, props


@dataclass(frozen=True)
class _DrmCards:
    by_render_minor: dict[int, int]  # renderD minor -> card number (PCI and XCP cards alike)
    by_pci_address: dict[str, int]  # PCI address -> card number (PCI cards only: XCP cards have none)


def _drm_cards(host_root: Path) -> _DrmCards:
    """From ``card<N>/device/drm/renderD<M>`` and ``card<N>/device/uevent`` (PCI_SLOT_NAME)."""
    cards = _DrmCards({}, {})
    drm = host_root / DRM_CLASS
    for name in list_dir(drm) or []:
        if not re.fullmatch(r"card\d+", name):
            continue
        number = int(name[4:])
        uevent = read_text(drm / name / "device/uevent") or ""
        slot = next((line[14:] for line in uevent.splitlines() if line.startswith("PCI_SLOT_NAME=")), None)
        if slot:
            cards.by_pci_address[slot.lower()] = number
        for entry in list_dir(drm / name / "device/drm") or []:
            if entry.startswith("renderD") and entry[7:].isdigit():
                cards.by_render_minor[int(entry[7:])] = number
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
    files = _CardFiles(
        device_id=read_int(device / "device"),
        revision=read_int(device / "revision"),
        vendor_id=read_int(device / "vendor"),
        product_name=read_text(device / "product_name") or None,
        numa_node=numa_node(read_int(device / "numa_node")),
    )
    for name, value, high in (("device", files.device_id, MAX_DEVICE_ID), ("revision", files.revision, 0xFF)):
        if value is not None and not 0 <= value <= high:
            raise Untrusted(device / name, f"{value:#x} is wider than PCI allows")
    return files


@dataclass(frozen=True)
class _PartitionFiles:
    compute: str | None
    memory: str | None
    compute_supported: bool
    memory_supported: bool
    numa_node: int | None
    available_compute: tuple[str, ...] = ()


def _partition_files(host_root: Path, bdf: str) -> _PartitionFiles:
    directory = host_root / PCI_AMDGPU_DRIVER / bdf
    return _PartitionFiles(
        compute=(read_text(directory / "current_compute_partition") or "").lower() or None,
        memory=(read_text(directory / "current_memory_partition") or "").lower() or None,
        compute_supported=(directory / "available_compute_partition").exists(),
        memory_supported=(directory / "available_memory_partition").exists(),
        numa_node=numa_node(read_int(directory / "numa_node")),
        available_compute=available_modes(read_text(directory / "available_compute_partition") or ""),
    )


def available_modes(text: str) -> tuple[str, ...]:
    """``SPX, DPX, QPX, CPX`` (available_compute_partition) -> ("spx", "dpx", "qpx", "cpx"); words that
    are no partition mode are left out."""
    return tuple(dict.fromkeys(word for word in re.split(r"[\s,]+", text.lower()) if re.fullmatch(r"[a-z]px", word)))


def _debugfs_unreadable(host_root: Path) -> str | None:
    """Why debugfs's DRM directory cannot be read (None when it can): with firmware labels on,
    the probe says so instead of quietly writing no firmware labels."""
    path = host_root / DEBUGFS_DRI
    try:
        if list_dir(path) is not None:
            return None
        reason = f"{path} does not exist"
    except Untrusted as exc:
        reason = str(exc)
    return f"firmware labels are on but {reason}: {FIRMWARE_HINT}"


def _firmware(host_root: Path, bdf: str, card: int | None) -> tuple[tuple[tuple[str, int, int], ...], str | None]:
    """(versions, problem) of one GPU from debugfs ``dri/<card>/amdgpu_firmware_info``."""
    if card is None:
        return (), f"{bdf}: no firmware versions: no DRM card found for this GPU"
    path = host_root / DEBUGFS_DRI / str(card) / FIRMWARE_INFO
    try:
        text = read_text(path)
    except Untrusted as exc:
        return (), f"{bdf}: no firmware versions: {exc}"
    firmware = parse_firmware_info(text or "")
    if not firmware:
        return (), f"{bdf}: no firmware versions: {path} {'holds none' if text else 'is missing or empty'}"
    return firmware, None


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


@dataclass(frozen=True)
class _Built:
    gpu: AmdGpu
    firmware_problem: str | None  # firmware labels on, but this GPU's versions could not be read


def _describe(host_root: Path, bdf: str, card: int | None, pci_gpu: PciGpu | None, nodes: list[AmdComputeNode],
              kfd_device_id: int, firmware: bool) -> _Built:
    """One physical GPU from its primary DRM card, PCI entry, partition files and KFD nodes (none
    when KFD is missing). ``Untrusted`` when one of its files cannot be believed."""
    primary = _card_files(host_root, card)
    partitions = _partition_files(host_root, bdf)
    gpu_numa = primary.numa_node
    if gpu_numa is None:
        gpu_numa = pci_gpu.numa_node if pci_gpu else partitions.numa_node
    device_id = primary.device_id or (pci_gpu.device_id if pci_gpu else 0) or kfd_device_id
    revision = primary.revision if primary.revision is not None else (pci_gpu.revision if pci_gpu else None)
    versions, firmware_problem = _firmware(host_root, bdf, card) if firmware else ((), None)
    gpu = AmdGpu(
        bdf=bdf,
        device_id=device_id,
        revision=revision,
        product_name=primary.product_name or marketing_name(host_root, device_id, revision),
        family=family_of(nodes[0].gfx_target_version if nodes else None, device_id),
        nodes=tuple(replace(n, numa_node=gpu_numa) for n in nodes),
        compute_partition=partitions.compute,
        memory_partition=partitions.memory,
        compute_partitioning_supported=partitions.compute_supported,
        memory_partitioning_supported=partitions.memory_supported,
        available_compute_partitions=partitions.available_compute,
        numa_node=gpu_numa,
        expected_partitions=PARTITIONS_BY_MODE.get(partitions.compute or ""),
        firmware=versions,
    )
    return _Built(gpu, firmware_problem)


def _build_gpu(host_root: Path, group: _Group, cards: _DrmCards, pci: dict[str, PciGpu], firmware: bool) -> _Built:
    nodes = [replace(n, card=cards.by_render_minor.get(n.render_minor)) for n in group.nodes]
    # The PCI device's own card holds device, revision and product_name; the first partition's card
    # is that card only while partition 0 is visible.
    primary_card = cards.by_pci_address.get(group.bdf, nodes[0].card)
    built = _describe(host_root, group.bdf, primary_card, pci.get(group.bdf), nodes, group.device_id, firmware)
    return replace(built, gpu=replace(built.gpu, unique_id=str(group.unique_id) if group.unique_id else None))


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
    return {g.bdf: g for g in pci_gpus if g.vendor_id == PCI_VENDOR_ID}


def _has_gaps(gpu: AmdGpu) -> bool:
    return gpu.product_name is None or any(n.vram_bytes is None for n in gpu.nodes)


def _missing_from_kfd(amd_pci: dict[str, PciGpu], seen: set[str]) -> list[str]:
    """amdgpu-bound (or unbound) GPUs on the bus that KFD does not show: likely a failed device init."""
    return [f"{bdf}: AMD GPU on the PCI bus but not in the KFD topology"
            for bdf in sorted(set(amd_pci) - seen) if amd_pci[bdf].driver in (None, "amdgpu")]


def _partition_note(gpu: AmdGpu) -> str | None:
    if gpu.expected_partitions and len(gpu.nodes) < gpu.expected_partitions:
        return f"{gpu.bdf}: {len(gpu.nodes)} of {gpu.expected_partitions} partitions in the KFD topology"
    return None


@dataclass
class _Found:
    """What a probe collected: the GPUs, and the per-device problems that did not stop it."""

    gpus: list[AmdGpu]
    problems: list[str]
    left_out: set[str]  # GPUs (PCI addresses) left out of the labels because of a problem
    firmware: bool  # read each GPU's firmware versions (on, and debugfs is readable)
    firmware_unreadable: str | None  # on, but debugfs is not readable: one problem for every GPU

    @classmethod
    def start(cls, host_root: Path, firmware: bool) -> _Found:
        unreadable = _debugfs_unreadable(host_root) if firmware else None
        return cls([], [], set(), firmware and unreadable is None, unreadable)

    def all_problems(self) -> list[str]:
        return self.problems + ([self.firmware_unreadable] if self.firmware_unreadable and self.gpus else [])

    def add(self, built: _Built) -> None:
        self.gpus.append(built.gpu)
        if built.firmware_problem:
            self.problems.append(built.firmware_problem)

    def leave_out(self, bdf: str, exc: Exception) -> None:
        self.problems.append(f"{bdf}: {exc}; GPU left out of the labels")
        self.left_out.add(bdf)


def probe(
    host_root: Path, pci_gpus: tuple[PciGpu, ...], config: Config | None = None,
    enricher: Enricher | None = pyamdgpuinfo_enricher,
) -> tuple[AmdInventory | None, BackendReport]:
    """AMD GPUs under ``host_root``; with firmware labels on (``config``), each GPU's firmware
    versions from debugfs too. ``enricher`` may fill gaps (None: nothing may). Never raises."""
    firmware = config is not None and config.section(AmdSettings).firmware_labels
    try:
        return _probe(host_root, pci_gpus, enricher, firmware)
    except Untrusted as exc:
        return None, BackendReport("amd", "error", f"AMD probe failed: {exc}")
    except Exception as exc:  # noqa: BLE001 - a backend bug must not take the other vendors down
        return None, BackendReport("amd", "error", f"AMD probe failed: {type(exc).__name__}: {exc}")


def _driver(host_root: Path, gpus: list[AmdGpu]) -> AmdInventory:
    return AmdInventory(
        driver_version=read_text(host_root / AMDGPU_MODULE / "version") or "",
        driver_src_version=read_text(host_root / AMDGPU_MODULE / "srcversion") or "",
        gpus=tuple(gpus),
    )


def _no_kfd_reason(host_root: Path) -> str:
    if not (host_root / AMDGPU_MODULE).is_dir():
        return "the amdgpu module is not loaded"
    return "amdgpu is loaded but the KFD topology is missing (KFD disabled or still initialising)"


def _without_kfd(host_root: Path, amd_pci: dict[str, PciGpu],
                 firmware: bool) -> tuple[AmdInventory | None, BackendReport]:
    """AMD GPUs on the bus but no KFD topology: as AMD's labeller, describe each physical GPU from
    its DRM card (device id, family, product name) and the module (driver version); nothing per
    compute node. The report stays "unavailable", so the inventory is partial while KFD initialises."""
    if not amd_pci:
        return None, BackendReport("amd", "absent", "no AMD GPU on the PCI bus and no KFD topology")
    detail = f"{len(amd_pci)} AMD GPU(s) on the PCI bus but {_no_kfd_reason(host_root)}"
    found = _Found.start(host_root, firmware)
    cards = _drm_cards(host_root)
    for bdf, card in sorted(cards.by_pci_address.items()):
        try:
            if _card_files(host_root, card).vendor_id != PCI_VENDOR_ID:
                continue
            found.add(_describe(host_root, bdf, card, amd_pci.get(bdf), [], 0, found.firmware))
        except Untrusted as exc:
            found.leave_out(bdf, exc)
    if not found.gpus:
        return None, BackendReport("amd", "unavailable", detail, tuple(found.all_problems()))
    detail += f"; {len(found.gpus)} GPU(s) described from their DRM cards (no CU, SIMD or VRAM labels)"
    return _driver(host_root, found.gpus), BackendReport("amd", "unavailable", detail, tuple(found.all_problems()))


def _probe(
    host_root: Path, pci_gpus: tuple[PciGpu, ...], enricher: Enricher | None, firmware: bool
) -> tuple[AmdInventory | None, BackendReport]:
    amd_pci = _amd_pci(pci_gpus)
    topology = _topology_dir(host_root)
    if topology is None:
        return _without_kfd(host_root, amd_pci, firmware)
    node_dirs = [(int(name), topology / name) for name in list_dir(topology) or [] if name.isdigit()]
    found = _Found.start(host_root, firmware)
    nodes: list[tuple[AmdComputeNode, dict[str, int]]] = []
    for index, path in sorted(node_dirs):
        try:
            node = _compute_node(path, index)
        except _BadNode as exc:
            found.problems.append(f"{exc}; GPU left out of the labels" if exc.bdf else str(exc))
            if exc.bdf:
                found.left_out.add(exc.bdf)
            continue
        if node is not None:
            nodes.append(node)
    cards = _drm_cards(host_root)
    for group in _group_nodes(nodes):
        if group.bdf in found.left_out:
            continue
        try:
            found.add(_build_gpu(host_root, group, cards, amd_pci, found.firmware))
        except Untrusted as exc:
            found.leave_out(group.bdf, exc)
    gpus = _with_expected_partitions(found.gpus)
    notes = [note for gpu in gpus if (note := _partition_note(gpu))]
    if enricher is not None and any(_has_gaps(g) for g in gpus):
        try:
            gpus = _enrich(gpus, enricher(host_root))
        except Exception as exc:  # noqa: BLE001 - optional enrichment must never cost the sysfs result
            notes.append(f"enrichment skipped: {type(exc).__name__}: {exc}")
    problems = found.all_problems() + _missing_from_kfd(amd_pci, {g.bdf for g in gpus} | found.left_out)
    if not gpus:
        status: BackendStatus = "error" if problems else ("unavailable" if amd_pci else "absent")
        detail = "KFD topology has no GPU node" + (f" ({len(amd_pci)} AMD GPU(s) on the PCI bus)" if amd_pci else "")
        return None, BackendReport("amd", status, detail, tuple(problems))
    node_count = sum(len(g.nodes) for g in gpus)
    detail = "; ".join([f"{len(gpus)} GPU(s), {node_count} compute node(s)", *notes])
    return _driver(host_root, gpus), BackendReport("amd", "ok", detail, tuple(problems))
