"""NVIDIA labels, exactly as GPU Feature Discovery (GFD) v0.20 computes them.

Each labeler owns its own keys. All of them stay silent unless NVML described at least one GPU:
a node where only the PCI scan saw NVIDIA GPUs gets just ``nvidia.com/gpu.present`` (rules.py).

Where GFD is ambiguous we choose, and say so:
- Several GPU models on one node: GFD lets whichever name it iterates last win. We describe the
  model with the most GPUs (tie: the model of the lowest NVML index) and log a warning.
- MPS sharing configured while a GPU has MIG enabled: GFD fails the whole pass. We emit
  ``mps.capable=false`` and log an error, so the other labels stay correct.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import structlog

from labeller.config import Config
from labeller.inventory import Inventory, MigDevice, NvidiaGpu, NvidiaInventory
from labeller.labels import Labeler, Labels

log = structlog.get_logger(__name__)

GPU = "nvidia.com/gpu"
MIB = 1024 * 1024
COMPUTE_CLASS = 0x030200
GRAPHICS_CLASS = 0x030000

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
    return product_name(gpu_name, "MIG", mig.name_in_labels)


def family(major: int, minor: int) -> str:
    rule = _FAMILIES.get(major)
    return rule(minor) if rule else "undefined"


def _gpus(inventory: Inventory) -> tuple[NvidiaGpu, ...]:
    return inventory.nvidia.gpus if inventory.nvidia else ()


def _nvidia(inventory: Inventory) -> NvidiaInventory | None:
    return inventory.nvidia if inventory.nvidia and inventory.nvidia.gpus else None


# --- models --------------------------------------------------------------------------------------

def models(gpus: tuple[NvidiaGpu, ...]) -> dict[str, list[NvidiaGpu]]:
    """GPUs grouped by NVML name, in order of each model's lowest NVML index."""
    grouped: dict[str, list[NvidiaGpu]] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        grouped.setdefault(gpu.name, []).append(gpu)
    return grouped


def primary_model(gpus: tuple[NvidiaGpu, ...]) -> list[NvidiaGpu]:
    """The model the node-wide gpu.* labels describe: most GPUs, then lowest NVML index."""
    grouped = models(gpus)
    if len(grouped) > 1:
        log.warning("several NVIDIA GPU models on one node; gpu.* labels describe the most numerous",
                    vendor="nvidia", models={name: len(members) for name, members in grouped.items()})
    return max(grouped.values(), key=len)  # max keeps the first of equals: the lowest index


# --- small labelers -------------------------------------------------------------------------------

def machine_labels(inventory: Inventory, config: Config) -> Labels:
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


def version_labels(inventory: Inventory, config: Config) -> Labels:
    nvidia = _nvidia(inventory)
    if nvidia is None:
        return {}
    return _driver_version_labels(nvidia.driver_version) | _runtime_version_labels(nvidia.cuda_driver_version)


def mig_capability_labels(inventory: Inventory, config: Config) -> Labels:
    if _nvidia(inventory) is None:
        return {}
    return {"nvidia.com/mig.capable": str(any(gpu.mig_capable for gpu in _gpus(inventory))).lower()}


def mps_capability_labels(inventory: Inventory, config: Config) -> Labels:
    if _nvidia(inventory) is None:
        return {}
    capable = config.sharing.strategy == "mps"
    if capable and any(gpu.mig_enabled for gpu in _gpus(inventory)):
        log.error("MPS sharing is configured but a GPU has MIG enabled; mps.capable=false "
                  "(GFD would fail the whole labelling pass)", vendor="nvidia")
        capable = False
    return {"nvidia.com/mps.capable": str(capable).lower()}


def gpu_mode_labels(inventory: Inventory, config: Config) -> Labels:
    """compute/graphics from each GPU's PCI class; disagreement or an unknown class gives unknown."""
    if _nvidia(inventory) is None:
        return {}
    modes = {COMPUTE_CLASS: "compute", GRAPHICS_CLASS: "graphics"}
    seen = {modes.get(gpu.pci_class or 0, "unknown") for gpu in _gpus(inventory)}
    return {"nvidia.com/gpu.mode": seen.pop() if len(seen) == 1 else "unknown"}


def clique_labels(inventory: Inventory, config: Config) -> Labels:
    """Only when every fabric-attached GPU reports the same cluster UUID and clique id."""
    cliques = {gpu.clique for gpu in _gpus(inventory) if gpu.clique}
    if len(cliques) > 1:
        log.warning("GPUs disagree on their NVLink fabric clique; gpu.clique omitted",
                    vendor="nvidia", cliques=sorted(cliques))
    return {"nvidia.com/gpu.clique": cliques.pop()} if len(cliques) == 1 else {}


def vgpu_labels(inventory: Inventory, config: Config) -> Labels:
    nvidia = _nvidia(inventory)
    if nvidia is None or nvidia.vgpu_present is None:  # unknown: no label rather than a guess
        return {}
    labels = {"nvidia.com/vgpu.present": str(nvidia.vgpu_present).lower()}
    if nvidia.vgpu_present and nvidia.vgpu_host_driver:
        version, branch = nvidia.vgpu_host_driver
        labels["nvidia.com/vgpu.host-driver-version"] = version
        labels["nvidia.com/vgpu.host-driver-branch"] = branch
    return labels


