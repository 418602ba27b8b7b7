"""NVIDIA's devices as its DRA driver (``gpu.nvidia.com``, NVIDIA k8s-dra-driver-gpu) publishes them.

A GPU with MIG off is one device, ``gpu-<minor>`` (``type=gpu``); a GPU with MIG on is its MIG
devices that exist (``type=mig``), never the GPU itself, whatever ``flags.migStrategy`` says
(that flag is the device plugin's). Attribute and capacity names, types and value forms are those
of NVIDIA's current driver (``cmd/gpu-kubelet-plugin/deviceinfo.go`` and ``mig.go`` of its main
branch, since v25.12.0), so a DeviceClass or CEL selector written for its driver selects the same
devices here: the GPU's PCI address and root complex are Kubernetes' standard
``resource.kubernetes.io/pciBusID`` and ``resource.kubernetes.io/pcieRoot``, and a MIG device
carries its GPU's.

A MIG device is named as NVIDIA's names it, ``gpu-<minor>-mig-<profile>-<GI profile id>-<start>``
(``gpu-4-mig-1g5gb-19-0``: the profile name without dots and made a DNS label, ``1g.10gb+me`` is
``1g10gb-me``), and publishes ``memorySlice<start>`` ... ``memorySlice<start + size - 1>``: the
profile id and the placement (the memory slices) of its GPU instance, as nvmlGpuInstanceGetInfo
gives them. Where the probe could not read the placement, or the GPU instance is split into compute
instances (one MIG device each, which NVIDIA's driver does not publish, and which would share that
name), the name is ``gpu-<minor>-mig-gi<GI id>-ci<CI id>`` and ``memorySlice<i>`` is left out.

Where the inventory does not hold a value, the attribute is left out (docs/dra.md, "Where ours
differ"): ``addressingMode`` before driver 580, ``pcieRoot`` where sysfs does not link the GPU
into a PCI root complex.
"""

from __future__ import annotations

from collections.abc import Callable

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import Offer
from labeller.model.resourceslices import (PCI_BUS_ID, PCIE_ROOT, Attribute, Capacity, DraDevice, Version, pcie_root,
                                           semver)
from labeller.model.vendor.dra import AttributeDoc, DraState
from labeller.model.vendor.plugin import Fault
from vendors.nvidia import dynamicmig
from vendors.nvidia.devices import partition, whole
from vendors.nvidia.facts import MIB, profile_label
from vendors.nvidia.model import MigDevice, NvidiaGpu, NvidiaInventory

DRIVER = "gpu.nvidia.com"
UPSTREAM = "NVIDIA k8s-dra-driver-gpu (gpu.nvidia.com)"
# NVIDIA's driver's health taint keys (cmd/gpu-kubelet-plugin/device_health.go: TaintKeyXID, TaintKeyGPULost,
# TaintKeyUnmonitored), by the kind of fault our checks report.
TAINT_KEYS = {Fault.XID: f"{DRIVER}/xid", Fault.LOST: f"{DRIVER}/gpu-lost", Fault.UNMONITORED: f"{DRIVER}/unmonitored"}

# compute capability -> the architecture NVML reports (as go-nvlib writes nvmlDeviceGetArchitecture);
# a major not listed leaves the attribute out.
_ARCHITECTURES: dict[int, Callable[[int], str]] = {
    3: lambda minor: "Kepler",
    5: lambda minor: "Maxwell",
    6: lambda minor: "Pascal",
    7: lambda minor: "Volta" if minor < 5 else "Turing",
    8: lambda minor: "Ampere" if minor < 9 else "Ada Lovelace",
    9: lambda minor: "Hopper",
    10: lambda minor: "Blackwell",
    12: lambda minor: "Blackwell",
}
_MIG_ENGINES = (  # capacity, MigDevice field, nvmlDeviceGetAttributes field, for people
    ("copyEngines", "engines_copy", "sharedCopyEngineCount", "copy engines"),
    ("decoders", "engines_decoder", "sharedDecoderCount", "video decoders"),
    ("encoders", "engines_encoder", "sharedEncoderCount", "video encoders"),
    ("jpegEngines", "engines_jpeg", "sharedJpegCount", "JPEG decoders"),
    ("ofaEngines", "engines_ofa", "sharedOfaCount", "optical flow accelerators"),
)


