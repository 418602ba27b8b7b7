"""NVIDIA labels, as GPU Feature Discovery (GFD) v0.20 computes them.

Each labeler owns its own keys; they run only with the ``nvidia`` label group on. All but the
timestamp stay silent unless NVML described at least one GPU: a node where only the PCI scan saw
NVIDIA GPUs gets just ``nvidia.com/gpu.present`` (labeller.rules). The resource labels
(``gpu.count``, ``gpu.replicas``, ``gpu.sharing-strategy``, ``-SHARED``, ``mig-<profile>.*``) read
what the node offers (labeller.offer), the same objects the device plugin serves.

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

import structlog

from labeller.config import Config
from labeller.inventory import Inventory
from labeller.labels import Labeler, Labels
from labeller.gpushare import RESOURCE_MEM
from labeller.offer import Offer, Resource
from vendors.nvidia.devices import GPU, VENDOR, NvidiaDevice
from vendors.nvidia.facts import COMPUTE_CLASS, GRAPHICS_CLASS, MIB, PCI_VENDOR_ID, name_in_labels
from vendors.nvidia.model import MigDevice, NvidiaGpu, NvidiaInventory

log = structlog.get_logger(__name__)

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
    if _nvidia(inventory) is None or not config.labels.machine:
        return {}
    # As GFD: "unknown" only when the name cannot be read; an empty one stays empty.
    return {"nvidia.com/gpu.machine": "unknown" if inventory.machine is None else sanitise(inventory.machine)}


def _driver_version_labels(version: str) -> Labels:
    parts = version.split(".")
    if len(parts) not in (2, 3):
        log.warning("driver version is not <major>.<minor>[.<revision>]; driver labels omitted",
                    vendor="nvidia", driver_version=version)
        return {}
    major, minor, revision = parts[0], parts[1], parts[2] if len(parts) == 3 else ""
    labels: Labels = {}
    for prefix, rev_key in (("nvidia.com/cuda.driver-version", "revision"), ("nvidia.com/cuda.driver", "rev")):
        labels |= {f"{prefix}.major": major, f"{prefix}.minor": minor, f"{prefix}.{rev_key}": revision}
    labels["nvidia.com/cuda.driver-version.full"] = version
    return labels


def _runtime_version_labels(cuda_version: int) -> Labels:
    major, minor = str(cuda_version // 1000), str(cuda_version % 1000 // 10)
    return {
        "nvidia.com/cuda.runtime-version.major": major,
        "nvidia.com/cuda.runtime-version.minor": minor,
        "nvidia.com/cuda.runtime-version.full": f"{major}.{minor}",
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
    return {"nvidia.com/mig.capable": str(any(gpu.mig_capable for gpu in _gpus(inventory))).lower()}


def mps_capability_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """true only while MPS replicas are advertised: configured, and served by the control daemon."""
    if _nvidia(inventory) is None:
        return {}
    capable = any(resource.strategy == "mps" for resource in offer.of_vendor(VENDOR))
    for held in offer.held:
        if held.resource.vendor == VENDOR and held.resource.strategy == "mps":
            (log.info if held.waiting else log.error)("MPS replicas not advertised; mps.capable=false",
                                                      vendor=VENDOR, resource=held.resource.name, reason=held.reason)
    return {"nvidia.com/mps.capable": str(capable).lower()}


def gpu_mode_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """compute/graphics from each GPU's PCI class; disagreement or an unknown class gives unknown."""
    if _nvidia(inventory) is None:
        return {}
    modes = {COMPUTE_CLASS: "compute", GRAPHICS_CLASS: "graphics"}
    seen = {modes.get(gpu.pci_class or 0, "unknown") for gpu in _gpus(inventory)}
    return {"nvidia.com/gpu.mode": seen.pop() if len(seen) == 1 else "unknown"}


def clique_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """Only when every fabric-attached GPU reports the same cluster UUID and clique id."""
    cliques = {gpu.clique for gpu in _gpus(inventory) if gpu.clique}
    if len(cliques) > 1:
        log.warning("GPUs disagree on their NVLink fabric clique; gpu.clique omitted",
                    vendor="nvidia", cliques=sorted(cliques))
    return {"nvidia.com/gpu.clique": cliques.pop()} if len(cliques) == 1 else {}


def vgpu_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    nvidia = _nvidia(inventory)
    if nvidia is None or nvidia.vgpu_present is None:  # unknown: no label rather than a guess
        return {}
    labels = {"nvidia.com/vgpu.present": str(nvidia.vgpu_present).lower()}
    if nvidia.vgpu_present and nvidia.vgpu_host_driver:
        version, branch = nvidia.vgpu_host_driver
        labels["nvidia.com/vgpu.host-driver-version"] = version
        labels["nvidia.com/vgpu.host-driver-branch"] = branch
    return labels


def mig_strategy_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    if _nvidia(inventory) is None or config.mig_strategy == "none":
        return {}
    return {"nvidia.com/mig.strategy": config.mig_strategy}


