"""NVIDIA labels, as GPU Feature Discovery (GFD) v0.20 computes them.

Each labeler owns its own keys; they run only with the ``nvidia`` label group on. All but the
timestamp stay silent unless NVML described at least one GPU: a node where only the PCI scan saw
NVIDIA GPUs gets just ``nvidia.com/gpu.present`` (labeller.rules). The resource labels
(``gpu.count``, ``gpu.replicas``, ``gpu.sharing-strategy``, ``-SHARED``, ``mig-<profile>.*``) read
what the node offers (labeller.model.offer), the same objects the device plugin serves.

Where GFD is ambiguous we choose, and say so:
- Several GPU models on one node: GFD lets whichever name it iterates last win. We describe the
  model with the most GPUs (tie: the model of the lowest NVML index) and log a warning.
- MPS sharing configured while a GPU has MIG enabled: GFD fails the whole pass. The offer holds
  those MPS replicas back (MPS cannot share them), so ``mps.capable=false`` and the other labels stay.
- ``mps.capable`` is true only while MPS replicas are advertised, i.e. while the MPS control
  daemon serves them (GFD says true whenever the config asks for MPS).
- Sharing a subset of a resource's devices (``devices:``): ``count`` counts every device of the
  resource, ``replicas`` and ``sharing-strategy`` describe the shared ones, and
  ``<prefix>.shared-count`` (ours; GFD has no such key) says how many are shared.
- Sharing by memory (``sharing.memory``, gpushare's model; GFD has no such strategy):
  ``sharing-strategy=memory``, ``count`` the GPUs (``aliyun.com/gpu-count``), ``replicas`` the
  memory units of one GPU, no ``-SHARED``; and ``gpushare=true``, gpushare's node label.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence

from labeller.model.config import Config
from labeller.model.gpushare import RESOURCE_MEM
from labeller.model.inventory import Inventory
from labeller.model.labels import KeyDoc, Labeler, Labels, derived
from labeller.model.offer import Offer, Resource
from vendors.nvidia.devices import GPU, VENDOR, NvidiaDevice
from vendors.nvidia.facts import COMPUTE_CLASS, GRAPHICS_CLASS, MIB, PCI_VENDOR_ID, name_in_labels
from vendors.nvidia.model import MigDevice, NvidiaGpu, NvidiaInventory
from vendors.nvidia.settings import NvidiaSettings
from labeller.base.log import get_logger

log = get_logger(__name__)

TIMESTAMP = "nvidia.com/gfd.timestamp"
GPUSHARE_LABEL = "gpushare"  # gpushare's install docs: the node selector of its DaemonSets
# GFD computes its timestamp once per process start, not per pass; so do we.
_PROCESS_START = int(time.time())

# compute capability major -> family of (minor), as GFD getArchFamily; other majors are "undefined".
_FAMILIES: dict[int, Callable[[int], str]] = {
    1: lambda minor: "tesla",
    2: lambda minor: "fermi",
    3: lambda minor: "kepler",
    5: lambda minor: "maxwell",
    6: lambda minor: "pascal",
    7: lambda minor: "volta" if minor < 5 else "turing",
    8: lambda minor: "ampere" if minor < 9 else "ada-lovelace",
    9: lambda minor: "hopper",
    10: lambda minor: "blackwell",
    12: lambda minor: "blackwell",
    13: lambda minor: "rubin",
}

_NOT_KEPT = re.compile(r"[^A-Za-z0-9\-_. ]")
SANITISE_RULE = "GFD sanitise(): characters outside [A-Za-z0-9-_. ] removed, words joined with '-'"


def sanitise(text: str) -> str:
    """GFD's sanitise(): drop characters outside [A-Za-z0-9-_. ], join the words with '-'."""
    return "-".join(_NOT_KEPT.sub("", text).split())


def product_name(*parts: str) -> str:
    return "-".join(sanitise(part) for part in parts if part)


