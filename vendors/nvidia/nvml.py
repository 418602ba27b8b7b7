"""NVIDIA backend: what NVML (pynvml) says about each GPU, read the way GPU Feature Discovery does.

Only the ``nvml`` module object passed in (or the real ``pynvml``) is used for calls, error
classes and constants, so ``vendors.nvidia.simulate`` can stand in for simulations and tests. NVML is
initialised and shut down on every probe, as GFD does on every labelling pass.
"""

from __future__ import annotations

import ctypes
import importlib
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from labeller.model.config import Config
from labeller.model.inventory import BackendReport, BackendStatus, PciGpu
from vendors.nvidia.facts import (
    MIB,
    PCI_VENDOR_ID,
    compute_instance_profiles,
    gpu_instance_profiles,
    mig_memory_gb,
    mig_profile_name,
)
from vendors.nvidia.model import MigDevice, MigProfile, NvidiaGpu, NvidiaInventory
from vendors.nvidia.mps import probe_readiness
from vendors.pci import devices_dir, normalise_bdf
from vendors.plausible import MAX_COMPUTE_MAJOR, MAX_COMPUTE_MINOR, MAX_MEMORY_BYTES, first_problem, outside
from vendors.sysfs import CONFIG_SPACE_LIMIT, Untrusted, read_bytes
from labeller.base.log import get_logger

log = get_logger(__name__)

# PCI config space, for the vGPU check (GFD internal/vgpu).
_PCI_CONFIG_SIZE = 256  # Linux shows only the first 64 bytes to readers without CAP_SYS_ADMIN
_PCI_STATUS = 0x06
_PCI_STATUS_HAS_CAPABILITIES = 0x10
_PCI_CAPABILITY_LIST = 0x34
_PCI_CAP_VENDOR_SPECIFIC = 0x09
# Inside the "VF" capability: records from byte 5 on, each [id, length, payload]; record id 0 holds
# the host driver's version and branch, 10 NUL-padded bytes each.
_VGPU_RECORDS_START = 5
_HOST_DRIVER_FIELD = 10


# --- pure helpers ---------------------------------------------------------------------------------

def text(value: str | bytes) -> str:
    """Older pynvml versions return bytes from getters and struct fields such as PciInfo.busId."""
    return value.decode() if isinstance(value, bytes) else value


def vgpu_capability(config: bytes) -> bytes | None:
    """NVIDIA's vendor-specific PCI capability signed "VF" (the bytes it spans), or None."""
    if len(config) <= _PCI_CAPABILITY_LIST or not config[_PCI_STATUS] & _PCI_STATUS_HAS_CAPABILITIES:
        return None
    offset = config[_PCI_CAPABILITY_LIST]
    seen: set[int] = set()
    while offset and offset not in seen and offset + 5 <= len(config):
        seen.add(offset)
        if config[offset] == _PCI_CAP_VENDOR_SPECIFIC:
            return config[offset:offset + config[offset + 2]] if config[offset + 3:offset + 5] == b"VF" else None
        offset = config[offset + 1]
    return None


def host_driver(capability: bytes) -> tuple[str, str] | None:
    """(version, branch) of the hypervisor's vGPU manager from the capability's record 0; None if
    the record is missing or malformed."""
    pos = _VGPU_RECORDS_START
    while pos < len(capability) and capability[pos] != 0:
        if len(capability) - pos < 2 or not 2 <= capability[pos + 1] <= len(capability) - pos:
            return None
        pos += capability[pos + 1]
    if len(capability) - pos < 2 or not 2 + 2 * _HOST_DRIVER_FIELD <= capability[pos + 1] <= len(capability) - pos:
        return None
    version = capability[pos + 2:pos + 2 + _HOST_DRIVER_FIELD]
    branch = capability[pos + 2 + _HOST_DRIVER_FIELD:pos + 2 + 2 * _HOST_DRIVER_FIELD]
    return version.strip(b"\0").decode("ascii", "replace"), branch.strip(b"\0").decode("ascii", "replace")


