"""AMD labels, exactly as AMD's k8s-node-labeller writes them (fact sheet amd.md §1).

Each kind yields, from a list of per-GPU values:
- beta style (``labels.amdBeta``): ``beta.amd.com/gpu.<kind>.<value>=<count>`` for every value,
  plus ``beta.amd.com/gpu.<kind>=<value>`` when there is one distinct value;
- new style (``labels.amd``): ``amd.com/gpu.<kind>=<value>`` when there is one distinct value,
  else ``amd.com/gpu.<kind>.<value>=<count>`` per value and no plain key.

Counts follow AMD: cu-count, simd-count and vram count KFD compute nodes (so partitions): the
devices ``amd.com/gpu`` offers (labeller.model.offer), so labels and plugin count the same nodes (on a
node that serves AMD GPUs through DRA, the devices its ResourceSlices publish: every node);
device-id, family and product-name count physical GPUs (partitions have no PCI files there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.labels import KeyDoc, Labeler, Labels, derived, is_valid_value, sanitise_value
from labeller.model.offer import Offer
from vendors.amd.devices import VENDOR, AmdDevice, devices
from vendors.amd.model import AmdComputeNode, AmdGpu, AmdInventory
from vendors.amd.settings import AmdSettings

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


def count_labels(kind: str, values: Iterable[str], config: Config, source: str = "", rule: str = "",
                 unit: str = "GPU") -> Labels:
    """The beta and new-style labels for one kind, from one value per GPU entry (a ``unit``); ``source``
    and ``rule`` say where each value came from and how it was made."""
    counts = Counter(v for v in values if v)
    labels: Labels = {}
    if not counts:
        return labels
    total = sum(counts.values())
    single = next(iter(counts)) if len(counts) == 1 else None
    made = f"{rule}; " if rule else ""

    def plain(value: str) -> str:
        return derived(value, "sysfs", source, f"{made}the one value of all {total} {unit}(s)")

    def counted(value: str, count: int) -> str:
        return derived(str(count), "sysfs", source, f"{made}{count} of {total} {unit}(s) have {kind} {value}")

    if config.section(AmdSettings).beta_labels:
        for value, count in counts.items():
            labels[f"{BETA}{kind}.{value}"] = counted(value, count)
        if single is not None:
            labels[f"{BETA}{kind}"] = plain(single)
    if config.section(AmdSettings).labels:
        if single is not None:
            labels[f"{NEW}{kind}"] = plain(single)
        else:
            for value, count in counts.items():
                labels[f"{NEW}{kind}.{value}"] = counted(value, count)
    return labels


def _gpus(inventory: Inventory) -> tuple[AmdGpu, ...]:
    part = inventory.part(AmdInventory)
    return part.gpus if part is not None else ()


def _offered_nodes(inventory: Inventory, config: Config, offer: Offer) -> list[AmdComputeNode]:
    """The KFD nodes the device plugin offers, or, where DRA serves AMD GPUs, those it publishes (all)."""
    if config.served_by_dra(VENDOR):
        return [d.node for d in devices(_gpus(inventory))]
    return [d.node for r in offer.of_vendor(VENDOR) for d in r.physical_devices if isinstance(d, AmdDevice)]


def _per_node(kind: str, value_of: Callable[[int, int, int | None], str | None], source: str, rule: str) -> Labeler:
    """A labeler over the KFD nodes offered; ``value_of(simd_count, simd_per_cu, vram_bytes)``;
    ``source``: the KFD files read, under each node's directory."""

    def labeler(inventory: Inventory, config: Config, offer: Offer) -> Labels:
        nodes = _offered_nodes(inventory, config, offer)
        values = (value_of(n.simd_count, n.simd_per_cu, n.vram_bytes) for n in nodes)
        where = f"/sys/class/kfd/kfd/topology/nodes/{_node_range(nodes)}/{source}"
        return count_labels(kind, (v for v in values if v), config, where, rule, "KFD node")

    labeler.__name__ = f"amd_{kind.replace('-', '_')}_labels"
    return labeler


def _node_range(nodes: list[AmdComputeNode]) -> str:
    numbers = sorted(n.kfd_node for n in nodes)
    if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{{{numbers[0]}..{numbers[-1]}}}"
    return f"{{{','.join(map(str, numbers))}}}" if len(numbers) > 1 else "".join(map(str, numbers))


def _per_gpu(kind: str, value_of: Callable[[AmdGpu], str | None], source: str, rule: str,
             read: Callable[[AmdGpu], object]) -> Labeler:
    """A labeler over the physical GPUs; ``read(gpu)``: what the source said, for people."""

    def labeler(inventory: Inventory, config: Config, offer: Offer) -> Labels:
        gpus = _gpus(inventory)
        values = (value_of(gpu) for gpu in gpus)
        said = ", ".join(dict.fromkeys(repr(read(g)) for g in gpus))
        where = f"{source} of {', '.join(g.bdf for g in gpus[:4])}{', ...' if len(gpus) > 4 else ''}: {said}"
        return count_labels(kind, (v for v in values if v), config, where, rule)

    labeler.__name__ = f"amd_{kind.replace('-', '_')}_labels"
    return labeler