def mig_product_name(gpu_name: str, mig: MigDevice) -> str:
    """"NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me": the profile as in the resource name, where GFD's
    GetName writes "+" as "." (sanitise would otherwise drop it)."""
    return product_name(gpu_name, "MIG", name_in_labels(mig.profile))


def family(major: int, minor: int) -> str:
    rule = _FAMILIES.get(major)
    return rule(minor) if rule else "undefined"


def _nvidia(inventory: Inventory) -> NvidiaInventory | None:
    part = inventory.part(NvidiaInventory)
    return part if part is not None and part.gpus else None


def _gpus(inventory: Inventory) -> tuple[NvidiaGpu, ...]:
    part = _nvidia(inventory)
    return part.gpus if part is not None else ()


def _gpu_ref(gpu: NvidiaGpu) -> str:
    return f"GPU {gpu.index} ({gpu.uuid}, {gpu.pci_bus_id})"


def _gpu_range(gpus: Sequence[NvidiaGpu]) -> str:
    indices = sorted(g.index for g in gpus)
    if indices and indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 2:
        return f"GPUs {indices[0]}-{indices[-1]}"
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(map(str, indices))


# --- models --------------------------------------------------------------------------------------

def models(gpus: Sequence[NvidiaGpu]) -> dict[str, list[NvidiaGpu]]:
    """GPUs grouped by NVML name, in order of each model's lowest NVML index."""
    grouped: dict[str, list[NvidiaGpu]] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        grouped.setdefault(gpu.name, []).append(gpu)
    return grouped


def primary_model(gpus: Sequence[NvidiaGpu]) -> list[NvidiaGpu]:
    """The model the node-wide gpu.* labels describe: most GPUs, then lowest NVML index."""
    grouped = models(gpus)
    if len(grouped) > 1:
        log.warning("several NVIDIA GPU models on one node; gpu.* labels describe the most numerous",
                    vendor="nvidia", models={name: len(members) for name, members in grouped.items()})
    return max(grouped.values(), key=len)  # max keeps the first of equals: the lowest index


# --- small labelers -------------------------------------------------------------------------------

def machine_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    if _nvidia(inventory) is None or not config.section(NvidiaSettings).machine_label:
        return {}
    # As GFD: "unknown" only when the name cannot be read; an empty one stays empty.
    where = config.gfd.machine_type_file
    if inventory.machine is None:
        return {"nvidia.com/gpu.machine": derived("unknown", "dmi", f"{where}: cannot be read",
                                                   "GFD: unknown when the DMI product name cannot be read")}
    return {"nvidia.com/gpu.machine": derived(sanitise(inventory.machine), "dmi",
                                              f"{where} = {inventory.machine!r}", SANITISE_RULE)}


def _driver_version_labels(version: str) -> Labels:
    parts = version.split(".")
    if len(parts) not in (2, 3):
        log.warning("driver version is not <major>.<minor>[.<revision>]; driver labels omitted",
                    vendor="nvidia", driver_version=version)
        return {}
    source = f"nvmlSystemGetDriverVersion() = {version!r}"

    def part(n: int) -> str:
        rule = f"part {n + 1} of the version split on '.'" + (" (empty: a two-part version)" if n >= len(parts) else "")
        return derived(parts[n] if n < len(parts) else "", "nvml", source, rule)

    labels: Labels = {}
    for prefix, rev_key in (("nvidia.com/cuda.driver-version", "revision"), ("nvidia.com/cuda.driver", "rev")):
        labels |= {f"{prefix}.major": part(0), f"{prefix}.minor": part(1), f"{prefix}.{rev_key}": part(2)}
    labels["nvidia.com/cuda.driver-version.full"] = derived(version, "nvml", source, "the version as NVML reports it")
    return labels


