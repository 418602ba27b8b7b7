"""MIG devices made at prepare and destroyed at unprepare, through NVML (``labeller.dra.dynamicMig``).

Making the device ``gpu-<minor>-mig-<profile>-<profile id>-<start>`` (its ``DraDevice.make``: the
GPU's UUID, the GPU instance profile id, the placement and the compute slices) is what NVIDIA's
driver does: nvmlDeviceCreateGpuInstanceWithPlacement at that placement, then
nvmlGpuInstanceCreateComputeInstance of the compute instance profile that spans the GPU instance;
the MIG device that appears is read as the probe reads one (its UUID, its instance ids, which the
CDI spec's ``nvidia-caps`` nodes follow). A compute instance that cannot be made has its GPU instance
destroyed again: nothing is left half made. NVML refusing (INSUFFICIENT_RESOURCES: the placement is
taken, by someone else's MIG device or one made outside Kubernetes' view) is the claim's error.

Unmaking destroys the compute instance, then the GPU instance, after checking that the MIG device
at those ids is still the one made (its UUID): ids are reused once a MIG device is gone, and a MIG
device that is not the one made is left alone. Gone already is fine; IN_USE (a process still runs on
it) is refused, for the kubelet to try again.

NVML is initialised for each call and shut down after (its init is counted, so the probe and the
health checks, which use it too, are not disturbed).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from labeller.model.resourceslices import DraDevice
from labeller.model.vendor.dra import DeviceMaker, Made, MakeRefused
from vendors.nvidia import nvml as backend
from vendors.nvidia.devices import VENDOR, NvidiaDevice
from vendors.nvidia.facts import compute_instance_profiles
from vendors.nvidia.model import MigDevice, NvidiaGpu
from labeller.base.log import get_logger

log = get_logger(__name__)

MAX_GPU_INSTANCES = 32  # more GPU instance ids than any GPU has, looked through for one left half made
MAX_COMPUTE_INSTANCES = 8


def _int(plan: Mapping[str, Any], key: str) -> int:
    value = plan.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MakeRefused(f"the plan's {key} is {value!r}, not a count")
    return value


def _text(plan: Mapping[str, Any], key: str) -> str:
    value = plan.get(key)
    if not isinstance(value, str) or not value:
        raise MakeRefused(f"the plan's {key} is {value!r}, not a name")
    return value


class MigMaker(DeviceMaker):
    """``nvml``: a simulation's pynvml; None: the real one, imported on first use."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._module = nvml

    @contextmanager
    def _nvml(self, what: str) -> Iterator[ModuleType]:
        nvml = backend.load(self._module)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise MakeRefused(f"{what}: NVML cannot be initialised: {exc}") from None
        try:
            yield nvml
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_INSUFFICIENT_RESOURCES:
                raise MakeRefused(f"{what}: NVML: the GPU has no room for it there (INSUFFICIENT_RESOURCES: a MIG "
                                  "device that was not made for a claim holds part of its placement)") from None
            raise MakeRefused(f"{what}: NVML: {exc}") from None
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass

    # --- making ---------------------------------------------------------------------------------

    def make(self, device: DraDevice) -> Made:
        plan = device.make or {}
        gpu_uuid, profile_id = _text(plan, "gpu"), _int(plan, "profileId")
        start, size, slices = _int(plan, "start"), _int(plan, "size"), _int(plan, "slices")
        with self._nvml(f"MIG device {device.name}") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            placement = nvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, size
            gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, ctypes.byref(placement))
            try:
                compute_instance = nvml.nvmlGpuInstanceCreateComputeInstance(
                    gpu_instance, self._compute_profile_id(nvml, gpu_instance, slices))
            except nvml.NVMLError:
                nvml.nvmlGpuInstanceDestroy(gpu_instance)
                raise
            gi_id = int(nvml.nvmlGpuInstanceGetInfo(gpu_instance).id)
            ci_id = int(nvml.nvmlComputeInstanceGetInfo(compute_instance).id)
            mig = self._mig_device(nvml, handle, gi_id, ci_id)
        physical = self._physical(device, mig)
        log.info("MIG device made", vendor="nvidia", device=device.name, uuid=mig.uuid, gpu=gpu_uuid,
                 gpu_instance=gi_id, compute_instance=ci_id)
        return Made({"gpu": gpu_uuid, "gi": gi_id, "ci": ci_id, "uuid": mig.uuid, "profileId": profile_id,
                     "start": start}, physical)

    @staticmethod
    def _compute_profile_id(nvml: ModuleType, gpu_instance: Any, slices: int) -> int:
        """The id of the compute instance profile that spans the GPU instance (``slices`` compute slices)."""
        for index, ci_slices in sorted(compute_instance_profiles(nvml).items()):
            if ci_slices != slices:
                continue
            try:
                info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gpu_instance, index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                continue
            return int(info.id)
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)

    @staticmethod
    def _mig_device(nvml: ModuleType, handle: Any, gi_id: int, ci_id: int) -> MigDevice:
        """The MIG device of the GPU's instances ``gi_id``/``ci_id``, as the probe reads it."""
        total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                continue
            if (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)) == (gi_id, ci_id):
                return backend.read_mig_device(nvml, handle, total, mig, index)
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_FOUND)

    @staticmethod
    def _physical(device: DraDevice, mig: MigDevice) -> NvidiaDevice:
        """What the claim's CDI spec is built from: the MIG device made, named by its UUID."""
        planned = device.physical
        gpu = planned.nvml_gpu if isinstance(planned, NvidiaDevice) else None
        if not isinstance(gpu, NvidiaGpu):
            raise MakeRefused(f"MIG device {device.name}: not an NVIDIA device")
        return NvidiaDevice(vendor=VENDOR, health_key=mig.uuid, visible_id=mig.uuid, gpu=gpu.pci_bus_id,
                            numa_node=gpu.numa_node, partition=mig.profile, nvml_gpu=gpu, mig=mig,
                            names=(mig.uuid, device.name))

    # --- unmaking -------------------------------------------------------------------------------

    def unmake(self, record: Mapping[str, Any]) -> None:
        gpu_uuid, gi_id, ci_id = _text(record, "gpu"), _int(record, "gi"), _int(record, "ci")
        uuid = _text(record, "uuid")
        with self._nvml(f"MIG device {uuid}") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            try:
                gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            except nvml.NVMLError_NotFound:
                log.info("MIG device already gone", vendor="nvidia", uuid=uuid, gpu=gpu_uuid)
                return
            try:
                found = self._mig_device(nvml, handle, gi_id, ci_id)
            except nvml.NVMLError_NotFound:  # its compute instance went, and then the plugin did
                self._empty_gpu_instance(nvml, gpu_instance, record)
                return
            if found.uuid != uuid:
                log.warning("the MIG device at the instances made is another one now; left alone", vendor="nvidia",
                            uuid=found.uuid, made=uuid, gpu=gpu_uuid, reason="not-ours")
                return
            nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id))
            nvml.nvmlGpuInstanceDestroy(gpu_instance)
        log.info("MIG device destroyed", vendor="nvidia", uuid=uuid, gpu=gpu_uuid, gpu_instance=gi_id,
                 compute_instance=ci_id)

    @staticmethod
    def _empty_gpu_instance(nvml: ModuleType, gpu_instance: Any, record: Mapping[str, Any]) -> None:
        """The GPU instance made, left without its compute instance: destroyed where it is still the
        one made (its profile and placement; no compute instance in it), else left alone."""
        info = nvml.nvmlGpuInstanceGetInfo(gpu_instance)
        if (int(info.profileId), int(info.placement.start)) != (record.get("profileId"), record.get("start")):
            log.warning("the GPU instance made is another one now; left alone", vendor="nvidia",
                        gpu=record.get("gpu"), gpu_instance=record.get("gi"), reason="not-ours")
            return
        try:
            nvml.nvmlGpuInstanceDestroy(gpu_instance)
        except nvml.NVMLError_InUse:
            log.warning("the GPU instance made has a compute instance someone else made; left alone", vendor="nvidia",
                        gpu=record.get("gpu"), gpu_instance=record.get("gi"), reason="not-ours")
            return
        log.info("GPU instance left without its compute instance destroyed", vendor="nvidia", gpu=record.get("gpu"),
                 gpu_instance=record.get("gi"))

    def abandon(self, plan: Mapping[str, Any]) -> None:
        """Destroy what sits at the plan's placement with the plan's profile: the GPU instance (and its
        compute instances) a killed plugin made and never recorded."""
        gpu_uuid, profile_id, start = _text(plan, "gpu"), _int(plan, "profileId"), _int(plan, "start")
        with self._nvml(f"the MIG device planned on {gpu_uuid} at memory slice {start}") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            for gi_id in range(MAX_GPU_INSTANCES):
                try:
                    gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
                except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                    continue
                info = nvml.nvmlGpuInstanceGetInfo(gpu_instance)
                if (int(info.profileId), int(info.placement.start)) != (profile_id, start):
                    continue
                for ci_id in range(MAX_COMPUTE_INSTANCES):
                    try:
                        nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id))
                    except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                        continue
                nvml.nvmlGpuInstanceDestroy(gpu_instance)
                log.info("a MIG device whose making was never recorded destroyed", vendor="nvidia", gpu=gpu_uuid,
                         gpu_instance=gi_id, profile_id=profile_id, start=start)


def maker(host_root: Path, handles: Mapping[str, Any]) -> DeviceMaker:
    """The DRA plugin's maker: the simulation's NVML where the host is simulated, else the real one."""
    handle = handles.get("nvidia")
    return MigMaker(handle if isinstance(handle, ModuleType) else None)
