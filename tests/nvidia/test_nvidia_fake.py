"""The fake pynvml: pynvml's semantics for what the backend and the device plugin call, and profile checks."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tests.builders import A100_40GB_BYTES, H100_BYTES, a100, build, h100, mig_1g5gb, section
from vendors.nvidia import simulate as fake_nvml


@pytest.fixture
def nvml(tmp_path: Path) -> Any:
    module = build(tmp_path,
                   section(h100(repeat=2, numa_node=[0, 1]), a100(mig_mode="enabled", mig_devices=[mig_1g5gb(2)])))[1]
    module.nvmlInit()
    yield module
    module.nvmlShutdown()


def test_errors_and_constants_are_pynvmls(nvml: Any) -> None:
    assert nvml.NVMLError is pynvml.NVMLError and nvml.NVMLError_Timeout is pynvml.NVMLError_Timeout
    assert nvml.NVML_ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST == 15
    assert nvml.nvmlEventTypeXidCriticalError == 0x8 and nvml.NVML_NVLINK_MAX_LINKS == pynvml.NVML_NVLINK_MAX_LINKS


def test_calls_need_nvml_init(tmp_path: Path) -> None:
    module = build(tmp_path, section(h100()))[1]
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        module.nvmlDeviceGetCount()


def test_device_getters_return_what_pynvml_returns(nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    assert nvml.nvmlDeviceGetMemoryInfo(handle).total == H100_BYTES
    assert nvml.nvmlDeviceGetCudaComputeCapability(handle) == (9, 0)
    # pynvml's structures decode char arrays: busId is str (older pynvml gave bytes), 8-digit domain
    assert nvml.nvmlDeviceGetPciInfo(handle).busId == "00000000:00:00.0"
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    assert nvml.nvmlDeviceGetHandleByUUID(nvml.nvmlDeviceGetUUID(handle)) is handle
    assert nvml.nvmlSystemGetDriverVersion() == "550.54.15" and nvml.nvmlSystemGetCudaDriverVersion() == 12040


def test_mig_handles(nvml: Any) -> None:
    parent = nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    attributes = nvml.nvmlDeviceGetAttributes(mig)
    assert (attributes.multiprocessorCount, attributes.memorySizeMB, attributes.gpuInstanceSliceCount) == (14, 4864, 1)
    assert nvml.nvmlDeviceGetUUID(mig) == "MIG-00000000-0000-4000-8000-000000000201"
    assert nvml.nvmlDeviceGetMemoryInfo(parent).total == A100_40GB_BYTES
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)


def test_event_wait_times_out(nvml: Any) -> None:
    events = nvml.nvmlEventSetCreate()
    start = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 50)
    assert time.monotonic() - start >= 0.045
    nvml.nvmlEventSetFree(events)


def test_injected_xid_reaches_a_registered_waiter(nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    events = nvml.nvmlEventSetCreate()
    mask = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
    nvml.nvmlDeviceRegisterEvents(handle, mask & nvml.nvmlDeviceGetSupportedEventTypes(handle), events)
    threading.Timer(0.05, nvml.inject_xid, args=(nvml.nvmlDeviceGetUUID(handle), 79)).start()
    event = nvml.nvmlEventSetWait(events, 5000)
    assert event.device is handle and event.eventData == 79
    assert event.eventType == nvml.nvmlEventTypeXidCriticalError
    assert (event.gpuInstanceId, event.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)


def test_xid_on_a_mig_device_names_its_instances(nvml: Any) -> None:
    parent = nvml.nvmlDeviceGetHandleByIndex(2)
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(parent, nvml.nvmlEventTypeXidCriticalError, events)
    nvml.inject_xid("MIG-00000000-0000-4000-8000-000000000201", 31)
    event = nvml.nvmlEventSetWait(events, 0)
    assert event.device is parent and (event.eventData, event.gpuInstanceId, event.computeInstanceId) == (31, 2, 0)


def test_unregistered_devices_get_no_events(nvml: Any) -> None:
    events = nvml.nvmlEventSetCreate()
    nvml.inject_xid(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(1)), 48)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 0)


def test_lost_gpu(nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    uuid = nvml.nvmlDeviceGetUUID(handle)
    nvml.set_lost(uuid, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetName(handle)
    nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))  # the others still answer
    nvml.set_lost(uuid, False)
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"


def test_gpu_instances_have_the_real_profile_ids_and_placements(nvml: Any) -> None:
    parent = nvml.nvmlDeviceGetHandleByIndex(2)
    infos = [nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(parent, gi)) for gi in (1, 2)]
    assert [(i.id, i.profileId, i.placement.start, i.placement.size) for i in infos] == [(1, 19, 0, 1), (2, 19, 1, 1)]
    one_slice = nvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert (one_slice.id, one_slice.sliceCount) == (19, 1)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # not a profile of an A100
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX)


def test_pci_sysfs_entries(tmp_path: Path) -> None:
    root, _ = build(tmp_path, section(h100(numa_node=1, pci_device_id=0x2330, pci_bus_id="0000:1b:00.0")))
    device = root / "sys/bus/pci/devices/0000:1b:00.0"
    files = {name: (device / name).read_text().strip() for name in ("vendor", "device", "class", "numa_node")}
    assert files == {"vendor": "0x10de", "device": "0x2330", "class": "0x030200", "numa_node": "1"}


def test_repeat_fills_templates(tmp_path: Path) -> None:
    nvml = build(tmp_path, section(h100(repeat=3, pci_bus_id="0000:{i:02x}:00.0")))[1]
    nvml.nvmlInit()
    buses = [nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i)).busId for i in range(3)]
    assert buses == ["00000000:00:00.0", "00000000:01:00.0", "00000000:02:00.0"]


@pytest.mark.parametrize(("nvidia", "message"), [
    (section(h100(), h100(), h100(memory_bytes=-1)), "nvidia.gpus[2].memory_bytes: must be a positive integer"),
    (section(h100(bogus=1)), "nvidia.gpus[0].bogus: unknown key"),
    (section(h100(mig_mode="on")), "nvidia.gpus[0].mig_mode: must be one of unsupported, disabled, enabled"),
    (section(h100(mig_devices=[mig_1g5gb()])), "nvidia.gpus[0].mig_devices: needs mig_mode: enabled"),
    (section(a100(mig_mode="enabled", mig_devices=[{**mig_1g5gb(), "profile": "1g.6gb"}])),
     "nvidia.gpus[0].mig_devices[0].profile: 1g.6gb does not match memory_mib 4864"),
    (section(a100(mig_mode="enabled", mig_devices=[mig_1g5gb(8)])), "nvidia.gpus[0].mig_devices: at most 7"),
    (section(a100(mig_mode="enabled", mig_devices=[{**mig_1g5gb(), "profile": "1g.5gb+gfx"}])),
     "nvidia.gpus[0].mig_devices[0].profile: 1g.5gb+gfx is not a MIG profile of the A100 40GB (its profiles: "
     "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb;"),
    (section(a100(mig_mode="enabled", mig_devices=[{**mig_1g5gb(), "placement_start": 7}])),
     "nvidia.gpus[0].mig_devices[0].placement_start: 7 is not a placement of 1g.5gb on the A100 40GB"),
    (section(a100(mig_mode="enabled", mig_devices=[{**mig_1g5gb(), "placement_size": 2}])),
     "nvidia.gpus[0].mig_devices[0].placement_size: 2: a GPU instance of 1g.5gb takes 1 memory slices"),
    (section(a100(mig_mode="enabled", mig_devices=[{"profile": "4g.20gb", "uuid": "MIG-a{i}", "memory_mib": 20096},
                                                   {"profile": "3g.20gb", "uuid": "MIG-b{i}", "memory_mib": 20096},
                                                   {**mig_1g5gb(), "uuid": "MIG-c{i}"}])),
     "nvidia.gpus[0].mig_devices: its GPU instances do not fit on one GPU together"),
    (section(a100(name="NVIDIA A30", mig_mode="enabled", mig_devices=[mig_1g5gb()])),
     "nvidia.gpus[0].mig_devices[0].profile: 1g.5gb is not a MIG profile of the A30"),
    (section(a100(name="NVIDIA A30", memory_bytes=24576 << 20, mig_mode="enabled",
                  mig_devices=[{**mig_1g5gb(5), "profile": "1g.6gb", "memory_mib": 5952}])),
     "nvidia.gpus[0].mig_devices: at most 4 MIG devices on the A30, got 5"),
    (section(a100(mig_mode="enabled", mig_devices=[
        {"profile": "2c.3g.20gb", "uuid": "MIG-a{i}", "gpu_instance_id": 1, "compute_instance_id": n}
        for n in range(2)])),
     "nvidia.gpus[0].mig_devices: the compute instances of GPU instance 1 take 4 compute slices; its 3g.20gb has 3"),
    (section(a100(name="NVIDIA Z100", mig_mode="enabled", mig_devices=[{**mig_1g5gb(), "memory_mib": None}])),
     "nvidia.gpus[0].mig_devices[0].memory_mib: must be a positive integer: the MIG table does not know this GPU"),
    (section(a100(name="NVIDIA Z100", mig_mode="enabled", mig_devices=[
        {**mig_1g5gb(), "uuid": "MIG-a{i}", "placement_start": 0, "placement_size": 2},
        {**mig_1g5gb(), "uuid": "MIG-b{i}", "placement_start": 1}])),
     "nvidia.gpus[0].mig_devices: GPU instances 1 and 2 overlap (memory slices 1 to 1)"),
    (section(h100(pci_bus_id="nonsense")), "nvidia.gpus[0].pci_bus_id: not a PCI bus id"),
    (section(h100(repeat=2, numa_node=[0])), "nvidia.gpus[0].numa_node: a list here needs exactly repeat=2"),
    (section(h100(uuid="GPU-same"), h100(uuid="GPU-same")), "GPU-same appears twice"),
    (section(h100(nvlink_peers=["0000:99:00.0"])), "nvidia.gpus[0].nvlink_peers: 0000:99:00.0 is not the bus id"),
    (section(h100(error="kaput")), "nvidia.gpus[0].error: must be an NVML error name"),
    (section(h100(compute_capability=9)), "nvidia.gpus[0].compute_capability: must be [major, minor]"),
    ({"driver_version": "550.54.15", "gpus": []}, "nvidia.cuda_driver_version: must be a positive integer"),
    ([], "nvidia: must be a mapping"),
])
def test_bad_sections_name_the_key(tmp_path: Path, nvidia: Any, message: str) -> None:
    with pytest.raises(ValueError) as error:
        fake_nvml.build(nvidia, tmp_path)
    assert message in str(error.value) and "\n" not in str(error.value)
