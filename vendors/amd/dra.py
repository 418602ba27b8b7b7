"""AMD's devices as its DRA driver (``gpu.amd.com``, AMD k8s-gpu-dra-driver) publishes them.

One device per KFD compute node, as the device plugin serves them: a whole GPU (``type=amdgpu``),
or each partition of a GPU in a compute partition mode other than SPX (``type=amdgpu-partition``),
named ``gpu-<card>-<render>`` after its DRM card and render node. Attribute and capacity names,
types and value forms are AMD's; a partition carries its GPU's ``deviceID``, ``productName``,
``driverVersion``, ``numaNode``, ``resource.kubernetes.io/pciBusID`` (the same for all its
partitions: ``matchAttribute`` on it keeps partitions on one GPU) and
``resource.kubernetes.io/pcieRoot`` (the PCI root complex above the GPU: ``matchAttribute`` on it
keeps GPUs under one root).

Where the inventory does not hold a value, the attribute or capacity is left out (docs/dra.md, "Where
ours differ"); AMD's driver publishes ``memory: 0`` (or a default size) for VRAM it cannot
read, ours publishes no ``memory``. A node whose DRM card is unknown (a KFD capture) is
``gpu-render<minor>``.
"""

from __future__ import annotations

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import Offer
from labeller.model.resourceslices import PCI_BUS_ID, PCIE_ROOT, Attribute, Capacity, DraDevice, pcie_root, semver
from labeller.model.vendor.dra import AttributeDoc, DraState
from labeller.model.vendor.plugin import Fault
from vendors.amd import devices as kfd
from vendors.amd import dynamicpartitions
from vendors.amd.devices import AmdDevice
from vendors.amd.model import AmdGpu, AmdInventory

DRIVER = "gpu.amd.com"
UPSTREAM = "AMD k8s-gpu-dra-driver (gpu.amd.com)"
# AMD's driver publishes no taints. A compute node (a GPU, or one partition of it) whose KFD topology node is gone
# is tainted in the driver's domain, named as NVIDIA names a lost GPU (<what>-lost, kebab-case as taint keys are):
# the KFD node is what went, and "gpu-lost" would be wrong for one partition of a GPU whose others still answer.
TAINT_KEYS = {Fault.LOST: f"{DRIVER}/kfd-node-lost"}
_TOPOLOGY = "/sys/class/kfd/kfd/topology/nodes"


def product_name(name: str) -> str:
    """AMD's driver's form of the board's product name: ' ' to '_', '(' and ')' dropped."""
    return name.strip().replace(" ", "_").replace("(", "").replace(")", "")


def is_partition(gpu: AmdGpu) -> bool:
    """A GPU in a compute partition mode other than SPX is its partitions (AMD's rule), and so is one
    KFD shows as several compute nodes whatever its partition files say."""
    return len(gpu.nodes) > 1 or gpu.compute_partition not in (None, "spx")


def _name(device: AmdDevice) -> str:
    node = device.node
    return f"gpu-{node.card}-{node.render_minor}" if node.card is not None else f"gpu-render{node.render_minor}"


def _attributes(inventory: Inventory, part: AmdInventory, device: AmdDevice) -> dict[str, Attribute]:
    gpu = device.amd_gpu
    partition = is_partition(gpu)
    pci = f"/sys/bus/pci/devices/{gpu.bdf}"
    attributes = {
        "type": Attribute("amdgpu-partition" if partition else "amdgpu", "sysfs",
                          f"{pci}: compute partition {gpu.compute_partition or 'not given'}, "
                          f"{len(gpu.nodes)} KFD compute node(s)", "a GPU in CPX, DPX, ... mode is its partitions"),
        "deviceID": Attribute(f"0x{gpu.device_id:04x}", "sysfs", f"{pci}/device = 0x{gpu.device_id:04x}",
                              "the GPU's (a partition's parent's)"),
        PCI_BUS_ID: Attribute(gpu.bdf, "sysfs", pci, "the GPU's PCI address (a partition's parent's)"),
        **pcie_root(inventory, gpu.bdf),
    }
    if gpu.product_name:
        attributes["productName"] = Attribute(
            product_name(gpu.product_name), "sysfs",
            f"/sys/class/drm/card<N>/device/product_name (else amdgpu.ids) = {gpu.product_name!r}",
            "AMD's replacements: ' ' to '_', '(' and ')' dropped")
    if (version := semver(part.driver_version)) is not None:
        source = f"/sys/module/amdgpu/version = {part.driver_version!r}"
        attributes["driverVersion"] = Attribute(version, "sysfs", source, "the first three parts, as AMD's driver")
        attributes["driverVersionFull"] = Attribute(part.driver_version, "sysfs", source)
    if gpu.compute_partition and gpu.memory_partition:
        attributes["partitionProfile"] = Attribute(
            f"{gpu.compute_partition}_{gpu.memory_partition}", "sysfs",
            f"{pci}/current_compute_partition = {gpu.compute_partition!r}, current_memory_partition = "
            f"{gpu.memory_partition!r}", "<compute>_<memory>, lower-case")
    if device.numa_node is not None:
        attributes["numaNode"] = Attribute(device.numa_node, "sysfs", f"{pci}/numa_node = {device.numa_node}",
                                           "the GPU's (a partition's parent's)")
    return attributes