def _ref(gpu: NvidiaGpu) -> str:
    return f"GPU {gpu.index} ({gpu.uuid})"


def architecture(major: int, minor: int) -> str | None:
    rule = _ARCHITECTURES.get(major)
    return rule(minor) if rule else None


def gpu_attributes(inventory: Inventory, part: NvidiaInventory, gpu: NvidiaGpu) -> dict[str, Attribute]:
    """What a whole GPU and each of its MIG devices publish alike: product, brand, architecture,
    versions, addressing mode, PCI address and root complex."""
    attributes: dict[str, Attribute] = {}
    if gpu.name:
        attributes["productName"] = Attribute(gpu.name, "nvml", f"nvmlDeviceGetName({_ref(gpu)}) = {gpu.name!r}")
    if gpu.brand is not None:
        attributes["brand"] = Attribute(gpu.brand, "nvml", f"nvmlDeviceGetBrand({_ref(gpu)})",
                                        "the brand's name as go-nvlib writes it (NVML_BRAND_NVIDIA is Nvidia)")
    if gpu.compute_capability is not None:
        major, minor = gpu.compute_capability
        source = f"nvmlDeviceGetCudaComputeCapability({_ref(gpu)}) = ({major}, {minor})"
        attributes["cudaComputeCapability"] = Attribute(Version(f"{major}.{minor}.0"), "nvml", source,
                                                        "<major>.<minor> as a semantic version")
        if (arch := architecture(major, minor)) is not None:
            attributes["architecture"] = Attribute(arch, "nvml", source, f"compute capability {major}.{minor} is "
                                                   f"{arch} (nvmlDeviceGetArchitecture is not read)")
    if (driver := semver(part.driver_version)) is not None:
        attributes["driverVersion"] = Attribute(driver, "nvml",
                                                f"nvmlSystemGetDriverVersion() = {part.driver_version!r}",
                                                "as a semantic version, missing parts 0")
    if part.cuda_driver_version > 0:
        cuda = part.cuda_driver_version
        attributes["cudaDriverVersion"] = Attribute(
            Version(f"{cuda // 1000}.{cuda % 1000 // 10}.0"), "nvml", f"nvmlSystemGetCudaDriverVersion() = {cuda}",
            "<n // 1000>.<n % 1000 // 10> as a semantic version")
    if gpu.addressing_mode is not None:
        attributes["addressingMode"] = Attribute(gpu.addressing_mode, "nvml",
                                                 f"nvmlDeviceGetAddressingMode({_ref(gpu)}) = {gpu.addressing_mode}")
    attributes[PCI_BUS_ID] = Attribute(gpu.pci_bus_id, "nvml", f"nvmlDeviceGetPciInfo({_ref(gpu)}).busId",
                                       "lower-case, 4-digit domain")
    attributes.update(pcie_root(inventory, gpu.pci_bus_id))
    return attributes


def _name(gpu: NvidiaGpu) -> str:
    """``gpu-<minor>`` (NVIDIA's); ``gpu-nvml<index>`` where NVML gave no minor number."""
    return f"gpu-{gpu.minor_number}" if gpu.minor_number is not None else f"gpu-nvml{gpu.index}"


def gpu_device(inventory: Inventory, part: NvidiaInventory, gpu: NvidiaGpu, config: Config) -> DraDevice:
    attributes = {
        "type": Attribute("gpu", "nvml", f"nvmlDeviceGetMigMode({_ref(gpu)}): MIG "
                          f"{'not supported' if not gpu.mig_capable else 'disabled'}",
                          "a GPU without MIG is one device"),
        "uuid": Attribute(gpu.uuid, "nvml", f"nvmlDeviceGetUUID(GPU {gpu.index}) = {gpu.uuid!r}"),
        **gpu_attributes(inventory, part, gpu),
    }
    capacity = {}
    if gpu.memory_bytes > 0:
        capacity["memory"] = Capacity(gpu.memory_bytes, "nvml",
                                      f"nvmlDeviceGetMemoryInfo({_ref(gpu)}).total = {gpu.memory_bytes} bytes")
    return DraDevice(_name(gpu), whole(gpu, config), attributes, capacity)