vram_labels = _per_node("vram", lambda simd, per_cu, vram: vram_gib_label(vram) if vram is not None else None,
                        "mem_banks/0/properties size_in_bytes",
                        "AMD's round(bytes // 2^20 / 1024) in GiB, halves away from zero, 'G' appended")
simd_count_labels = _per_node("simd-count", lambda simd, per_cu, vram: str(simd), "properties simd_count",
                              "the count as KFD gives it")
cu_count_labels = _per_node("cu-count", lambda simd, per_cu, vram: str(simd // per_cu) if per_cu > 0 else None,
                            "properties simd_count / simd_per_cu", "simd_count // simd_per_cu")
device_id_labels = _per_gpu("device-id", lambda gpu: f"{gpu.device_id:x}", "/sys/bus/pci/devices/<bdf>/device",
                            "lower-case hex without 0x", lambda gpu: f"0x{gpu.device_id:04x}")
family_labels = _per_gpu("family", lambda gpu: gpu.family,
                         "KFD gfx_target_version (else the PCI device id)",
                         "libdrm's family code (vendors/amd/ids.py)",
                         lambda gpu: gpu.nodes[0].gfx_target_version if gpu.nodes else f"0x{gpu.device_id:04x}")
product_name_labels = _per_gpu("product-name", lambda gpu: product_name_value(gpu.product_name or "") or None,
                               "/sys/class/drm/card<N>/device/product_name (board FRU; else the amdgpu.ids name)",
                               "AMD's replacements: ' ' to '_', '(' and ')' dropped; ours: '/' to '_'",
                               lambda gpu: gpu.product_name)


def _driver_label(kind: str, value_of: Callable[[AmdInventory], str], source: str) -> Labeler:
    """amd.com only; AMD writes the empty value when the module has no such file (in-tree amdgpu)."""

    def labeler(inventory: Inventory, config: Config, offer: Offer) -> Labels:
        part = inventory.part(AmdInventory)
        if not config.section(AmdSettings).labels or part is None or not part.gpus:
            return {}
        value = value_of(part)
        rule = "as read" if is_valid_value(value) else "bad characters to '-', trimmed to 63 characters"
        if not value:
            rule = "empty: the module has no such file (in-tree amdgpu), as AMD's labeller writes it"
        return {f"{NEW}{kind}": derived(value if is_valid_value(value) else sanitise_value(value), "sysfs",
                                        f"{source} = {value!r}", rule)}

    labeler.__name__ = f"amd_{kind.replace('-', '_')}_labels"
    return labeler


driver_version_labels = _driver_label("driver-version", lambda amd: amd.driver_version, "/sys/module/amdgpu/version")
driver_src_version_labels = _driver_label("driver-src-version", lambda amd: amd.driver_src_version,
                                          "/sys/module/amdgpu/srcversion")


def firmware_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """``beta.amd.com/gpu.firmware.<BLOCK>.{feat,fw}.<decimal>=<count>``; opt-in via ``labels.firmware``."""
    if not config.section(AmdSettings).firmware_labels:
        return {}
    counts: Counter[str] = Counter()
    gpus = _gpus(inventory)
    for gpu in gpus:
        for block, feature, version in gpu.firmware:
            counts[f"{BETA}firmware.{block}.feat.{feature}"] += 1
            counts[f"{BETA}firmware.{block}.fw.{version}"] += 1
    source = "debugfs /sys/kernel/debug/dri/<card>/amdgpu_firmware_info of each GPU"
    return {key: derived(str(count), "debugfs", source,
                         f"{count} of {len(gpus)} GPU(s) have this firmware; versions in decimal")
            for key, count in counts.items()}


def compute_memory_partition_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """``<compute>_<memory>`` only when every GPU that reports both agrees (AMD emits nothing otherwise)."""
    modes = {f"{g.compute_partition}_{g.memory_partition}" for g in _gpus(inventory)
             if g.compute_partition and g.memory_partition}
    if not config.section(AmdSettings).labels or len(modes) != 1:
        return {}
    source = "/sys/module/amdgpu/drivers/pci:amdgpu/<bdf>/current_compute_partition and current_memory_partition"
    return {f"{NEW}compute-memory-partition": derived(modes.pop(), "sysfs", source,
                                                      "'<compute>_<memory>', lower-case, when every GPU agrees")}


def partitioning_supported_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """From the first GPU in PCI address order, as AMD's sorted ``pci:amdgpu`` glob gives it."""
    gpus = sorted(_gpus(inventory), key=lambda g: g.bdf)
    if not config.section(AmdSettings).labels or not gpus:
        return {}
    where = f"/sys/module/amdgpu/drivers/pci:amdgpu/{gpus[0].bdf}"
    rule = "true when the file exists on the first GPU in PCI address order"
    return {
        f"{NEW}compute-partitioning-supported": derived(str(gpus[0].compute_partitioning_supported).lower(), "sysfs",
                                                        f"{where}/available_compute_partition", rule),
        f"{NEW}memory-partitioning-supported": derived(str(gpus[0].memory_partitioning_supported).lower(), "sysfs",
                                                       f"{where}/available_memory_partition", rule),
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


# --- for people: every key family above, who else writes it and when it is written -------------

_AMD = "AMD k8s-node-labeller (ROCm/k8s-device-plugin)"
_COUNTED = ("vram", "simd-count", "cu-count", "device-id", "family", "product-name")


def _vram_missing(inventory: Inventory) -> str:
    """Why no ``vram`` key can be written: no KFD node the probe found has a VRAM size."""
    nodes = [node for gpu in _gpus(inventory) for node in gpu.nodes]
    if not nodes or any(node.vram_bytes is not None for node in nodes):
        return ""
    return ("the probe found no VRAM size for any GPU (KFD nodes without mem_banks/0/properties size_in_bytes; "
            "`gpu-labeller probe` shows vram_bytes: null)")


_KIND_MEANINGS = {
    "vram": "the memory of one GPU (partition), whole GiB as `<n>G`",
    "simd-count": "the SIMD units of one GPU (partition)",
    "cu-count": "the compute units of one GPU (partition)",
    "device-id": "the PCI device id, lower-case hex",
    "family": "libdrm's family code (`AI`, `NV`, ...)",
    "product-name": "the product name (the board's FRU, else amdgpu.ids), with AMD's replacements",
}


def _counted_docs(kind: str) -> tuple[KeyDoc, ...]:
    one = "all GPUs (KFD nodes for vram, simd-count, cu-count) agree on one value"
    several = "the GPUs (KFD nodes for vram, simd-count, cu-count) have several values: one key per value"
    each = "the GPUs (KFD nodes for vram, simd-count, cu-count) have the value: one key per value, counting them"
    missing = _vram_missing if kind == "vram" else None
    value = _KIND_MEANINGS[kind]
    count = f"how many GPUs (partitions for vram, simd-count, cu-count) have that {kind}"
    return (
        KeyDoc(f"{NEW}{kind}", _AMD, one, "amd", missing=missing, meaning=value),
        KeyDoc(f"{NEW}{kind}.<value>", _AMD, several, "amd", missing=missing, meaning=count),
        KeyDoc(f"{BETA}{kind}", _AMD, one, "amdBeta", missing=missing, meaning=value),
        KeyDoc(f"{BETA}{kind}.<value>", _AMD, each, "amdBeta", missing=missing, meaning=count),
    )


_SUPPORTED = "`true` when the driver offers {} partitioning (the first GPU in PCI order)"
KEY_DOCS: tuple[KeyDoc, ...] = (
    *(doc for kind in _COUNTED for doc in _counted_docs(kind)),
    KeyDoc(f"{NEW}driver-version", _AMD, "an AMD GPU is described (empty with in-tree amdgpu)", "amd",
           meaning="the amdgpu module's version (empty with the kernel's own amdgpu)"),
    KeyDoc(f"{NEW}driver-src-version", _AMD, "an AMD GPU is described (empty with in-tree amdgpu)", "amd",
           meaning="the amdgpu module's source version (empty with the kernel's own amdgpu)"),
    KeyDoc(f"{NEW}compute-memory-partition", _AMD,
           "every GPU reports compute and memory partition modes, and they agree", "amd",
           meaning="the partition modes, `<compute>_<memory>` (`cpx_nps4`)"),
    KeyDoc(f"{NEW}compute-partitioning-supported", _AMD, "an AMD GPU is described", "amd",
           meaning=_SUPPORTED.format("compute")),
    KeyDoc(f"{NEW}memory-partitioning-supported", _AMD, "an AMD GPU is described", "amd",
           meaning=_SUPPORTED.format("memory")),
    KeyDoc(f"{BETA}firmware.<block>.feat.<version>", _AMD, "labeller.labels.firmware is on and debugfs is readable",
           "firmware", meaning="how many GPUs run that feature version of the firmware block (decimal)"),
    KeyDoc(f"{BETA}firmware.<block>.fw.<version>", _AMD, "labeller.labels.firmware is on and debugfs is readable",
           "firmware", meaning="how many GPUs run that version of the firmware block (decimal)"),
)