def vgpu_state(host_root: Path, nvidia_pci: tuple[PciGpu, ...], nvml_says: Mapping[str, bool | None],
               problems: list[str]) -> tuple[bool | None, tuple[str, str] | None]:
    """(any GPU is a vGPU, host driver) as GFD finds them in PCI config space.

    Where the config space cannot be read whole (an unprivileged reader sees 64 bytes), NVML's
    virtualization mode for that GPU (``nvml_says``, by bus id) answers instead; where neither can
    say, and no other GPU is a vGPU, the answer is None: unknown. A config file that cannot be
    trusted (not a regular file, over 4 KiB) is added to ``problems`` and counts as unreadable.
    """
    present: bool | None = False
    host: tuple[str, str] | None = None
    for gpu in nvidia_pci:
        try:
            config = read_bytes(devices_dir(host_root) / gpu.bdf / "config", CONFIG_SPACE_LIMIT) or b""
        except Untrusted as exc:
            problems.append(f"{gpu.bdf}: {exc}")
            config = b""
        if len(config) >= _PCI_CONFIG_SIZE:
            capability = vgpu_capability(config)
            is_vgpu: bool | None = capability is not None
            if capability is not None and host is None:
                host = host_driver(capability)
                if host is None:
                    log.info("vGPU capability has no host driver record; vgpu.host-driver-* omitted",
                             vendor="nvidia", device=gpu.bdf)
        else:
            is_vgpu = nvml_says.get(gpu.bdf)
        if is_vgpu:
            present = True
        elif is_vgpu is None and present is False:
            present = None
    return present, host


# --- NVML readers ---------------------------------------------------------------------------------

def _versioned(nvml: ModuleType, call: Any, *args: Any) -> Any:
    """pynvml's profile-info calls default to their v2 symbols; drivers before them have only v1."""
    try:
        return call(*args)
    except nvml.NVMLError_FunctionNotFound:
        return call(*args, version=1)


def _gi_profile_index(nvml: ModuleType, parent: Any, profile_id: int) -> int | None:
    for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = _versioned(nvml, nvml.nvmlDeviceGetGpuInstanceProfileInfo, parent, index)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            continue
        if info.id == profile_id:
            return index
    return None


def _ci_profile_index(nvml: ModuleType, gpu_instance: Any, profile_id: int) -> int | None:
    for index in range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        for engine in range(nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT):
            try:
                info = _versioned(nvml, nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gpu_instance, index, engine)
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                continue
            if info.id == profile_id:
                return index
    return None


def _mig_profile(nvml: ModuleType, parent: Any, gpu_instance: Any, gi_profile_id: int, ci_id: int, memory_mib: int,
                 parent_total: int) -> str:
    """The profile name go-nvlib's GetProfile gives: slice counts from the instance profiles."""
    compute_instance = nvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id)
    gi_index = _gi_profile_index(nvml, parent, gi_profile_id)
    ci_index = _ci_profile_index(nvml, gpu_instance, nvml.nvmlComputeInstanceGetInfo(compute_instance).profileId)
    gi_profiles = gpu_instance_profiles(nvml)
    ci_profiles = compute_instance_profiles(nvml)
    if gi_index not in gi_profiles or ci_index not in ci_profiles:
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_FOUND)
    gpu_slices, suffix = gi_profiles[gi_index]
    return mig_profile_name(gpu_slices, ci_profiles[ci_index], mig_memory_gb(memory_mib, parent_total), suffix)


def _placement(gpu_instance_info: Any, mig_uuid: str) -> tuple[int | None, int | None]:
    """(start, size) of the GPU instance's placement: the memory slices it occupies, which NVIDIA's
    DRA driver names MIG devices by. (None, None) where the structure holds none (size 0)."""
    placement = getattr(gpu_instance_info, "placement", None)
    size = int(getattr(placement, "size", 0))
    if placement is None or size <= 0:
        log.info("GPU instance has no placement; its MIG device keeps the name by instance ids", vendor="nvidia",
                 device=mig_uuid)
        return None, None
    return int(placement.start), size


