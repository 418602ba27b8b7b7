"""Allocate responses: device-list strategies, device specs, AMD device nodes, and bad requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from labeller.model.config import parse_config
from labeller.model.inventory import Inventory
from labeller.apps.plugin.allocate import Allocator, RequestError
from labeller.apps.plugin.api import api_pb2 as pb
from tests.builders import amd, amd_gpu, amd_node, nvidia, nvidia_gpu, offer_of
from vendors import RESOURCE_NAMES, VENDORS


def allocator(inventory: Inventory, raw: dict[str, Any] | None = None, host_root: Path = Path("/nonexistent"),
              index: int = 0) -> Allocator:
    """The Allocator the plugin builds for the ``index``-th resource the node offers."""
    config = parse_config(raw, RESOURCE_NAMES)
    resource = offer_of(inventory, config).resources[index]
    vendor = next(v for v in VENDORS if v.name == resource.vendor)
    return Allocator(resource, config.sharing, vendor.devices.plugin_parts().allocator(config, host_root, resource))


def specs(response: pb.ContainerAllocateResponse) -> list[tuple[str, str, str]]:
    return [(d.container_path, d.host_path, d.permissions) for d in response.devices]


def test_envvar_default() -> None:
    response = allocator(nvidia(nvidia_gpu(0), nvidia_gpu(1))).container(["GPU-1", "GPU-0"])
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-0"}
    assert not response.devices and not response.mounts and not response.cdi_devices


def test_replicas_map_back_and_deduplicate() -> None:
    raw = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    response = allocator(nvidia(nvidia_gpu(0), nvidia_gpu(1)), raw).container(["GPU-0::1", "GPU-0::3", "GPU-1::0"])
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"


def test_fail_requests_greater_than_one() -> None:
    raw = {"sharing": {"timeSlicing": {"failRequestsGreaterThanOne": True,
                                       "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    alloc = allocator(nvidia(nvidia_gpu(0)), raw)
    assert alloc.container(["GPU-0::2"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0"
    with pytest.raises(RequestError, match="maximum request size for shared resources is 1"):
        alloc.container(["GPU-0::0", "GPU-0::1"])


def test_index_strategy_and_mig_indices() -> None:
    raw = {"flags": {"migStrategy": "mixed", "plugin": {"deviceIDStrategy": "index"}}}
    inventory = nvidia(nvidia_gpu(0), nvidia_gpu(1, mig=("1g.5gb", "1g.5gb")))
    assert allocator(inventory, raw).container(["0"]).envs["NVIDIA_VISIBLE_DEVICES"] == "0"
    assert allocator(inventory, raw, index=1).container(["1:1"]).envs["NVIDIA_VISIBLE_DEVICES"] == "1:1"


def test_volume_mounts_and_cdi() -> None:
    raw = {"flags": {"plugin": {"deviceListStrategy": ["volume-mounts", "cdi-annotations", "cdi-cri"],
                                "cdiAnnotationPrefix": "cdi.example.com/"}}}
    response = allocator(nvidia(nvidia_gpu(0), nvidia_gpu(1)), raw).container(["GPU-0", "GPU-1"])
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert [(m.host_path, m.container_path) for m in response.mounts] == [
        ("/dev/null", "/var/run/nvidia-container-devices/GPU-0"), ("/dev/null",
                                                                   "/var/run/nvidia-container-devices/GPU-1")]
    ((key, value),) = response.annotations.items()
    assert key.startswith("cdi.example.com/nvidia-device-plugin_")
    assert value == "k8s.device-plugin.nvidia.com/gpu=GPU-0,k8s.device-plugin.nvidia.com/gpu=GPU-1"
    assert [c.name for c in response.cdi_devices] == ["k8s.device-plugin.nvidia.com/gpu=GPU-0",
                                                      "k8s.device-plugin.nvidia.com/gpu=GPU-1"]


def test_cdi_only_adds_no_env_or_specs() -> None:
    raw = {"flags": {"plugin": {"deviceListStrategy": "cdi-cri", "passDeviceSpecs": True}}}
    response = allocator(nvidia(nvidia_gpu(3)), raw).container(["GPU-3"])
    assert not response.envs and not response.devices
    assert [c.name for c in response.cdi_devices] == ["k8s.device-plugin.nvidia.com/gpu=GPU-3"]


def test_pass_device_specs(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidia-modeset").touch()
    caps = tmp_path / "proc/driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text("config 1\nmonitor 2\ngpu1/gi1/access 12\ngpu1/gi1/ci0/access 13\n")
    raw = {"flags": {"nvidiaDevRoot": "/run/nvidia/driver", "migStrategy": "mixed",
                     "plugin": {"passDeviceSpecs": True}}}
    inventory = nvidia(nvidia_gpu(0), nvidia_gpu(1, mig=("1g.5gb",)))
    full = allocator(inventory, raw, tmp_path).container(["GPU-0"])
    root = "/run/nvidia/driver"
    assert specs(full) == [(p, root + p, "rwm") for p in (
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia0")]
    mig = allocator(inventory, raw, tmp_path, index=1).container(["MIG-1-0"])
    assert [s[0] for s in specs(mig)][-3:] == ["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap12",
                                               "/dev/nvidia-caps/nvidia-cap13"]


def test_amd_device_nodes_rwm() -> None:
    inventory = amd(amd_gpu("0000:03:00.0", amd_node(2, 0x300, render=128, card=1)),
                    amd_gpu("0000:05:00.0", amd_node(3, 0x500, render=129)))
    response = allocator(inventory).container(["0000:03:00.0", "0000:05:00.0"])
    assert specs(response) == [("/dev/kfd", "/dev/kfd", "rwm"), ("/dev/dri/card1", "/dev/dri/card1", "rwm"),
                               ("/dev/dri/renderD128", "/dev/dri/renderD128", "rwm"),
                               ("/dev/dri/renderD129", "/dev/dri/renderD129", "rwm")]
    assert not response.envs


@pytest.mark.parametrize(("ids", "message"), [
    (["GPU-9"], "unknown device ID"),
    ([], "no device IDs"),
    (["GPU-0", "GPU-0"], "repeated"),
    (["GPU-0::0"], "unknown device ID"),
])
def test_bad_container_requests(ids: list[str], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        allocator(nvidia(nvidia_gpu(0))).container(ids)


def test_one_response_per_container_and_empty_request() -> None:
    alloc = allocator(nvidia(nvidia_gpu(0), nvidia_gpu(1)))
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-0"]),
                                                     pb.ContainerAllocateRequest(devices_ids=["GPU-1"])])
    assert len(alloc.allocate(request).container_responses) == 2
    with pytest.raises(RequestError, match="no container requests"):
        alloc.allocate(pb.AllocateRequest())