def _placed(mig: MigDevice) -> range | None:
    """The memory slices that name the MIG device as NVIDIA's driver does: known, and the MIG device
    is its whole GPU instance (one compute instance spanning it, as NVIDIA's driver publishes)."""
    whole_instance = mig.slices_ci == mig.slices_gi
    return mig.memory_slices if whole_instance and mig.gpu_instance_profile_id is not None else None


def _mig_name(gpu: NvidiaGpu, mig: MigDevice) -> str:
    if (slices := _placed(mig)) is not None:
        return f"{_name(gpu)}-mig-{profile_label(mig.profile)}-{mig.gpu_instance_profile_id}-{slices.start}"
    if mig.gpu_instance_id is not None and mig.compute_instance_id is not None:
        return f"{_name(gpu)}-mig-gi{mig.gpu_instance_id}-ci{mig.compute_instance_id}"
    return f"{_name(gpu)}-mig-{mig.index}"


def _memory_slices(gpu: NvidiaGpu, mig: MigDevice) -> dict[str, Capacity]:
    """``memorySlice<i>`` = 1 for each memory slice the MIG device's GPU instance occupies."""
    slices = _placed(mig)
    if slices is None:
        return {}
    source = (f"nvmlGpuInstanceGetInfo(GPU instance {mig.gpu_instance_id} of {_ref(gpu)}): profileId "
              f"{mig.gpu_instance_profile_id}, placement {slices.start}:{len(slices)}")
    rule = "1 for each memory slice the placement covers: start to start + size - 1"
    return {f"memorySlice{i}": Capacity(1, "nvml", source, rule) for i in slices}


def mig_device(inventory: Inventory, part: NvidiaInventory, gpu: NvidiaGpu, mig: MigDevice, config: Config
               ) -> DraDevice:
    where = f"MIG {mig.uuid}"
    attributes = {
        "type": Attribute("mig", "nvml", f"nvmlDeviceGetMigMode({_ref(gpu)}): MIG enabled",
                          "a GPU with MIG on is its MIG devices"),
        "uuid": Attribute(mig.uuid, "nvml", f"nvmlDeviceGetUUID({where}) = {mig.uuid!r}"),
        "parentUUID": Attribute(gpu.uuid, "nvml", f"nvmlDeviceGetUUID(GPU {gpu.index}) = {gpu.uuid!r}",
                                "the GPU the MIG device is part of"),
        "profile": Attribute(mig.profile, "nvml", f"the GPU and compute instance profiles of {where}",
                             "the profile name go-nvlib gives"),
        **gpu_attributes(inventory, part, gpu),  # the parent's product, versions, PCI address..., as NVIDIA's
    }
    capacity = {name: Capacity(getattr(mig, field), "nvml", f"nvmlDeviceGetAttributes({where}).{call}")
                for name, field, call, _ in _MIG_ENGINES}
    if mig.multiprocessors > 0:
        capacity["multiprocessors"] = Capacity(mig.multiprocessors, "nvml",
                                               f"nvmlDeviceGetAttributes({where}).multiprocessorCount")
    if mig.memory_mib > 0:
        capacity["memory"] = Capacity(mig.memory_mib * MIB, "nvml",
                                      f"nvmlDeviceGetAttributes({where}).memorySizeMB = {mig.memory_mib}", "MiB * 2^20")
    capacity.update(_memory_slices(gpu, mig))
    return DraDevice(_mig_name(gpu, mig), partition(gpu, mig, config), attributes, capacity)


def devices(inventory: Inventory, offer: Offer, config: Config, state: DraState | None = None) -> list[DraDevice]:
    """Every GPU with MIG off, and every MIG device of the others, in NVML index order; with
    ``labeller.dra.dynamicMig`` (and an API server that keeps counters), a MIG-enabled GPU is its
    counter set and a device per MIG profile and placement (``vendors.nvidia.dynamicmig``), besides
    the MIG devices someone else made."""
    part = inventory.part(NvidiaInventory)
    if part is None:
        return []
    state = state or DraState()
    dynamic = config.dra_dynamic_mig and state.counters
    out: list[DraDevice] = []
    for gpu in sorted(part.gpus, key=lambda g: g.index):
        if not gpu.mig_enabled:
            out.append(gpu_device(inventory, part, gpu, config))
            continue
        split = None
        if dynamic:
            split = dynamicmig.partitioned(gpu, state.made, _name(gpu),
                                           {mig.uuid: _mig_name(gpu, mig) for mig in gpu.mig_devices},
                                           gpu_attributes(inventory, part, gpu))
        theirs = gpu.mig_devices if split is None else split.theirs
        out.extend(mig_device(inventory, part, gpu, mig, config) for mig in theirs)
        out.extend(split.devices if split is not None else ())
    return out