def _capacity(device: AmdDevice) -> dict[str, Capacity]:
    node = device.node
    where = f"{_TOPOLOGY}/{node.kfd_node}"
    capacity = {}
    if node.vram_bytes:
        capacity["memory"] = Capacity(node.vram_bytes, "sysfs", f"{where}/mem_banks/0/properties size_in_bytes = "
                                      f"{node.vram_bytes}")
    if node.simd_count > 0:
        capacity["simdUnits"] = Capacity(node.simd_count, "sysfs", f"{where}/properties simd_count = {node.simd_count}")
        if node.simd_per_cu > 0:
            capacity["computeUnits"] = Capacity(node.simd_count // node.simd_per_cu, "sysfs",
                                                f"{where}/properties simd_count = {node.simd_count}, simd_per_cu = "
                                                f"{node.simd_per_cu}", "simd_count // simd_per_cu")
    return capacity


def devices(inventory: Inventory, offer: Offer, config: Config, state: DraState | None = None) -> list[DraDevice]:
    """One device per KFD compute node, in KFD order (the device plugin's order); with
    ``labeller.dra.dynamicMig`` (and an API server that keeps counters), a GPU that can switch its
    compute partition mode is its counter set and a device per partition of every mode
    (``vendors.amd.dynamicpartitions``)."""
    part = inventory.part(AmdInventory)
    if part is None:
        return []
    found = kfd.devices(part.gpus)
    dynamic = config.dra_dynamic_mig and (state or DraState()).counters
    out: list[DraDevice] = []
    for gpu in part.gpus:
        current = [d for d in found if d.amd_gpu is gpu]
        made = None
        if dynamic and current:
            shared = {key: value for key, value in _attributes(inventory, part, current[0]).items()
                      if key not in ("type", "partitionProfile")}
            made = dynamicpartitions.partitioned(gpu, current, shared)
        out.extend(made if made is not None else
                   (DraDevice(_name(d), d, _attributes(inventory, part, d), _capacity(d)) for d in current))
    return out


_SAME = "same name, type and value form"
_PARENT = "a partition: its GPU's"
ATTRIBUTE_DOCS: tuple[AttributeDoc, ...] = (
    AttributeDoc("type", "string", "amdgpu (a whole GPU) or amdgpu-partition (a partition of a GPU in CPX, DPX, ... "
                 "mode)", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("deviceID", "string", f"the PCI device id, e.g. 0x740f ({_PARENT})", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("productName", "string", f"the board's product name, ' ' as '_' ({_PARENT})",
                 f"{UPSTREAM}: same form; where the board has no product_name file, ours takes the amdgpu.ids name "
                 "(AMD's publishes an empty string)"),
    AttributeDoc("driverVersion", "version", "the amdgpu module's version, its first three parts; left out for the "
                 "in-tree module (no version)", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("driverVersionFull", "string", "the amdgpu module's version as written", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("partitionProfile", "string", "<compute>_<memory> partition mode, e.g. spx_nps1 or cpx_nps4; "
                 "left out where the GPU does not say", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("numaNode", "int", f"the NUMA node of the GPU ({_PARENT}); left out where the kernel gives none",
                 f"{UPSTREAM}: same name and type; AMD's skips a GPU whose numa_node file is unreadable"),
    AttributeDoc(PCI_BUS_ID, "string", f"the GPU's PCI address ({_PARENT}: the same for all its partitions)",
                 f"Kubernetes' standard attribute, published by {UPSTREAM}: {_SAME}"),
    AttributeDoc(PCIE_ROOT, "string", f"the PCI root complex above the GPU, pci<domain>:<bus> ({_PARENT}): GPUs "
                 "with the same value hang off one root complex; left out where /sys/bus/pci/devices/<bdf> does not "
                 "link into one", f"Kubernetes' standard attribute, published by {UPSTREAM}: {_SAME}"),
    AttributeDoc("memory", "capacity", "bytes of VRAM of the GPU or partition (KFD); left out when KFD gives none",
                 f"{UPSTREAM}: same name; AMD's publishes 0 (or a default size) for VRAM it cannot read"),
    AttributeDoc("computeUnits", "capacity", "compute units of the GPU or partition (KFD simd_count // simd_per_cu)",
                 f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("simdUnits", "capacity", "SIMD units of the GPU or partition (KFD simd_count)",
                 f"{UPSTREAM}: {_SAME}"),
)
