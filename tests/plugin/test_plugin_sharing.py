"""Sharing served to the kubelet emulator: MPS replicas that follow the control daemon's readiness
file, MPS Allocate as NVIDIA's mps.go answers it, subsets of GPUs shared under their own name, and
AMD partitions under AMD's mixed naming."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labeller.model.config import parse_config
from labeller.host.machine import NodeOptions, open_host
from tests.builders import kfd_node_goes, nvidia_part, offer_of
from tests.fakes.kubelet import AdmissionError, FakeKubelet
from tests.plugin.conftest import probing_plugin, running_plugin
from tests.plugin.profile_files import l40s_node, write_yaml
from vendors import RESOURCE_NAMES
from vendors.nvidia import mps

GPU = "nvidia.com/gpu"


@pytest.fixture
def mps_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def mps_config(root: Path, **entry: object) -> dict[str, object]:
    return {"version": "v1", "flags": {"mpsRoot": str(root)},
            "sharing": {"mps": {"resources": [{"name": GPU, "replicas": 4, **entry}]}}}


def declare_ready(root: Path, config: dict[str, object], profile: Path, heartbeat: float | None = None) -> None:
    """Write the readiness file as gpu-labeller mps-control-daemon does once every daemon answers."""
    with open_host(NodeOptions(simulate=str(profile))) as node:
        offer = offer_of(node.probe(), parse_config(config, RESOURCE_NAMES))
    served = [mps.served(h.resource) for h in offer.held if h.waiting]
    heartbeat = time.time() if heartbeat is None else heartbeat
    mps.ready_file(str(root)).write_text(mps.ready_document(served, heartbeat, 30))


def test_mps_replicas_are_served_while_the_control_daemon_is_ready(sock_dir: Path, kubelet: FakeKubelet,
                                                                   tmp_path: Path, mps_root: Path) -> None:
    profile, config_file = tmp_path / "node.yaml", tmp_path / "config.yaml"
    config = mps_config(mps_root)
    write_yaml(profile, l40s_node(2))
    config_file.write_text(json.dumps(config))
    with open_host(NodeOptions(simulate=str(profile), config_path=config_file)) as node, \
            probing_plugin(sock_dir, node, config_file) as run:
        assert kubelet.wait_for(lambda: run.plugin.applied >= 1)  # probed and served: nothing, no daemon is ready
        assert kubelet.registrations == [] and run.exit_code == []
        declare_ready(mps_root, config, profile)
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
        uuids = [g.uuid for g in nvidia_part(node.probe()).gpus]
        assert sorted(kubelet.devices(GPU)) == sorted(f"{u}::{n}" for u in uuids for n in range(4))
        response, (ids,) = kubelet.admit(GPU, [1])
        (container,) = response.container_responses
        # NVIDIA's mps.go: the pipe directory the container sees, and the host's pipe and shm directories
        assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": ids[0].split("::")[0],
                                        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe"}
        assert [(m.host_path, m.container_path, m.read_only) for m in container.mounts] == [
            (f"{mps_root}/nvidia.com/gpu/pipe", "/mps/nvidia.com/gpu/pipe", False),
            (f"{mps_root}/shm", "/dev/shm", False)]
        with pytest.raises(AdmissionError, match="maximum request size for shared resources is 1"):
            kubelet.admit(GPU, [2])  # failRequestsGreaterThanOne defaults to true under MPS
        # the control daemon stops (its heartbeat goes stale): the replicas are withdrawn
        declare_ready(mps_root, config, profile, heartbeat=time.time() - 60)
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 0)


def test_a_subset_shared_by_mps_leaves_the_other_gpus_whole(sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path,
                                                            mps_root: Path) -> None:
    profile, config_file = tmp_path / "node.yaml", tmp_path / "config.yaml"
    config = mps_config(mps_root, devices=[1], rename="gpu-mps")
    write_yaml(profile, l40s_node(3))
    config_file.write_text(json.dumps(config))
    with open_host(NodeOptions(simulate=str(profile), config_path=config_file)) as node, \
            probing_plugin(sock_dir, node, config_file):
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2)  # GPUs 0 and 2, whole, at once
        assert kubelet.allocatable("nvidia.com/gpu-mps") == 0
        declare_ready(mps_root, config, profile)
        assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu-mps") == 4)
        response, _ = kubelet.admit("nvidia.com/gpu-mps", [1])
        assert response.container_responses[0].envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu-mps/pipe"
        whole, (ids,) = kubelet.admit(GPU, [1])
        assert "CUDA_MPS_PIPE_DIRECTORY" not in whole.container_responses[0].envs and "::" not in ids[0]


def test_four_of_eight_gpus_shared_by_time_slicing(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-h100-4of8-shared") as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4 and kubelet.allocatable(f"{GPU}.shared") == 16)
        gpus = nvidia_part(running.inventory).gpus
        assert sorted(kubelet.devices(GPU)) == sorted(g.uuid for g in gpus[4:])  # the first four are shared
        assert {i.split("::")[0] for i in kubelet.devices(f"{GPU}.shared")} == {g.uuid for g in gpus[:4]}
        response, (ids,) = kubelet.admit(f"{GPU}.shared", [1])
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ids[0].split("::")[0]


def test_amd_mixed_naming_serves_each_partition_with_its_render_node(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "mi300x-x8-cpx-mixed") as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable("amd.com/cpx_nps4") == 63)
        assert kubelet.registration_count("amd.com/gpu") == 0
        (resource,) = offer_of(running.inventory, running.config).resources
        assert {d.physical.partition for d in resource.devices} == {"cpx"}
        response, _ = kubelet.admit("amd.com/cpx_nps4", [1])
        chosen = kubelet.allocated["amd.com/cpx_nps4"]
        (given,) = [d for d in resource.devices if d.id in chosen]
        paths = [d.host_path for d in response.container_responses[0].devices]
        assert paths == ["/dev/kfd", f"/dev/dri/renderD{given.physical.node.render_minor}"]  # type: ignore[attr-defined]


def test_a_partition_whose_kfd_node_disappears_alone_turns_unhealthy(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "mi300x-x8-cpx-mixed", recovery_seconds=60) as running:
        name = "amd.com/cpx_nps4"
        assert kubelet.wait_for(lambda: kubelet.allocatable(name) == 63)
        (resource,) = offer_of(running.inventory, running.config).resources
        victim = resource.devices[10]
        kfd_node_goes(running.host_root, victim.physical.node.kfd_node)  # type: ignore[attr-defined]
        assert kubelet.wait_for(lambda: kubelet.allocatable(name) == 62)
        assert [i for i, health in kubelet.devices(name).items() if health == "Unhealthy"] == [victim.id]
        assert kubelet.capacity(name) == 63


def test_a_sharing_config_naming_a_missing_gpu_serves_nothing_new_and_says_why(sock_dir: Path, kubelet: FakeKubelet,
                                                                               tmp_path: Path) -> None:
    import structlog

    profile, config_file = tmp_path / "node.yaml", tmp_path / "config.yaml"
    write_yaml(profile, l40s_node(2))
    config_file.write_text(json.dumps({"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": GPU, "replicas": 2, "devices": [0, 7], "rename": "gpu-ts"}]}}}))
    with structlog.testing.capture_logs() as logs, \
            open_host(NodeOptions(simulate=str(profile), config_path=config_file)) as node, \
            probing_plugin(sock_dir, node, config_file) as run:
        assert kubelet.wait_for(lambda: any(e.get("event") == "driver not ready; probing again" for e in logs))
        (error,) = [e for e in logs if e.get("reason") == "bad-config"][:1]
        assert "sharing.timeSlicing.resources[0].devices: no device 7 in nvidia.com/gpu" in error["error"]
        assert kubelet.registrations == [] and run.plugin.resources == ()