def mig_strategy_labels(inventory: Inventory, config: Config) -> Labels:
    if _nvidia(inventory) is None or config.mig_strategy == "none":
        return {}
    return {"nvidia.com/mig.strategy": config.mig_strategy}


# --- resource labels: nvidia.com/gpu.* and nvidia.com/mig-<profile>.* ----------------------------

def _sharing_labels(prefix: str, product: str, replicas: int, config: Config) -> Labels:
    """product (+-SHARED), replicas and sharing-strategy of one resource."""
    shared = replicas > 1
    if shared and not config.sharing.rename_by_default:
        product += "-SHARED"
    return {
        f"{prefix}.product": product,
        f"{prefix}.replicas": str(replicas),
        f"{prefix}.sharing-strategy": config.sharing.strategy if shared else "none",
    }


def _full_gpu_labels(model: list[NvidiaGpu], config: Config) -> Labels:
    """One model's labels. Sharing applies only if some GPU of the model is not MIG-enabled."""
    first = model[0]
    shareable = any(not gpu.mig_enabled for gpu in model)
    replicas = config.sharing.replicas_for(GPU) if shareable else 0
    labels = _sharing_labels(GPU, product_name(first.name), replicas, config)
    labels[f"{GPU}.count"] = str(len(model))
    if first.memory_bytes // MIB:
        labels[f"{GPU}.memory"] = str(first.memory_bytes // MIB)
    if first.compute_capability and first.compute_capability[0]:
        major, minor = first.compute_capability
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


def _mig_single_problem(gpus: tuple[NvidiaGpu, ...]) -> str | None:
    enabled = [gpu for gpu in gpus if gpu.mig_enabled]
    if len(enabled) != len(gpus):
        return "some GPUs have MIG enabled and some do not"
    if any(not gpu.mig_devices for gpu in enabled):
        return "a MIG-enabled GPU has no MIG devices"
    if len({mig.profile for gpu in enabled for mig in gpu.mig_devices}) > 1:
        return "more than one MIG profile on the node"
    return None


def _mig_single_labels(gpus: tuple[NvidiaGpu, ...], config: Config) -> Labels:
    """MIG devices advertised as nvidia.com/gpu; the labels then describe one MIG device."""
    problem = _mig_single_problem(gpus)
    if problem is not None:
        log.warning("MIG strategy single needs every GPU MIG-enabled with one profile; labels set to INVALID",
                    vendor="nvidia", reason=problem)
        first_enabled = next(gpu for gpu in gpus if gpu.mig_enabled)  # GFD names the first MIG-enabled GPU
        return {f"{GPU}.product": product_name(first_enabled.name, "MIG", "INVALID"), f"{GPU}.count": "0",
                f"{GPU}.replicas": "0", f"{GPU}.sharing-strategy": "", f"{GPU}.memory": "0"}
    migs = [mig for gpu in gpus for mig in gpu.mig_devices]
    parent = next(gpu for gpu in gpus if gpu.mig_devices)
    labels = _sharing_labels(GPU, mig_product_name(parent.name, migs[0]), config.sharing.replicas_for(GPU), config)
    labels[f"{GPU}.count"] = str(len(migs))
    return labels | _mig_attribute_labels(GPU, migs[0])


def gpu_resource_labels(inventory: Inventory, config: Config) -> Labels:
    """nvidia.com/gpu.{product,count,replicas,sharing-strategy,memory,family,compute.*} (+ MIG single)."""
    if _nvidia(inventory) is None:
        return {}
    gpus = _gpus(inventory)
    model = primary_model(gpus)
    labels = _full_gpu_labels(model, config)
    if config.mig_strategy == "single" and any(gpu.mig_enabled for gpu in gpus):
        labels |= _mig_single_labels(gpus, config)
    return labels


def mig_mixed_labels(inventory: Inventory, config: Config) -> Labels:
    """One nvidia.com/mig-<profile>.* set per distinct MIG profile on the node."""
    if _nvidia(inventory) is None or config.mig_strategy != "mixed":
        return {}
    by_profile: dict[str, list[tuple[NvidiaGpu, MigDevice]]] = {}
    for gpu in _gpus(inventory):
        if gpu.mig_enabled and not gpu.mig_devices:
            log.warning("MIG-enabled GPU has no MIG devices; ignored", vendor="nvidia", device=gpu.uuid)
        for mig in gpu.mig_devices if gpu.mig_enabled else ():
            by_profile.setdefault(mig.profile, []).append((gpu, mig))
    labels: Labels = {}
    for members in by_profile.values():
        parent, mig = members[0]
        prefix = mig.resource_name
        replicas = config.sharing.replicas_for(prefix)
        labels |= _sharing_labels(prefix, mig_product_name(parent.name, mig), replicas, config)
        labels[f"{prefix}.count"] = str(len(members))
        labels |= _mig_attribute_labels(prefix, mig)
    return labels


LABELERS: tuple[Labeler, ...] = (
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
)
