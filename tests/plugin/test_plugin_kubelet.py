"""The plugin against the kubelet emulator, over real gRPC on unix sockets."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import grpc
import pytest
import structlog

from labeller.apps.plugin.api import api_pb2 as pb
from labeller.apps.plugin.api import api_pb2_grpc as pb_grpc
from labeller.apps.plugin.manager import PluginManager
from labeller.apps.plugin.metrics import PluginMetrics
from tests.builders import (AT_ONCE_S, PATIENCE_S, RECOVERY_OUTLASTS_S, amd_part, kfd_node_goes, nvidia_part,
                            stays_true, wait_for)
from tests.fakes.kubelet import AdmissionError, FakeKubelet
from tests.plugin.conftest import running_plugin

GPU = "nvidia.com/gpu"
AMD = "amd.com/gpu"


def stub(sock_dir: Path, socket: str) -> pb_grpc.DevicePluginStub:
    return pb_grpc.DevicePluginStub(grpc.insecure_channel(f"unix://{sock_dir / socket}"))  # type: ignore[no-untyped-call]


def test_register_and_list(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-a100-mig-mixed"):
        expected = {GPU: 4, "nvidia.com/mig-1g.5gb": 18, "nvidia.com/mig-2g.10gb": 2, "nvidia.com/mig-3g.20gb": 2}
        assert kubelet.wait_for(lambda: all(kubelet.allocatable(r) == n for r, n in expected.items()))
        registered = {r.resource: (r.endpoint, r.version) for r in kubelet.registrations}
        assert registered == {
            GPU: ("nvidia-gpu.sock", "v1beta1"),
            "nvidia.com/mig-1g.5gb": ("nvidia-mig-1g.5gb.sock", "v1beta1"),
            "nvidia.com/mig-2g.10gb": ("nvidia-mig-2g.10gb.sock", "v1beta1"),
            "nvidia.com/mig-3g.20gb": ("nvidia-mig-3g.20gb.sock", "v1beta1"),
        }
        endpoint = kubelet.endpoint(GPU)
        assert endpoint is not None
        options = endpoint.options
        assert options.get_preferred_allocation_available and not options.pre_start_required
        assert endpoint.stub.GetDevicePluginOptions(pb.Empty(), timeout=PATIENCE_S) == options
        assert {kubelet.capacity(r) for r in expected} == set(expected.values())
        assert kubelet.rejected == []


def test_devices_carry_numa(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-h100") as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
        stream = stub(sock_dir, "nvidia-gpu.sock").ListAndWatch(pb.Empty())
        first = next(stream)
        stream.cancel()
        numa = {g.uuid: g.numa_node for g in nvidia_part(running.inventory).gpus}
        assert {d.ID: [n.ID for n in d.topology.nodes] for d in first.devices} == {u: [n] for u, n in numa.items()}
        assert {d.health for d in first.devices} == {"Healthy"}


def test_allocate_nvidia_prefers_nvlink_and_numa(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-h100") as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
        response, (ids,) = kubelet.admit(GPU, [4])
        numa = {g.uuid: g.numa_node for g in nvidia_part(running.inventory).gpus}
        assert len({numa[i] for i in ids}) == 1  # all-to-all NVLink: NUMA decides
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
        with pytest.raises(AdmissionError, match="Requested: 5, Available: 4"):
            kubelet.admit(GPU, [5])


def test_allocate_time_slicing_replicas(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "t4-time-slicing") as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4)
        uuid = nvidia_part(running.inventory).gpus[0].uuid
        response, chosen = kubelet.admit(GPU, [1, 2])
        assert [len(ids) for ids in chosen] == [1, 2] and all(i.startswith(uuid + "::") for c in chosen for i in c)
        assert [c.envs["NVIDIA_VISIBLE_DEVICES"] for c in response.container_responses] == [uuid, uuid]


def test_allocate_mig_mixed(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-a100-mig-mixed") as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/mig-3g.20gb") == 2)
        response, (ids,) = kubelet.admit("nvidia.com/mig-3g.20gb", [1])
        migs = {m.uuid: m.profile for g in nvidia_part(running.inventory).gpus for m in g.mig_devices}
        assert migs[ids[0]] == "3g.20gb"
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ids[0]


def test_allocate_amd_partitions(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "mi300x-x8-cpx") as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(AMD) == 63)
        response, (ids,) = kubelet.admit(AMD, [2])
        renders = {n.render_minor for g in amd_part(running.inventory).gpus for n in g.nodes}
        paths = [(d.container_path, d.permissions) for d in response.container_responses[0].devices]
        assert paths[0] == ("/dev/kfd", "rwm") and len(paths) == 3
        assert all(p.startswith("/dev/dri/renderD") and int(p[16:]) in renders and perm == "rwm"
                   for p, perm in paths[1:])
        assert ids[0][:-1] == ids[1][:-1]  # two partitions of one GPU


def test_bad_requests_get_invalid_argument(sock_dir: Path, kubelet: FakeKubelet) -> None:
    config = {"sharing": {"timeSlicing": {"failRequestsGreaterThanOne": True,
                                          "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    with running_plugin(sock_dir, "t4-time-slicing", config) as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4)
        uuid = nvidia_part(running.inventory).gpus[0].uuid
        plugin = stub(sock_dir, "nvidia-gpu.sock")
        for ids, message in [(["GPU-nope"], "unknown device ID"), ([f"{uuid}::0", f"{uuid}::1"], "maximum request"),
                             ([], "no device IDs")]:
            request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
            with pytest.raises(grpc.RpcError) as caught:
                plugin.Allocate(request, timeout=PATIENCE_S)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in caught.value.details()
        with pytest.raises(AdmissionError, match="INVALID_ARGUMENT: .*maximum request size"):
            kubelet.admit(GPU, [2])
        odd = pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=["x"], must_include_deviceIDs=["y"],
                                                   allocation_size=-3)])
        assert list(plugin.GetPreferredAllocation(odd, timeout=PATIENCE_S).container_responses[0].deviceIDs) == []
        _, (ids,) = kubelet.admit(GPU, [1])  # still serving
        assert len(ids) == 1


def _wait_health(kubelet: FakeKubelet, resource: str, healthy: int) -> float:
    """Seconds until ``healthy`` devices of ``resource`` are allocatable."""
    started = time.monotonic()
    assert kubelet.wait_for(lambda: kubelet.allocatable(resource) == healthy), \
        f"{resource}: allocatable {kubelet.allocatable(resource)}, wanted {healthy}"
    return time.monotonic() - started


def test_xid_down_and_back_up(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-h100", recovery_seconds=RECOVERY_OUTLASTS_S) as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
        nvml, uuid = running.nvml, nvidia_part(running.inventory).gpus[3].uuid
        since = time.monotonic()
        nvml.inject_xid(uuid, 13)  # application XID: ignored
        nvml.inject_xid(uuid, 79)
        assert _wait_health(kubelet, GPU, 7) < AT_ONCE_S  # the XID is read on the 50 ms health poll
        assert kubelet.devices(GPU)[uuid] == "Unhealthy" and kubelet.capacity(GPU) == 8
        assert _wait_health(kubelet, GPU, 8) < RECOVERY_OUTLASTS_S + AT_ONCE_S
        # Back after the recovery window, timed between the two updates as the kubelet received them
        # (the test's own wake-ups may lag on a loaded machine); 0.2 s allows for their delivery.
        updates = [(o.at, o.allocatable) for o in kubelet.seen(GPU, since) if o.event == "devices"]
        down = next(at for at, healthy in updates if healthy == 7)
        up = next(at for at, healthy in updates if healthy == 8 and at > down)
        assert up - down > RECOVERY_OUTLASTS_S - 0.2


def test_lost_gpu_down_and_back_up(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "t4-time-slicing", recovery_seconds=0.3) as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4)
        nvml, uuid = running.nvml, nvidia_part(running.inventory).gpus[0].uuid
        nvml.set_lost(uuid, True)
        assert _wait_health(kubelet, GPU, 0) < AT_ONCE_S  # every replica of the lost GPU
        stays_true(lambda: kubelet.allocatable(GPU) == 0, 1.0)  # still lost: no recovery after the 0.3 s window
        nvml.set_lost(uuid, False)
        _wait_health(kubelet, GPU, 4)


def test_amd_kfd_node_disappears_and_returns(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "mi210-x8", recovery_seconds=0.2) as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(AMD) == 8)
        back = kfd_node_goes(running.host_root, amd_part(running.inventory).gpus[2].nodes[0].kfd_node)
        assert _wait_health(kubelet, AMD, 7) < AT_ONCE_S
        back()
        _wait_health(kubelet, AMD, 8)


def test_health_checks_disabled(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-h100", health_env={"DP_DISABLE_HEALTHCHECKS": "all"}) as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
        running.nvml.inject_xid(nvidia_part(running.inventory).gpus[0].uuid, 79)
        stays_true(lambda: kubelet.allocatable(GPU) == 8, 0.5)  # ten health polls: not one looks


def test_kubelet_restart_re_registers(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-a100-mig-mixed"):
        assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/mig-1g.5gb") == 18)
        restarted = kubelet.restart()
        assert kubelet.allocatable(GPU) == 0
        assert kubelet.wait_for(lambda: all(kubelet.allocatable(r) > 0 for r in (
            GPU, "nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb")))
        assert time.monotonic() - restarted < AT_ONCE_S  # seen on the next 50 ms tick
        assert {r.resource for r in kubelet.registrations if r.at >= restarted} == {
            GPU, "nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"}
        assert (sock_dir / "nvidia-mig-1g.5gb.sock").exists()


def test_a_kubelet_restarting_again_mid_registration(sock_dir: Path, kubelet: FakeKubelet) -> None:
    # A crash-looping kubelet empties the directory while the plugin is still re-creating sockets
    # and registering; supervision must survive every interleaving and end up fully registered.
    mig_mixed = (GPU, "nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb")
    with running_plugin(sock_dir, "dgx-a100-mig-mixed"):
        assert kubelet.wait_for(lambda: all(kubelet.allocatable(r) > 0 for r in mig_mixed))
        for pause in (0.0, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.02, 0.03, 0.05) * 3:
            kubelet.restart()
            time.sleep(pause)
        restarted = kubelet.restart()
        assert kubelet.wait_for(lambda: all(kubelet.allocatable(r) > 0 for r in mig_mixed))
        assert time.monotonic() - restarted < AT_ONCE_S  # seen on the next 50 ms tick


def test_deleted_plugin_socket_is_recreated(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-h100"):
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
        before = len(kubelet.registrations)
        (sock_dir / "nvidia-gpu.sock").unlink()
        assert kubelet.wait_for(lambda: len(kubelet.registrations) > before and kubelet.allocatable(GPU) == 8)
        assert (sock_dir / "nvidia-gpu.sock").exists()
        _, (ids,) = kubelet.admit(GPU, [1])
        assert len(ids) == 1


def test_starting_before_the_kubelet(sock_dir: Path) -> None:
    with running_plugin(sock_dir, "mi300x-x8-spx") as running:
        assert wait_for(lambda: (sock_dir / "amd-gpu.sock").exists())  # serving, but no kubelet to register with
        assert not running.plugin.ready
        with FakeKubelet(sock_dir) as kubelet:  # a starting kubelet deletes the plugin socket too
            assert kubelet.wait_for(lambda: kubelet.allocatable(AMD) == 8)
            # The kubelet may open ListAndWatch before the plugin has read Register's answer.
            assert wait_for(lambda: running.plugin.ready)


def test_shutdown_removes_sockets(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "dgx-a100-mig-mixed"):
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4)
    assert sorted(p.name for p in sock_dir.iterdir()) == ["kubelet.sock"]
    assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 0)
    assert kubelet.capacity(GPU) == 4  # the kubelet's grace period keeps capacity


def test_emulator_rejects_a_bare_resource_name(sock_dir: Path, kubelet: FakeKubelet) -> None:
    channel = grpc.insecure_channel(f"unix://{kubelet.socket}")
    registration = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
    (sock_dir / "x.sock").touch()
    with pytest.raises(grpc.RpcError) as caught:
        registration.Register(pb.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name="gpu"),
                              timeout=PATIENCE_S)
    assert 'the ResourceName "gpu" is invalid' in caught.value.details()
    shutil.rmtree(sock_dir / "x.sock", ignore_errors=True)


def test_a_missing_kubelet_socket_is_logged_after_a_second_then_periodically(sock_dir: Path) -> None:
    manager = PluginManager(sock_dir / "kubelet.sock", PluginMetrics(), missing_log_seconds=0.2)
    with structlog.testing.capture_logs() as logs:
        while sum(e["event"].startswith("kubelet socket not found") for e in logs) < 3:
            manager.tick()
            time.sleep(0.01)  # a tick every 10 ms, as the supervisor does every 100 ms
        (sock_dir / "kubelet.sock").touch()
        manager.tick()
    missing = [e for e in logs if e["event"].startswith("kubelet socket not found")]
    assert all(e["socket"] == str(sock_dir / "kubelet.sock") and e["reason"] == "kubelet-missing" for e in missing)
    waited = [e["waited_s"] for e in missing]
    # After the 1 s grace, at the first tick past it: 10 ms later on a quiet machine, more on a loaded one.
    assert 1.0 <= waited[0] < 2.5 and all(later - earlier > 0.19 for earlier, later in zip(waited, waited[1:]))
    assert [e["event"] for e in logs[-2:]] == ["kubelet socket found", "kubelet socket (re)created; registering again"]