def read_mig_device(nvml: ModuleType, parent: Any, parent_total: int, handle: Any, index: int) -> MigDevice:
    attributes = nvml.nvmlDeviceGetAttributes(handle)
    uuid = text(nvml.nvmlDeviceGetUUID(handle))
    gi_id = nvml.nvmlDeviceGetGpuInstanceId(handle)
    ci_id = nvml.nvmlDeviceGetComputeInstanceId(handle)
    gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id)
    gi_info = nvml.nvmlGpuInstanceGetInfo(gpu_instance)
    placement_start, placement_size = _placement(gi_info, uuid)
    return MigDevice(
        index=index,
        uuid=uuid,
        profile=_mig_profile(nvml, parent, gpu_instance, gi_info.profileId, ci_id, attributes.memorySizeMB,
                             parent_total),
        memory_mib=attributes.memorySizeMB,
        multiprocessors=attributes.multiprocessorCount,
        slices_gi=attributes.gpuInstanceSliceCount,
        slices_ci=attributes.computeInstanceSliceCount,
        engines_copy=attributes.sharedCopyEngineCount,
        engines_decoder=attributes.sharedDecoderCount,
        engines_encoder=attributes.sharedEncoderCount,
        engines_jpeg=attributes.sharedJpegCount,
        engines_ofa=attributes.sharedOfaCount,
        gpu_instance_id=gi_id,
        compute_instance_id=ci_id,
        gpu_instance_profile_id=int(gi_info.profileId),
        placement_start=placement_start,
        placement_size=placement_size,
    )


def _mig_devices(nvml: ModuleType, parent: Any, parent_total: int) -> tuple[MigDevice, ...]:
    devices: list[MigDevice] = []
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
        except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
            continue  # an empty slot
        devices.append(read_mig_device(nvml, parent, parent_total, handle, index))
    return tuple(devices)


_MAX_PLACEMENTS = 64  # more placements of one profile than any GPU has memory slices: not NVML


def placements(nvml: ModuleType, handle: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
    """Where a GPU instance of ``profile_id`` may sit on the GPU, (start, size) in memory slices, as
    go-nvml asks: the count first, then that many."""
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    if count.value > _MAX_PLACEMENTS:
        raise nvml.NVMLError(nvml.NVML_ERROR_UNKNOWN)
    if not count.value:
        return ()
    found = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, found, ctypes.byref(count))
    return tuple((int(p.start), int(p.size)) for p in found[:min(count.value, len(found))] if p.size > 0)


def _mig_profiles(nvml: ModuleType, handle: Any, memory_bytes: int) -> tuple[MigProfile, ...]:
    """Every GPU instance profile the GPU offers (NOT_SUPPORTED: not one of its profiles), with its
    placements, in NVML's profile order."""
    profiles = []
    for index, (gpu_slices, suffix) in sorted(gpu_instance_profiles(nvml).items()):
        try:
            info = _versioned(nvml, nvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, index)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            continue
        name = mig_profile_name(gpu_slices, gpu_slices, mig_memory_gb(info.memorySizeMB, memory_bytes), suffix)
        profiles.append(MigProfile(
            index=index, id=int(info.id), name=name, slices=int(info.sliceCount), instances=int(info.instanceCount),
            memory_mib=int(info.memorySizeMB), multiprocessors=int(info.multiprocessorCount),
            copy_engines=int(info.copyEngineCount), decoders=int(info.decoderCount),
            encoders=int(info.encoderCount), jpeg_engines=int(info.jpegCount), ofa_engines=int(info.ofaCount),
            placements=placements(nvml, handle, int(info.id))))
    return tuple(profiles)


def _geometry(nvml: ModuleType, handle: Any, memory_bytes: int, device: int) -> tuple[MigProfile, ...]:
    """The GPU's MIG profiles; none (its MIG devices are only those that exist) where NVML cannot list them."""
    try:
        return _mig_profiles(nvml, handle, memory_bytes)
    except nvml.NVMLError as exc:
        log.warning("cannot read the GPU's MIG profiles and placements; no MIG device is made on it at prepare",
                    vendor="nvidia", device=device, reason="mig-geometry-unreadable", error=str(exc))
        return ()


