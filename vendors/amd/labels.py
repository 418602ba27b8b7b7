"""AMD labels, exactly as AMD's k8s-node-labeller writes them (fact sheet amd.md §1).

Each kind yields, from a list of per-GPU values:
- beta style (``labels.amdBeta``): ``beta.amd.com/gpu.<kind>.<value>=<count>`` for every value,
  plus ``beta.amd.com/gpu.<kind>=<value>`` when there is one distinct value;
- new style (``labels.amd``): ``amd.com/gpu.<kind>=<value>`` when there is one distinct value,
  else ``amd.com/gpu.<kind>.<value>=<count>`` per value and no plain key.

Counts follow AMD: cu-count, simd-count and vram count KFD compute nodes (so partitions): the
devices ``amd.com/gpu`` offers (labeller.offer), so labels and plugin count the same nodes;
device-id, family and product-name count physical GPUs (partitions have no PCI files there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from labeller.config import Config
from labeller.inventory import Inventory
from labeller.labels import Labeler, Labels, is_valid_value, sanitise_value
from labeller.offer import Offer
from vendors.amd.devices import VENDOR, AmdDevice
from vendors.amd.model import AmdComputeNode, AmdGpu, AmdInventory

BETA = "beta.amd.com/gpu."
NEW = "amd.com/gpu."
MIB = 1 << 20


def vram_gib_label(size_bytes: int) -> str:
    """AMD's ``math.Round(float(bytes/2^20)/1024)``: whole GiB, halves away from zero (not banker's)."""
    gib, rest_mib = divmod(size_bytes // MIB, 1024)
    return f"{gib + (1 if 2 * rest_mib >= 1024 else 0)}G"


def product_name_value(name: str) -> str:
    """AMD's replacements (' '→'_', drop '(' ')', '/'→'_'), then a repair of anything still invalid."""
    value = name.strip().replace(" ", "_").replace("(", "").replace(")", "").replace("/", "_")
    return value if is_valid_value(value) else sanitise_value(value)


def count_labels(kind: str, values: Iterable[str], config: Config) -> Labels:
    """The beta and new-style labels for one kind, from one value per GPU entry."""
    counts = Counter(v for v in values if v)
    labels: Labels = {}
    if not counts:
        return labels
    single = next(iter(counts)) if len(counts) == 1 else None
    if config.labels.amd_beta:
        for value, count in counts.items():
            labels[f"{BETA}{kind}.{value}"] = str(count)
        if single is not None:
            labels[f"{BETA}{kind}"] = single
    if config.labels.amd:
        if single is not None:
            labels[f"{NEW}{kind}"] = single
        else:
            for value, count in counts.items():
                labels[f"{NEW}{kind}.{value}"] = str(count)
    return labels


def _gpus(inventory: Inventory) -> tuple[AmdGpu, ...]:
    part = inventory.part(AmdInventory)
    return part.gpus if part is not None else ()


def _offered_nodes(offer: Offer) -> list[AmdComputeNode]:
    return [d.node for r in offer.of_vendor(VENDOR) for d in r.physical_devices if isinstance(d, AmdDevice)]


def _per_node(kind: str, value_of: Callable[[int, int, int | None], str | None]) -> Labeler:
    """A labeler over the KFD nodes offered; ``value_of(simd_count, simd_per_cu, vram_bytes)``."""

    def labeler(inventory: Inventory, config: Config, offer: Offer) -> Labels:
        values = (value_of(n.simd_count, n.simd_per_cu, n.vram_bytes) for n in _offered_nodes(offer))
        return count_labels(kind, (v for v in values if v), config)

    labeler.__name__ = f"amd_{kind.replace('-', '_')}_labels"
    return labeler


def _per_gpu(kind: str, value_of: Callable[[AmdGpu], str | None]) -> Labeler:
    def labeler(inventory: Inventory, config: Config, offer: Offer) -> Labels:
        values = (value_of(gpu) for gpu in _gpus(inventory))
        return count_labels(kind, (v for v in values if v), config)

    labeler.__name__ = f"amd_{kind.replace('-', '_')}_labels"
    return labeler


vram_labels = _per_node("vram", lambda simd, per_cu, vram: vram_gib_label(vram) if vram is not None else None)
simd_count_labels = _per_node("simd-count", lambda simd, per_cu, vram: str(simd))
cu_count_labels = _per_node("cu-count", lambda simd, per_cu, vram: str(simd // per_cu) if per_cu > 0 else None)
device_id_labels = _per_gpu("device-id", lambda gpu: f"{gpu.device_id:x}")
family_labels = _per_gpu("family", lambda gpu: gpu.family)
product_name_labels = _per_gpu("product-name", lambda gpu: product_name_value(gpu.product_name or "") or None)


def _driver_label(kind: str, value_of: Callable[[AmdInventory], str]) -> Labeler:
    """amd.com only; AMD writes the empty value when the module has no such file (in-tree amdgpu)."""

    def labeler(inventory: Inventory, config: Config, offer: Offer) -> Labels:
        part = inventory.part(AmdInventory)
        if not config.labels.amd or part is None or not part.gpus:
            return {}
        value = value_of(part)
        return {f"{NEW}{kind}": value if is_valid_value(value) else sanitise_value(value)}

    labeler.__name__ = f"amd_{kind.replace('-', '_')}_labels"
    return labeler


driver_version_labels = _driver_label("driver-version", lambda amd: amd.driver_version)
driver_src_version_labels = _driver_label("driver-src-version", lambda amd: amd.driver_src_version)


def firmware_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """``beta.amd.com/gpu.firmware.<BLOCK>.{feat,fw}.<decimal>=<count>``; opt-in via ``labels.firmware``."""
    if not config.labels.firmware:
        return {}
    counts: Counter[str] = Counter()
    for gpu in _gpus(inventory):
        for block, feature, version in gpu.firmware:
            counts[f"{BETA}firmware.{block}.feat.{feature}"] += 1
            counts[f"{BETA}firmware.{block}.fw.{version}"] += 1
    return {key: str(count) for key, count in counts.items()}


def compute_memory_partition_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """``<compute>_<memory>`` only when every GPU that reports both agrees (AMD emits nothing otherwise)."""
    modes = {f"{g.compute_partition}_{g.memory_partition}" for g in _gpus(inventory)
             if g.compute_partition and g.memory_partition}
    if not config.labels.amd or len(modes) != 1:
        return {}
    return {f"{NEW}compute-memory-partition": modes.pop()}


def partitioning_supported_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """From the first GPU in PCI address order, as AMD's sorted ``pci:amdgpu`` glob gives it."""
    gpus = sorted(_gpus(inventory), key=lambda g: g.bdf)
    if not config.labels.amd or not gpus:
        return {}
    return {
        f"{NEW}compute-partitioning-supported": str(gpus[0].compute_partitioning_supported).lower(),
        f"{NEW}memory-partitioning-supported": str(gpus[0].memory_partitioning_supported).lower(),
    }


LABELERS: tuple[Labeler, ...] = (
    vram_labels,
    simd_count_labels,
    cu_count_labels,
    device_id_labels,
    family_labels,
    product_name_labels,
    driver_version_labels,
    driver_src_version_labels,
    firmware_labels,
    compute_memory_partition_labels,
    partitioning_supported_labels,
)