def timestamp_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """``gfd.timestamp`` (off by default: a changing value would make every restart a write)."""
    present = inventory.pci_gpus_of(PCI_VENDOR_ID) or _nvidia(inventory) is not None
    return {TIMESTAMP: str(_PROCESS_START)} if config.labels.timestamp and present else {}


# --- resource labels: nvidia.com/gpu.* and nvidia.com/mig-<profile>.*, from the offer -----------

def _sharing_labels(prefix: str, product: str, resources: Sequence[Resource]) -> Labels:
    """product (+``-SHARED``), replicas and sharing-strategy of what is offered under ``prefix``
    (its whole devices and its replicas); nothing offered: GFD's ``replicas=0``."""
    shared = next((r for r in resources if r.shared), None)
    if shared is not None and not shared.renamed:
        product += "-SHARED"
    labels = {
        f"{prefix}.product": product,
        f"{prefix}.replicas": str(shared.replicas if shared is not None else (1 if resources else 0)),
        f"{prefix}.sharing-strategy": shared.strategy if shared is not None else "none",
    }
    if shared is not None and any(not r.shared for r in resources):
        labels[f"{prefix}.shared-count"] = str(len(shared.physical_devices))
    return labels


def _memory_sharing_labels(product: str, resources: Sequence[Resource], model: NvidiaGpu) -> Labels:
    """Memory sharing (``aliyun.com/gpu-mem``, ``aliyun.com/gpu-count``): ``count`` GPUs, ``replicas``
    the memory units of one GPU of the model described (``count`` x ``replicas`` is what gpu-mem
    advertises when the GPUs are alike), ``sharing-strategy=memory``."""
    units = Counter(d.physical.health_key for r in resources if r.name == RESOURCE_MEM for d in r.devices
                    if isinstance(d.physical, NvidiaDevice) and d.physical.nvml_gpu.name == model.name)
    return {f"{GPU}.product": product, f"{GPU}.replicas": str(min(units.values(), default=0)),
            f"{GPU}.sharing-strategy": "memory"}


def _model_labels(gpu: NvidiaGpu) -> Labels:
    """memory, family and compute capability of one model."""
    labels: Labels = {}
    if gpu.memory_bytes // MIB:
        labels[f"{GPU}.memory"] = str(gpu.memory_bytes // MIB)
    if gpu.compute_capability and gpu.compute_capability[0]:
        major, minor = gpu.compute_capability
        labels |= {f"{GPU}.family": family(major, minor),
                   f"{GPU}.compute.major": str(major), f"{GPU}.compute.minor": str(minor)}
    return labels


def _mig_attribute_labels(prefix: str, mig: MigDevice) -> Labels:
    return {
        f"{prefix}.memory": str(mig.memory_mib),
        f"{prefix}.multiprocessors": str(mig.multiprocessors),
        f"{prefix}.slices.gi": str(mig.slices_gi),
        f"{prefix}.slices.ci": str(mig.slices_ci),
        f"{prefix}.engines.copy": str(mig.engines_copy),
        f"{prefix}.engines.decoder": str(mig.engines_decoder),
        f"{prefix}.engines.encoder": str(mig.engines_encoder),
        f"{prefix}.engines.jpeg": str(mig.engines_jpeg),
        f"{prefix}.engines.ofa": str(mig.engines_ofa),
    }


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
    if withheld is not None:
        log.warning("MIG strategy single needs every GPU MIG-enabled with one profile; labels set to INVALID",
                    vendor=VENDOR, reason=withheld)
        first_enabled = next(gpu for gpu in part.gpus if gpu.mig_enabled)  # GFD names the first MIG-enabled GPU
        return labels | {f"{GPU}.product": product_name(first_enabled.name, "MIG", "INVALID"), f"{GPU}.count": "0",
                         f"{GPU}.replicas": "0", f"{GPU}.sharing-strategy": "", f"{GPU}.memory": "0"}
    migs = [d for d in devices if d.mig is not None]
    if migs and migs[0].mig is not None:  # migStrategy single: the labels describe one MIG device
        mig = migs[0].mig
        return (labels | _sharing_labels(GPU, mig_product_name(migs[0].nvml_gpu.name, mig), resources)
                | {f"{GPU}.count": str(len(migs))} | _mig_attribute_labels(GPU, mig))
    if any(r.strategy == "memory" for r in resources):
        sharing = _memory_sharing_labels(product_name(model.name), resources, model)
    else:
        sharing = _sharing_labels(GPU, product_name(model.name), resources)
    return labels | sharing | {f"{GPU}.count": str(len(devices))}


def gpushare_labels(inventory: Inventory, config: Config, offer: Offer) -> Labels:
    """``gpushare=true`` while GPUs are offered by memory: gpushare-era DaemonSets select on it."""
    return {GPUSHARE_LABEL: "true"} if any(r.name == RESOURCE_MEM for r in offer.of_vendor(VENDOR)) else {}


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
        labels |= _sharing_labels(base, mig_product_name(first.nvml_gpu.name, mig), resources)
        labels[f"{base}.count"] = str(len(devices))
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