def _mig_mode(nvml: ModuleType, handle: Any) -> tuple[bool, bool]:
    """(capable, enabled). NOT_SUPPORTED means a GPU without MIG; other errors are real errors."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):  # the latter: drivers before MIG
        return False, False
    return True, current == nvml.NVML_DEVICE_MIG_ENABLE


def _memory_bytes(nvml: ModuleType, handle: Any, device: Any) -> int:
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except nvml.NVMLError as exc:
        log.warning("cannot read GPU memory; gpu.memory omitted", vendor="nvidia", device=device, error=str(exc))
        return 0


def _compute_capability(nvml: ModuleType, handle: Any) -> tuple[int, int] | None:
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    except nvml.NVMLError_NotSupported:
        return None
    return int(major), int(minor)


def _vgpu_guest(nvml: ModuleType, handle: Any) -> bool | None:
    try:
        return bool(int(nvml.nvmlDeviceGetVirtualizationMode(handle)) == nvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU)
    except (nvml.NVMLError, AttributeError):  # AttributeError: a pynvml without the call
        return None


# nvmlDeviceGetBrand -> the name go-nvlib gives it (GetBrandAsString), which NVIDIA's DRA driver
# publishes as ``brand``; a brand it does not name (DLA, NPU, ...) is left out.
_BRANDS = {"UNKNOWN": "Unknown", "QUADRO": "Quadro", "TESLA": "Tesla", "NVS": "NVS", "GRID": "Grid",
           "GEFORCE": "GeForce", "TITAN": "Titan", "NVIDIA_VAPPS": "NvidiaVApps", "NVIDIA_VPC": "NvidiaVPC",
           "NVIDIA_VCS": "NvidiaVCS", "NVIDIA_VWS": "NvidiaVWS", "NVIDIA_CLOUD_GAMING": "NvidiaCloudGaming",
           "QUADRO_RTX": "QuadroRTX", "NVIDIA_RTX": "NvidiaRTX", "NVIDIA": "Nvidia", "GEFORCE_RTX": "GeForceRTX",
           "TITAN_RTX": "TitanRTX"}
_ADDRESSING_MODES = {"NONE": "None", "HMM": "HMM", "ATS": "ATS"}  # as go-nvlib's GetAddressingModeAsString


def _named(nvml: ModuleType, prefix: str, names: Mapping[str, str], value: int) -> str | None:
    """The name of ``value`` among pynvml's ``<prefix><key>`` constants, as ``names`` gives it."""
    return next((name for key, name in names.items() if getattr(nvml, prefix + key, None) == value), None)


def _brand(nvml: ModuleType, handle: Any, device: int) -> str | None:
    try:
        value = int(nvml.nvmlDeviceGetBrand(handle))
    except nvml.NVMLError_NotSupported:
        return None
    if (name := _named(nvml, "NVML_BRAND_", _BRANDS, value)) is None:
        log.info("GPU brand has no name NVIDIA's DRA driver publishes; brand left out", vendor="nvidia",
                 device=device, reason=f"nvmlDeviceGetBrand = {value}")
    return name


def _addressing_mode(nvml: ModuleType, handle: Any, device: int) -> str | None:
    """HMM, ATS or None; not there (None) on drivers before 580, which lack the call, on platforms
    without it, and with a pynvml older than it."""
    try:
        value = int(nvml.nvmlDeviceGetAddressingMode(handle))
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, AttributeError):
        return None
    if (name := _named(nvml, "NVML_DEVICE_ADDRESSING_MODE_", _ADDRESSING_MODES, value)) is None:
        log.info("GPU addressing mode unknown; addressingMode left out", vendor="nvidia", device=device,
                 reason=f"nvmlDeviceGetAddressingMode = {value}")
    return name


def _minor_number(nvml: ModuleType, handle: Any) -> int | None:
    try:
        return int(nvml.nvmlDeviceGetMinorNumber(handle))
    except nvml.NVMLError_NotSupported:
        return None


def _nvlink_peers(nvml: ModuleType, handle: Any) -> tuple[str, ...]:
    """The bus id at the far end of every active NVLink; links that error are not active."""
    peers: list[str] = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            peers.append(normalise_bdf(text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)))
        except nvml.NVMLError:
            continue
    return tuple(peers)


def _fabric_info(nvml: ModuleType, handle: Any) -> Any:
    """The GPU's fabric info: the versioned call, else (a driver without it) the first one."""
    try:
        info = nvml.c_nvmlGpuFabricInfo_v2_t()
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, nvml.byref(info))  # pynvml passes the pointer on as is
    except nvml.NVMLError_FunctionNotFound:
        info = nvml.c_nvmlGpuFabricInfo_t()
        nvml.nvmlDeviceGetGpuFabricInfo(handle, nvml.byref(info))
    return info