def _runtime_version_labels(cuda_version: int) -> Labels:
    source = f"nvmlSystemGetCudaDriverVersion() = {cuda_version} (the newest CUDA the driver supports)"
    major = derived(str(cuda_version // 1000), "nvml", source, "v // 1000")
    minor = derived(str(cuda_version % 1000 // 10), "nvml", source, "(v % 1000) // 10")
    return {
        "nvidia.com/cuda.runtime-version.major": major,
        "nvidia.com/cuda.runtime-version.minor": minor,
        "nvidia.com/cuda.runtime-version.full": derived(f"{major}.{minor}", "nvml", source,
                                                        "'<v // 1000>.<(v % 1000) // 10>'"),
        "nvidia.com/cuda.runtime.major": major,
        "nvidia.com/cuda.runtime.minor": minor,
    }


def version_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    nvidia = _nvidia(inventory)
    if nvidia is None:
        return {}
    return _driver_version_labels(nvidia.driver_version) | _runtime_version_labels(nvidia.cuda_driver_version)


def mig_capability_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    if _nvidia(inventory) is None:
        return {}
    gpus = _gpus(inventory)
    capable = [g for g in gpus if g.mig_capable]
    said = f"supported on {_gpu_range(capable)}" if capable else "NOT_SUPPORTED on every GPU"
    return {"nvidia.com/mig.capable": derived(str(bool(capable)).lower(), "nvml",
                                              f"nvmlDeviceGetMigMode on {_gpu_range(gpus)}: {said}",
                                              "true when any GPU supports MIG")}


def mps_capability_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """true only while MPS replicas are advertised: configured, and served by the control daemon."""
    if _nvidia(inventory) is None:
        return {}
    served = [r.name for r in offer.of_vendor(VENDOR) if r.strategy == "mps"]
    source = (f"offer: MPS replicas advertised under {', '.join(served)}" if served
              else "offer: no MPS replicas advertised")
    for held in offer.held:
        if held.resource.vendor == VENDOR and held.resource.strategy == "mps":
            (log.info if held.waiting else log.error)("MPS replicas not advertised; mps.capable=false",
                                                      vendor=VENDOR, resource=held.resource.name, reason=held.reason)
            source += f"; {held.resource.name} held: {held.reason}"
    return {"nvidia.com/mps.capable": derived(str(bool(served)).lower(), "offer", source,
                                              "true only while the MPS control daemon serves the configured replicas")}


def gpu_mode_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """compute/graphics from each GPU's PCI class; disagreement or an unknown class gives unknown."""
    if _nvidia(inventory) is None:
        return {}
    modes = {COMPUTE_CLASS: "compute", GRAPHICS_CLASS: "graphics"}
    gpus = _gpus(inventory)
    seen = {modes.get(gpu.pci_class or 0, "unknown") for gpu in gpus}
    classes = sorted({f"{(gpu.pci_class or 0) >> 8:04x}" for gpu in gpus})
    return {"nvidia.com/gpu.mode": derived(
        seen.pop() if len(seen) == 1 else "unknown", "pci",
        f"/sys/bus/pci/devices/<bdf>/class of {_gpu_range(gpus)}: class {', '.join(classes)}",
        "class 0302 (3D controller) is compute, 0300 (VGA) graphics; GPUs that disagree or another class: unknown")}


def clique_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """Only when every fabric-attached GPU reports the same cluster UUID and clique id."""
    cliques = {gpu.clique for gpu in _gpus(inventory) if gpu.clique}
    if len(cliques) > 1:
        log.warning("GPUs disagree on their NVLink fabric clique; gpu.clique omitted",
                    vendor="nvidia", cliques=sorted(cliques))
    if len(cliques) != 1:
        return {}
    fabric = [g for g in _gpus(inventory) if g.clique]
    return {"nvidia.com/gpu.clique": derived(cliques.pop(), "nvml",
                                             f"nvmlDeviceGetGpuFabricInfo on {_gpu_range(fabric)}",
                                             "'<clusterUuid>.<cliqueId>' when every fabric-attached GPU agrees")}


def vgpu_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    nvidia = _nvidia(inventory)
    if nvidia is None or nvidia.vgpu_present is None:  # unknown: no label rather than a guess
        return {}
    source = "PCI config space of each NVIDIA GPU: NVIDIA's vendor capability 'VF' (else NVML's virtualization mode)"
    labels = {"nvidia.com/vgpu.present": derived(str(nvidia.vgpu_present).lower(), "pci", source,
                                                 "true when a GPU is a vGPU guest device")}
    if nvidia.vgpu_present and nvidia.vgpu_host_driver:
        version, branch = nvidia.vgpu_host_driver
        record = "record 0 of the 'VF' capability in PCI config space"
        labels["nvidia.com/vgpu.host-driver-version"] = derived(version, "pci", record, "the host driver version field")
        labels["nvidia.com/vgpu.host-driver-branch"] = derived(branch, "pci", record, "the host driver branch field")
    return labels


def mig_strategy_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    if _nvidia(inventory) is None or config.mig_strategy == "none":
        return {}
    return {"nvidia.com/mig.strategy": derived(config.mig_strategy, "config",
                                               f"flags.migStrategy = {config.mig_strategy}",
                                               "written when the strategy is not none")}


def timestamp_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """``gfd.timestamp`` (off by default: a changing value would make every restart a write)."""
    present = inventory.pci_gpus_of(PCI_VENDOR_ID) or _nvidia(inventory) is not None
    if not (config.section(NvidiaSettings).timestamp_label and present):
        return {}
    return {TIMESTAMP: derived(str(_PROCESS_START), "clock", "the process start time (labeller.labels.timestamp on)",
                               "Unix seconds, fixed for the life of the process")}


# --- resource labels: nvidia.com/gpu.* and nvidia.com/mig-<profile>.*, from the offer -----------

def _sharing_labels(prefix: str, product: str, product_source: str, resources: Sequence[Resource]) -> Labels:
    """product (+``-SHARED``), replicas and sharing-strategy of what is offered under ``prefix``
    (its whole devices and its replicas); nothing offered: GFD's ``replicas=0``."""
    shared = next((r for r in resources if r.shared), None)
    product_rule = f"{SANITISE_RULE}"
    if shared is not None and not shared.renamed:
        product += "-SHARED"
        product_rule += f"; '-SHARED' added: {shared.name} is shared ({shared.strategy}) without a rename"
    names = ", ".join(f"{r.name} ({len(r.physical_devices)} devices x {r.replicas})" for r in resources) or "nothing"
    offered = f"offer under {prefix}: {names}"
    entry = f"{offered}; config sharing.{'mps' if shared is not None and shared.strategy == 'mps' else 'timeSlicing'}"
    labels = {
        f"{prefix}.product": derived(product, "nvml", product_source, product_rule),
        f"{prefix}.replicas": derived(str(shared.replicas if shared is not None else (1 if resources else 0)), "offer",
                                      f"{entry}.resources[{prefix}].replicas" if shared is not None else offered,
                                      "the replicas of the shared devices; 1 unshared; 0 when nothing is offered"),
        f"{prefix}.sharing-strategy": derived(shared.strategy if shared is not None else "none", "offer", offered,
                                              "time-slicing or mps when the devices are shared, else none"),
    }
    if shared is not None and any(not r.shared for r in resources):
        labels[f"{prefix}.shared-count"] = derived(str(len(shared.physical_devices)), "offer",
                                                   f"{entry}.resources[{prefix}].devices",
                                                   f"ours: how many of the devices under {prefix} are shared")
    return labels


def _memory_sharing_labels(product: str, product_source: str, resources: Sequence[Resource],
                           model: NvidiaGpu) -> Labels:
    """Memory sharing (``aliyun.com/gpu-mem``, ``aliyun.com/gpu-count``): ``count`` GPUs, ``replicas``
    the memory units of one GPU of the model described (``count`` x ``replicas`` is what gpu-mem
    advertises when the GPUs are alike), ``sharing-strategy=memory``, no ``-SHARED`` (renamed)."""
    units = Counter(d.physical.health_key for r in resources if r.name == RESOURCE_MEM for d in r.devices
                    if isinstance(d.physical, NvidiaDevice) and d.physical.nvml_gpu.name == model.name)
    offered = "offer under nvidia.com/gpu: " + ", ".join(f"{r.name} ({len(r.devices)} devices)" for r in resources)
    return {
        f"{GPU}.product": derived(product, "nvml", product_source, SANITISE_RULE),
        f"{GPU}.replicas": derived(str(min(units.values(), default=0)), "offer",
                                   f"{offered}; config sharing.memory.unit",
                                   f"the {RESOURCE_MEM} units of one {model.name} "
                                   "(its memory, floored to whole units)"),
        f"{GPU}.sharing-strategy": derived("memory", "offer", offered,
                                           "memory when the GPUs are shared by memory "
                                           "(ours: GFD has no such strategy)"),
    }


def _model_labels(gpu: NvidiaGpu) -> Labels:
    """memory, family and compute capability of one model."""
    labels: Labels = {}
    if gpu.memory_bytes // MIB:
        labels[f"{GPU}.memory"] = derived(str(gpu.memory_bytes // MIB), "nvml",
                                          f"nvmlDeviceGetMemoryInfo({_gpu_ref(gpu)}).total = {gpu.memory_bytes} bytes",
                                          "bytes // 2^20: MiB, rounded down")
    if gpu.compute_capability and gpu.compute_capability[0]:
        major, minor = gpu.compute_capability
        source = f"nvmlDeviceGetCudaComputeCapability({_gpu_ref(gpu)}) = ({major}, {minor})"
        labels |= {f"{GPU}.family": derived(family(major, minor), "nvml", source,
                                            f"GFD getArchFamily: compute capability {major}.{minor} is "
                                            f"{family(major, minor)}"),
                   f"{GPU}.compute.major": derived(str(major), "nvml", source, "the major version"),
                   f"{GPU}.compute.minor": derived(str(minor), "nvml", source, "the minor version")}
    return labels


_MIG_ATTRIBUTES = (  # label suffix, MigDevice field, NVML attribute
    ("memory", "memory_mib", "memorySizeMB"),
    ("multiprocessors", "multiprocessors", "multiprocessorCount"),
    ("slices.gi", "slices_gi", "gpuInstanceSliceCount"),
    ("slices.ci", "slices_ci", "computeInstanceSliceCount"),
    ("engines.copy", "engines_copy", "sharedCopyEngineCount"),
    ("engines.decoder", "engines_decoder", "sharedDecoderCount"),
    ("engines.encoder", "engines_encoder", "sharedEncoderCount"),
    ("engines.jpeg", "engines_jpeg", "sharedJpegCount"),
    ("engines.ofa", "engines_ofa", "sharedOfaCount"),
)


def _mig_attribute_labels(prefix: str, mig: MigDevice) -> Labels:
    return {f"{prefix}.{suffix}": derived(str(getattr(mig, field)), "nvml",
                                          f"nvmlDeviceGetAttributes(MIG {mig.uuid}).{attribute}",
                                          f"of the first MIG device {mig.profile} offered")
            for suffix, field, attribute in _MIG_ATTRIBUTES}


def _count(prefix: str, count: int, what: str) -> Labels:
    return {f"{prefix}.count": derived(str(count), "offer", f"offer: {count} {what} under {prefix}",
                                       "counts the physical devices the plugin advertises (not times replicas)")}


def _devices(resources: Sequence[Resource]) -> list[NvidiaDevice]:
    """The distinct devices offered by ``resources``, in order."""
    unique = {d.health_key: d for r in resources for d in r.physical_devices if isinstance(d, NvidiaDevice)}
    return list(unique.values())


def gpu_resource_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """nvidia.com/gpu.{product,count,replicas,sharing-strategy,memory,family,compute.*}: what
    ``nvidia.com/gpu`` offers (whole GPUs, or MIG devices under ``single``); the GPUs themselves,
    with count 0, when it offers nothing (every GPU in MIG under ``mixed``)."""
    part = _nvidia(inventory)
    if part is None:
        return {}
    resources = offer.of_base(GPU)
    devices = _devices(resources)
    offered = list({d.nvml_gpu.uuid: d.nvml_gpu for d in devices}.values())
    model = primary_model(offered or part.gpus)[0]
    labels = _model_labels(model)
    withheld = offer.withheld.get(GPU)
    if withheld is not None and not config.served_by_dra(VENDOR):  # DRA's GPUs: described, counted 0
        log.warning("MIG strategy single needs every GPU MIG-enabled with one profile; labels set to INVALID",
                    vendor=VENDOR, reason=withheld)
        first_enabled = next(gpu for gpu in part.gpus if gpu.mig_enabled)  # GFD names the first MIG-enabled GPU
        source = f"offer: nothing under {GPU}: {withheld}"
        rule = "GFD's MIG-INVALID labels: strategy single needs every GPU MIG-enabled with one profile"
        invalid = {f"{GPU}.count": "0", f"{GPU}.replicas": "0", f"{GPU}.sharing-strategy": "", f"{GPU}.memory": "0"}
        return labels | {key: derived(value, "offer", source, rule) for key, value in invalid.items()} | {
            f"{GPU}.product": derived(product_name(first_enabled.name, "MIG", "INVALID"), "nvml",
                                      f"nvmlDeviceGetName({_gpu_ref(first_enabled)}) = {first_enabled.name!r}",
                                      f"{SANITISE_RULE}; '-MIG-INVALID': {rule}")}
    migs = [d for d in devices if d.mig is not None]
    if migs and migs[0].mig is not None:  # migStrategy single: the labels describe one MIG device
        mig = migs[0].mig
        return (labels | _sharing_labels(GPU, mig_product_name(migs[0].nvml_gpu.name, mig), _mig_source(migs[0]),
                                         resources)
                | _count(GPU, len(migs), "MIG devices") | _mig_attribute_labels(GPU, mig))
    name_source = f"nvmlDeviceGetName({_gpu_ref(model)}) = {model.name!r}"
    if any(r.strategy == "memory" for r in resources):
        sharing = _memory_sharing_labels(product_name(model.name), name_source, resources, model)
    else:
        sharing = _sharing_labels(GPU, product_name(model.name), name_source, resources)
    return labels | sharing | _count(GPU, len(devices), "GPUs")


def gpushare_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """``gpushare=true`` while GPUs are offered by memory: gpushare-era DaemonSets select on it."""
    memory = next((r for r in offer.of_vendor(VENDOR) if r.name == RESOURCE_MEM), None)
    if memory is None:
        return {}
    return {GPUSHARE_LABEL: derived("true", "offer", f"offer: {RESOURCE_MEM} ({len(memory.devices)} devices)",
                                    "true while GPUs are shared by memory (config sharing.memory)")}


def _mig_source(device: NvidiaDevice) -> str:
    gpu, mig = device.nvml_gpu, device.mig
    profile = mig.profile if mig is not None else "?"
    return f"nvmlDeviceGetName({_gpu_ref(gpu)}) = {gpu.name!r}; MIG profile {profile} of its GPU instance"


def mig_mixed_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """One nvidia.com/mig-<profile>.* set per MIG resource offered (``migStrategy: mixed``)."""
    labels: Labels = {}
    bases = dict.fromkeys(r.base for r in offer.of_vendor(VENDOR) if r.base != GPU)
    for base in bases:
        resources = offer.of_base(base)
        devices = [d for d in _devices(resources) if d.mig is not None]
        if not devices or devices[0].mig is None:
            continue
        first, mig = devices[0], devices[0].mig
        labels |= _sharing_labels(base, mig_product_name(first.nvml_gpu.name, mig), _mig_source(first), resources)
        labels |= _count(base, len(devices), "MIG devices")
        labels |= _mig_attribute_labels(base, mig)
    return labels


LABELERS: tuple[Labeler, ...] = (
    timestamp_labels,
    machine_labels,
    version_labels,
    mig_capability_labels,
    mps_capability_labels,
    gpu_resource_labels,
    gpu_mode_labels,
    clique_labels,
    mig_strategy_labels,
    mig_mixed_labels,
    vgpu_labels,
    gpushare_labels,
)


# --- for people: every key family above, who else writes it and when it is written -------------

_GFD = "GFD (NVIDIA gpu-feature-discovery)"
_NVML = "NVML described at least one GPU"
_SINGLE = "flags.migStrategy is single with every GPU MIG-enabled with one profile (now: {mig_strategy})"
_MIXED = "flags.migStrategy is mixed and MIG devices of that profile are offered (now: {mig_strategy})"
_RESOURCE_SUFFIXES = ("product", "count", "replicas", "sharing-strategy", "memory")
_MIG_SUFFIXES = tuple(suffix for suffix, _, _ in _MIG_ATTRIBUTES if suffix != "memory")
# What each value says, for the labels reference: of the devices a resource's labels describe
_RESOURCE_MEANINGS = {
    "product": "the model as NVML names it, sanitised as GFD does; `-SHARED` added while replicas are advertised "
               "under the plain name",
    "count": "how many devices the device plugin advertises under the resource (devices, not replicas)",
    "replicas": "the replicas each shared device is advertised as: 1 when none is shared, 0 when nothing is offered",
    "sharing-strategy": "how the devices are shared: `none`, `time-slicing`, `mps` or `memory`",
    "memory": "the memory of one device, in MiB",
    "shared-count": "how many of the devices are shared, when the sharing config shares only some",
}
_MIG_MEANINGS = {  # of one MIG device
    "multiprocessors": "streaming multiprocessors",
    "slices.gi": "GPU-instance slices",
    "slices.ci": "compute-instance slices",
    "engines.copy": "copy engines",
    "engines.decoder": "video decoders",
    "engines.encoder": "video encoders",
    "engines.jpeg": "JPEG decoders",
    "engines.ofa": "optical-flow accelerators",
}
_VERSION_PARTS = {"major": "first", "minor": "second", "revision": "third", "rev": "third"}

KEY_DOCS: tuple[KeyDoc, ...] = (
    *(KeyDoc(f"{GPU}.{suffix}", _GFD, _NVML, "nvidia",
             meaning=f"whole GPUs (`nvidia.com/gpu`; under MIG `single`, its MIG devices): "
                     f"{_RESOURCE_MEANINGS[suffix]}")
      for suffix in _RESOURCE_SUFFIXES),
    KeyDoc(f"{GPU}.shared-count", "none: gpu-labeller's own key (GFD has none)",
           "sharing.{sharing}.resources[nvidia.com/gpu].devices shares only some of the GPUs", "nvidia",
           meaning=_RESOURCE_MEANINGS["shared-count"]),
    KeyDoc(f"{GPU}.family", _GFD, f"{_NVML} and it reports a compute capability", "nvidia",
           meaning="the architecture (`ampere`, `hopper`, `blackwell`, ...), from the compute capability by GFD's "
                   "table"),
    *(KeyDoc(f"{GPU}.compute.{part}", _GFD, f"{_NVML} and it reports a compute capability", "nvidia",
             meaning=f"the {part} number of the CUDA compute capability") for part in ("major", "minor")),
    KeyDoc(f"{GPU}.machine", _GFD, _NVML, "machine",
           meaning="the machine's model: its DMI product name, sanitised as GFD does"),
    KeyDoc(f"{GPU}.mode", _GFD, _NVML, "nvidia", meaning="`compute` (PCI class 0302) or `graphics` (0300); "
                                                         "`unknown` when the GPUs disagree"),
    KeyDoc(f"{GPU}.clique", _GFD, "every fabric-attached GPU reports the same cluster UUID and clique id "
           "(multi-node NVLink)", "nvidia", meaning="the multi-node NVLink clique: `<cluster UUID>.<clique id>`"),
    *(KeyDoc(f"{GPU}.{suffix}", _GFD, _SINGLE, "nvidia", meaning=f"{_MIG_MEANINGS[suffix]} of one MIG device")
      for suffix in _MIG_SUFFIXES),
    *(KeyDoc(f"nvidia.com/cuda.driver-version.{part}", _GFD, f"{_NVML} and the driver version has 2 or 3 parts",
             "nvidia", meaning=f"the {_VERSION_PARTS[part]} part of the NVIDIA driver's version")
      for part in ("major", "minor", "revision")),
    KeyDoc("nvidia.com/cuda.driver-version.full", _GFD, f"{_NVML} and the driver version has 2 or 3 parts", "nvidia",
           meaning="the NVIDIA driver's version"),
    *(KeyDoc(f"nvidia.com/cuda.driver.{part}", f"{_GFD} (deprecated key)", f"{_NVML} and the driver version has 2 or "
             "3 parts", "nvidia", meaning=f"the {_VERSION_PARTS[part]} part of the NVIDIA driver's version")
      for part in ("major", "minor", "rev")),
    *(KeyDoc(f"nvidia.com/cuda.runtime-version.{part}", _GFD, _NVML, "nvidia",
             meaning=f"the {part} number of the newest CUDA version the driver supports")
      for part in ("major", "minor")),
    KeyDoc("nvidia.com/cuda.runtime-version.full", _GFD, _NVML, "nvidia",
           meaning="the newest CUDA version the driver supports, `<major>.<minor>`"),
    *(KeyDoc(f"nvidia.com/cuda.runtime.{part}", f"{_GFD} (deprecated key)", _NVML, "nvidia",
             meaning=f"the {part} number of the newest CUDA version the driver supports")
      for part in ("major", "minor")),
    KeyDoc("nvidia.com/mig.capable", _GFD, _NVML, "nvidia", meaning="`true` when a GPU supports MIG"),
    KeyDoc("nvidia.com/mig.strategy", _GFD, "flags.migStrategy is single or mixed (now: {mig_strategy})", "nvidia",
           meaning="the MIG strategy in force: `single` or `mixed`"),
    *(KeyDoc(f"nvidia.com/mig-<profile>.{suffix}", _GFD, _MIXED, "nvidia",
             meaning=f"the MIG devices of one profile (`nvidia.com/mig-<profile>`): {_RESOURCE_MEANINGS[suffix]}")
      for suffix in _RESOURCE_SUFFIXES),
    *(KeyDoc(f"nvidia.com/mig-<profile>.{suffix}", _GFD, _MIXED, "nvidia",
             meaning=f"{_MIG_MEANINGS[suffix]} of one MIG device of the profile") for suffix in _MIG_SUFFIXES),
    KeyDoc("nvidia.com/mig-<profile>.shared-count", "none: gpu-labeller's own key (GFD has none)",
           f"{_MIXED}, and the sharing config shares only some of them", "nvidia",
           meaning=_RESOURCE_MEANINGS["shared-count"]),
    KeyDoc("nvidia.com/mps.capable", _GFD, _NVML, "nvidia",
           meaning="`true` while `gpu-labeller mps-control-daemon` serves the MPS replicas the config asks for"),
    KeyDoc("nvidia.com/vgpu.present", _GFD, f"{_NVML} and its vGPU state is known", "nvidia",
           meaning="`true` when the GPUs are vGPU guest devices"),
    *(KeyDoc(f"nvidia.com/vgpu.host-driver-{part}", _GFD, "on a vGPU guest whose PCI config space is readable whole "
             "(labeller.vgpuDetection in the chart)", "nvidia", meaning=f"the vGPU host driver's {part}")
      for part in ("version", "branch")),
    KeyDoc(GPUSHARE_LABEL, "gpushare (Aliyun): an admin sets it by hand for its DaemonSets",
           "sharing.memory offers the NVIDIA GPUs as aliyun.com/gpu-mem", "nvidia",
           meaning="`true` while the GPUs are shared by memory: the node label gpushare's DaemonSets select"),
    KeyDoc(TIMESTAMP, f"{_GFD} (on by default there)", "an NVIDIA GPU is present and labeller.labels.timestamp is on",
           "timestamp", meaning="when the labeller started, in Unix seconds"),
)