_SAME = "same name, type and value form"
_STANDARD = f"Kubernetes' standard attribute, published by {UPSTREAM}"
ATTRIBUTE_DOCS: tuple[AttributeDoc, ...] = (
    AttributeDoc("type", "string", "gpu (a whole GPU, MIG off) or mig (a MIG device)", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("uuid", "string", "the GPU's or MIG device's UUID (NVML)", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("parentUUID", "string", "a MIG device's GPU's UUID", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("profile", "string", "a MIG device's profile, e.g. 1g.10gb", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("productName", "string", "the GPU's name as NVML gives it (a MIG device: its GPU's)",
                 f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("brand", "string", "the GPU's brand as go-nvlib names NVML's (nvmlDeviceGetBrand): Nvidia for the "
                 "data-center GPUs, GeForceRTX, NvidiaRTX, Tesla, ... (a MIG device: its GPU's); left out for a brand "
                 "go-nvlib has no name for", f"{UPSTREAM}: {_SAME}; NVIDIA's fails to start on such a brand"),
    AttributeDoc("architecture", "string", "Kepler ... Blackwell, from the compute capability",
                 f"{UPSTREAM}: same values; NVIDIA's asks NVML (nvmlDeviceGetArchitecture), ours maps the compute "
                 "capability, and leaves the attribute out for one it does not know"),
    AttributeDoc("cudaComputeCapability", "version", "the compute capability, e.g. 9.0.0", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("driverVersion", "version", "the NVIDIA driver version, e.g. 550.54.15", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("cudaDriverVersion", "version", "the CUDA version the driver supports, e.g. 12.4.0",
                 f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("addressingMode", "string", "how the GPU addresses system memory (nvmlDeviceGetAddressingMode): "
                 "HMM, ATS, or None where the platform could but neither is active (a MIG device: its GPU's); left "
                 "out where NVML has no answer (drivers before 580, platforms without it)", f"{UPSTREAM}: {_SAME}"),
    AttributeDoc(PCI_BUS_ID, "string", "the GPU's PCI address, e.g. 0000:18:00.0 (a MIG device: its GPU's)",
                 f"{_STANDARD}: {_SAME}"),
    AttributeDoc(PCIE_ROOT, "string", "the PCI root complex above the GPU, pci<domain>:<bus> (a MIG device: its "
                 "GPU's): GPUs with the same value hang off one root complex; left out where "
                 "/sys/bus/pci/devices/<bdf> does not link into one", f"{_STANDARD}: {_SAME}"),
    AttributeDoc("pcieBusID", "string", "no longer published: the GPU's PCI address is resource.kubernetes.io/pciBusID",
                 f"{UPSTREAM}: published it until v25.8; renamed in v25.12.0", renamed_to=PCI_BUS_ID),
    AttributeDoc("memory", "capacity", "bytes of memory (NVML); left out when NVML gives none",
                 f"{UPSTREAM}: {_SAME}"),
    AttributeDoc("multiprocessors", "capacity", "a MIG device's streaming multiprocessors",
                 f"{UPSTREAM}: same name; NVIDIA's reads its GPU instance profile, ours the MIG device's attributes "
                 "(the same for the profiles NVIDIA's publishes)"),
    *(AttributeDoc(name, "capacity", f"a MIG device's {what}",
                   f"{UPSTREAM}: same name; NVIDIA's reads its GPU instance profile, ours the MIG device's attributes")
      for name, _, _, what in _MIG_ENGINES),
    AttributeDoc("memorySlice<i>", "capacity",
                 "1 for each GPU memory slice a MIG device's GPU instance occupies (its placement, "
                 "nvmlGpuInstanceGetInfo), whose start with the profile and its id also names the device "
                 "gpu-<minor>-mig-<profile>-<profile id>-<start>; left out where the placement was not read "
                 "or the GPU instance is split into compute instances (then named gpu-<minor>-mig-gi<GI id>-ci<CI id>)",
                 f"{UPSTREAM}: {_SAME}; NVIDIA's does not publish MIG devices of split GPU instances"),
)