def _clique(nvml: ModuleType, handle: Any) -> str | None:
    """"<clusterUUID>.<cliqueId>" once the GPU's fabric registration has completed, else None."""
    try:
        info = _fabric_info(nvml, handle)
    except nvml.NVMLError:  # NOT_SUPPORTED without a fabric; FUNCTION_NOT_FOUND on drivers older than it
        return None
    except AttributeError:  # a pynvml older than the fabric API
        return None
    cluster = bytes(info.clusterUuid)
    done = info.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED and info.status == nvml.NVML_SUCCESS
    if not done or not any(cluster):
        return None
    return f"{uuidlib.UUID(bytes=cluster)}.{info.cliqueId}"


class Implausible(Exception):
    """NVML reported a value outside physical bounds (vendors.plausible) for a GPU."""


def _implausible(memory_bytes: int, compute_capability: tuple[int, int] | None,
                 mig_devices: tuple[MigDevice, ...]) -> str | None:
    """The first value outside physical bounds, or None. Compute capability 0.x stays legal: GFD
    writes no family for it."""
    major, minor = compute_capability or (0, 0)
    biggest_mig = max(mig_devices, key=lambda mig: mig.memory_mib, default=None)
    return first_problem(
        outside("memory bytes", memory_bytes, 0, MAX_MEMORY_BYTES),
        outside("compute capability major", major, 0, MAX_COMPUTE_MAJOR),
        outside("compute capability minor", minor, 0, MAX_COMPUTE_MINOR),
        f"MIG device {biggest_mig.uuid} has {biggest_mig.memory_mib} MiB, more than its GPU's {memory_bytes // MIB} MiB"
        if biggest_mig is not None and biggest_mig.memory_mib * MIB > memory_bytes else None,
    )


def _read_gpu(nvml: ModuleType, index: int, pci_by_bdf: dict[str, PciGpu], geometry: bool = False) -> NvidiaGpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    bus_id = normalise_bdf(text(nvml.nvmlDeviceGetPciInfo(handle).busId))
    memory_bytes = _memory_bytes(nvml, handle, index)
    mig_capable, mig_enabled = _mig_mode(nvml, handle)
    compute_capability = _compute_capability(nvml, handle)
    mig_devices = _mig_devices(nvml, handle, memory_bytes) if mig_enabled and memory_bytes else ()
    reason = _implausible(memory_bytes, compute_capability, mig_devices)
    if reason:
        raise Implausible(f"{reason}, beyond any real GPU")
    pci = pci_by_bdf.get(bus_id)
    mig_profiles = _geometry(nvml, handle, memory_bytes, index) if geometry and mig_enabled and memory_bytes else ()
    return NvidiaGpu(
        index=index,
        name=text(nvml.nvmlDeviceGetName(handle)),
        uuid=text(nvml.nvmlDeviceGetUUID(handle)),
        memory_bytes=memory_bytes,
        compute_capability=compute_capability,
        pci_bus_id=bus_id,
        minor_number=_minor_number(nvml, handle),
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_devices=mig_devices,
        nvlink_peers=_nvlink_peers(nvml, handle),
        numa_node=pci.numa_node if pci else None,
        pci_class=pci.class_code if pci else None,
        clique=_clique(nvml, handle),
        vgpu_guest=_vgpu_guest(nvml, handle),
        brand=_brand(nvml, handle, index),
        addressing_mode=_addressing_mode(nvml, handle, index),
        mig_profiles=mig_profiles,
    )


def _read_gpus(nvml: ModuleType, pci_by_bdf: dict[str, PciGpu], geometry: bool = False
               ) -> tuple[list[NvidiaGpu], list[str]]:
    """Every GPU NVML can describe (with ``geometry``, a MIG-enabled GPU's profiles and placements);
    one GPU's error skips that GPU only."""
    gpus: list[NvidiaGpu] = []
    problems: list[str] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            gpus.append(_read_gpu(nvml, index, pci_by_bdf, geometry))
        except nvml.NVMLError as exc:
            log.warning("GPU skipped: NVML error", vendor="nvidia", device=index, error=str(exc))
            problems.append(f"GPU {index}: NVML error: {exc}; GPU left out of the labels")
        except Implausible as exc:
            log.warning("GPU skipped: implausible value", vendor="nvidia", device=index, reason=str(exc))
            problems.append(f"GPU {index}: {exc}; GPU left out of the labels")
    return gpus, problems


# --- probe ----------------------------------------------------------------------------------------

def load(nvml: ModuleType | None) -> ModuleType:
    """The pynvml API to call: a simulation's module, else the real pynvml (imported on first use,
    so that nodes without NVIDIA GPUs never load it)."""
    return nvml if nvml is not None else importlib.import_module("pynvml")


def _init_failure(nvml: ModuleType, exc: Exception, on_pci: int) -> BackendReport:
    code = getattr(exc, "value", None)
    if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        reason = "NVML library not found"
    elif code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        reason = "NVIDIA driver not loaded"
    else:
        return BackendReport("nvidia", "error", f"NVML initialisation failed: {exc}")
    if not on_pci:
        return BackendReport("nvidia", "absent", f"no NVIDIA GPU on the PCI bus; {reason}")
    return BackendReport(
        "nvidia", "unavailable",
        f"{reason}: {exc}; {on_pci} NVIDIA GPU(s) on the PCI bus; GPU detail labels omitted; "
        "nvidia.com/gpu.present still set from PCI",
    )


def _inventory(nvml: ModuleType, host_root: Path, nvidia_pci: tuple[PciGpu, ...], geometry: bool = False
               ) -> tuple[NvidiaInventory | None, BackendReport]:
    driver_version = text(nvml.nvmlSystemGetDriverVersion())
    cuda_driver_version = int(nvml.nvmlSystemGetCudaDriverVersion())
    gpus, problems = _read_gpus(nvml, {gpu.bdf: gpu for gpu in nvidia_pci}, geometry)
    is_vgpu, host = vgpu_state(host_root, nvidia_pci, {gpu.pci_bus_id: gpu.vgpu_guest for gpu in gpus}, problems)
    if not gpus and not problems:
        status: BackendStatus = "unavailable" if nvidia_pci else "absent"
        return None, BackendReport("nvidia", status,
                                   f"NVML sees no GPU; {len(nvidia_pci)} NVIDIA GPU(s) on the PCI bus")
    inventory = NvidiaInventory(driver_version, cuda_driver_version, tuple(gpus), vgpu_present=is_vgpu,
                                vgpu_host_driver=host)
    detail = f"{len(gpus)} GPU(s), driver {driver_version}"
    return inventory, BackendReport("nvidia", "ok", detail, tuple(problems))


def probe(host_root: Path, pci_gpus: tuple[PciGpu, ...], config: Config | None = None, nvml: ModuleType | None = None
          ) -> tuple[NvidiaInventory | None, BackendReport]:
    """Describe the node's NVIDIA GPUs through NVML (``nvml``: a simulation's pynvml, else the real
    one). Never raises: failures become the report. A config that makes MIG devices at prepare
    (``labeller.dra.dynamicMig``) has the MIG-enabled GPUs' profiles and placements read too."""
    try:
        part, report = _probe(host_root, pci_gpus, nvml, config is not None and config.dra_dynamic_mig)
        if part is not None and config is not None:
            part = replace(part, mps=probe_readiness(config))
        return part, report
    except Exception as exc:  # a backend must never take discovery down; the report carries the reason
        log.error("NVIDIA probe failed", vendor="nvidia", error=str(exc), exc_info=True)
        return None, BackendReport("nvidia", "error", f"NVIDIA probe failed: {type(exc).__name__}: {exc}")


def _probe(host_root: Path, pci_gpus: tuple[PciGpu, ...], nvml: ModuleType | None, geometry: bool = False
           ) -> tuple[NvidiaInventory | None, BackendReport]:
    nvidia_pci = tuple(gpu for gpu in pci_gpus if gpu.vendor_id == PCI_VENDOR_ID)
    try:
        nvml = load(nvml)
    except ImportError as exc:
        return None, BackendReport("nvidia", "error" if nvidia_pci else "absent", f"pynvml not importable: {exc}")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return None, _init_failure(nvml, exc, len(nvidia_pci))  # discovery logs the report, once
    try:
        return _inventory(nvml, host_root, nvidia_pci, geometry)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed", vendor="nvidia", error=str(exc))
