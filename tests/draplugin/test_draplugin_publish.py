"""Publishing: one pool per driver named after the node, stale slices of its drivers for its node
replaced at start, nothing else touched, nothing written while nothing changes, and a change of
health, hardware or config in the slices within a second."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, MutableMapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import structlog

from labeller.cluster.kube import Kube
from labeller.apps.draplugin.metrics import DraMetrics
from labeller.apps.draplugin.publisher import SlicePublisher, WantedSlices
from labeller.apps.draplugin.slicecontent import content, quantity
from labeller.host.machine import NodeOptions, open_host
from labeller.model.offer import PhysicalDevice
from labeller.model.resourceslices import DraDevice
from tests.builders import AT_ONCE_S, RECOVERY_OUTLASTS_S, kfd_node_goes, nvidia_part, wait_for
from tests.draplugin.conftest import AMD, NODE, NVIDIA, Dirs, Running, dra_config, running_plugin, simulated_plugin
from tests.fakes.apiserver import Fault, FakeApiServer
from tests.fakes.drakubelet import FakeDraKubelet
from tests.plugin.profile_files import l40s_node, write_yaml


INT64_MAX = 2**63 - 1  # the API keeps a pool's generation in an int64


def generation(run: Running, driver: str = NVIDIA) -> int:
    (pool,) = {s["spec"]["pool"]["generation"] for s in run.slices(driver)}
    return int(pool)


def published_within(run: Running, condition: Callable[[], object]) -> float:
    """How long until ``condition()`` held of the published slices; tests hold it to ``AT_ONCE_S`` (a
    second on a quiet machine: the plugin reacts to the change, it does not wait for a later probe)."""
    started = time.monotonic()
    wait_for(condition)
    return time.monotonic() - started


def test_one_pool_per_driver_named_after_the_node(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "mixed-l40s-mi210") as run:
        for driver in (NVIDIA, AMD):
            (slice_,) = run.slices(driver)
            spec = slice_["spec"]
            assert spec["nodeName"] == NODE and spec["driver"] == driver
            assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
            assert spec["devices"]
        assert len(api.slices()) == 2


def test_stale_slices_are_replaced_and_nothing_else_is_touched(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                               dirs: Dirs) -> None:
    api.create_node(NODE)
    api.create_slice("left-over", NODE, NVIDIA, [{"name": "gpu-9"}], generation=7)
    others = [api.create_slice("other-driver", NODE, "net.example.com", [{"name": "nic-0"}]),
              api.create_slice("other-node", "gpu-node-2", NVIDIA, [{"name": "gpu-0"}], pool="gpu-node-2")]
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        assert [s["metadata"]["name"] for s in run.slices(NVIDIA)] != ["left-over"]
        assert len(run.devices()) == 8 and "gpu-9" not in run.devices()
        assert generation(run) == 8  # past every generation the pool had
        assert [api.resource_slices.get("", o["metadata"]["name"]) for o in others] == others


def test_nothing_is_written_while_nothing_changes(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-a100-mig-mixed") as run:
        assert run.writes_while_idle() == 0


def test_a_restart_on_unchanged_hardware_writes_nothing(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                        dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "mi300x-x8-cpx") as first:
        before = first.slices(AMD)
    since = time.monotonic()
    with simulated_plugin(api, drakubelet, dirs, "mi300x-x8-cpx") as second:
        assert second.writes(since) == 0 and second.slices(AMD) == before


def test_a_slice_deleted_by_someone_else_is_written_again(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                          dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        (slice_,) = run.slices(NVIDIA)
        api.delete_slice(slice_["metadata"]["name"])  # a kubelet that starts deletes its node's slices
        assert published_within(run, lambda: len(run.devices()) == 8) < AT_ONCE_S
        assert generation(run) == 2


def test_a_slice_deleted_before_the_answer_to_its_write_comes_is_written_again(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch can tell of a deletion before the plugin reads the answer to its write of the slice:
    that older answer must not bring the slice back into the plugin's view."""
    update = Kube.update_resource_slice

    def deleted_at_once(kube: Kube, name: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = update(kube, name, body)
        if api.slices(NODE):
            api.delete_slice(name)
            wait_for(lambda: name not in {s["metadata"]["name"] for s in run.plugin.publisher.live()})
        return answer

    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        before = run.slices(NVIDIA)
        monkeypatch.setattr(Kube, "update_resource_slice", deleted_at_once)
        edit(api, before[0]["metadata"]["name"], 1)
        wait_for(lambda: ours_again(run, before, 3) and run.plugin.ready)


def test_an_unhealthy_gpu_leaves_the_slice_and_comes_back(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                          dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", recovery_seconds=RECOVERY_OUTLASTS_S) as run:
        uuid = nvidia_part(run.host.probe()).gpus[3].uuid
        name = next(n for n, d in run.plugin.drivers[NVIDIA].snapshot.by_name.items() if d.health_key == uuid)
        run.nvml.inject_xid(uuid, 13)  # an application's fault: ignored
        run.nvml.inject_xid(uuid, 79)
        assert published_within(run, lambda: name not in run.devices()) < AT_ONCE_S
        # Without DRADeviceTaints (a v1.34 server's default) the first fault costs one write more: the device
        # tainted, the taints dropped by the server, then the device left out (test_draplugin_taints.py).
        assert len(run.devices()) == 7 and generation(run) == 3
        # back once it has answered normally for the recovery window
        assert published_within(run, lambda: name in run.devices()) < RECOVERY_OUTLASTS_S + AT_ONCE_S
        assert generation(run) == 4


def test_an_amd_gpu_whose_kfd_node_goes_leaves_the_slice(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                         dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "mi210-x8", recovery_seconds=0.2) as run:
        name = run.devices(AMD)[2]
        device = run.plugin.drivers[AMD].snapshot.by_name[name].physical
        back = kfd_node_goes(run.host.host_root, device.health_key.split(":")[1])
        assert published_within(run, lambda: name not in run.devices(AMD)) < AT_ONCE_S
        back()
        published_within(run, lambda: name in run.devices(AMD))


def test_a_changed_inventory_is_published_within_a_second(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                          dirs: Dirs, tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(2, config=dra_config()))
    with open_host(NodeOptions(simulate=str(profile))) as host, running_plugin(api, drakubelet, dirs, host) as run:
        assert len(run.devices()) == 2
        write_yaml(profile, l40s_node(3, config=dra_config()))  # a GPU appears (no SIGHUP: the profile file is watched)
        assert published_within(run, lambda: len(run.devices()) == 3) < AT_ONCE_S
        assert generation(run) == 2
        write_yaml(profile, l40s_node(3, amd_gpus=2, config=dra_config()))  # a second vendor: its driver registers
        assert published_within(run, lambda: len(run.devices(AMD)) == 2) < AT_ONCE_S
        assert drakubelet.wait_for(lambda: drakubelet.seen("registered", AMD))


def test_a_vendor_moved_back_to_the_device_plugin_deregisters_and_its_slices_go(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write_yaml(config, dra_config("nvidia", "amd"))
    with simulated_plugin(api, drakubelet, dirs, "mixed-l40s-mi210", config_path=config) as run:
        assert run.slices(AMD) and run.slices(NVIDIA)
        since = time.monotonic()
        write_yaml(config, dra_config("nvidia"))
        run.loop.request_reload()  # SIGHUP
        assert published_within(run, lambda: run.slices(AMD) == []) < AT_ONCE_S
        assert drakubelet.wait_for(lambda: drakubelet.seen("deregistered", AMD, since=since))
        assert not (dirs.registry / f"{AMD}-reg.sock").exists() and len(run.devices()) == 2
        write_yaml(config, dra_config("nvidia", "amd"))  # and back to DRA
        run.loop.request_reload()
        assert published_within(run, lambda: len(run.devices(AMD)) == 2) < AT_ONCE_S
        assert drakubelet.wait_for(lambda: drakubelet.seen("registered", AMD, since=since))


def test_a_gpu_that_goes_leaves_the_slice(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs,
                                          tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(2, amd_gpus=2, config=dra_config()))
    with open_host(NodeOptions(simulate=str(profile))) as host, running_plugin(api, drakubelet, dirs, host) as run:
        since = time.monotonic()
        write_yaml(profile, l40s_node(1, config=dra_config()))
        assert published_within(run, lambda: run.slices(AMD) == [] and len(run.devices()) == 1) < AT_ONCE_S
        assert drakubelet.wait_for(lambda: drakubelet.seen("deregistered", AMD, since=since))


def test_slices_are_written_again_once_the_api_answers(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                      dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", recovery_seconds=60) as run:
        outage = api.faults.add(Fault(resource="resourceslices", status=503))
        uuid = nvidia_part(run.host.probe()).gpus[0].uuid
        run.nvml.inject_xid(uuid, 79)
        # the GPU is unhealthy and the slices cannot say so: the plugin is not ready (whether its refused
        # request was the update itself or the list and watch that precede it)
        wait_for(lambda: run.plugin.board.unhealthy_keys() and not run.plugin.ready)
        assert len(run.devices()) == 8
        api.faults.active.remove(outage)
        answered = time.monotonic()
        wait_for(lambda: len(run.devices()) == 7)
        assert time.monotonic() - answered < AT_ONCE_S  # about a second on a quiet machine


def edit(api: FakeApiServer, name: str, pool_generation: int) -> None:
    """What someone with write access to ResourceSlices does (``kubectl edit``): the pool's generation
    set, and an attribute of the first device changed."""
    body = api.resource_slices.get("", name)
    body["spec"]["pool"]["generation"] = pool_generation
    body["spec"]["devices"][0]["attributes"]["productName"] = {"string": "edited"}
    api.resource_slices.replace("", name, body)


def ours_again(run: Running, before: list[Any], pool_generation: int) -> bool:
    """The node's slices of NVIDIA's driver say what the plugin published (``before``), at this generation."""
    slices = run.slices(NVIDIA)
    return ([s["spec"]["devices"] for s in slices] == [s["spec"]["devices"] for s in before]
            and {s["spec"]["pool"]["generation"] for s in slices} == {pool_generation})


def repairs(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    """The plugin's warnings that it starts a pool again."""
    return [entry for entry in logs if entry.get("reason") in ("generation-exhausted", "write-refused")]


def test_a_pool_generation_of_int64_max_is_published_again_from_1(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                   dirs: Dirs) -> None:
    """No generation can follow 2^63-1 (the server cannot decode 2^63): the plugin deletes its pool's
    slices and publishes from generation 1, and says why once, however often its deletes must be retried."""
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run, structlog.testing.capture_logs() as logs:
        before = run.slices(NVIDIA)
        api.faults.add(Fault(verb="delete", resource="resourceslices", status=503, times=2))
        since = time.monotonic()
        edit(api, before[0]["metadata"]["name"], INT64_MAX)
        wait_for(lambda: ours_again(run, before, 1) and run.plugin.ready)
        assert api.log.count("delete", "resourceslices", since) == 3  # two refused with 503, then done
        (repair,) = repairs(logs)
        assert (repair["reason"], repair["driver"], repair["generation"]) == ("generation-exhausted", NVIDIA,
                                                                              INT64_MAX)


def test_a_slice_deleted_while_the_plugin_remembers_int64_max_is_written_again(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """Generations compare only within the live pool: with none of its slices left, the generation
    the plugin wrote last does not count when it cannot be bumped."""
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        before = run.slices(NVIDIA)
        name = before[0]["metadata"]["name"]
        edit(api, name, INT64_MAX - 1)
        wait_for(lambda: ours_again(run, before, INT64_MAX))  # the plugin bumped it to the last generation there is
        api.delete_slice(name)
        wait_for(lambda: ours_again(run, before, 1) and run.plugin.ready)


def test_an_update_the_server_keeps_refusing_starts_the_pool_again(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                    dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run, structlog.testing.capture_logs() as logs:
        before = run.slices(NVIDIA)
        api.faults.add(Fault(verb="update", resource="resourceslices", status=422))
        edit(api, before[0]["metadata"]["name"], 5)
        wait_for(lambda: ours_again(run, before, 1) and run.plugin.ready)
        assert [entry["reason"] for entry in repairs(logs)] == ["write-refused"]


def test_a_pool_the_server_refuses_even_afresh_is_deleted_once_and_retried(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """When the new slices are refused too, what the plugin writes is wrong, not the old pool: it is
    retried after a backoff, and neither deleted nor logged again."""
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run, structlog.testing.capture_logs() as logs:
        before = run.slices(NVIDIA)
        refusals = [api.faults.add(Fault(verb=verb, resource="resourceslices", status=422))
                    for verb in ("update", "create")]
        since = time.monotonic()
        edit(api, before[0]["metadata"]["name"], 5)
        wait_for(lambda: api.log.count("create", "resourceslices", since) >= 3)
        assert api.log.count("delete", "resourceslices", since) == 1 and run.slices(NVIDIA) == []
        assert not run.plugin.ready and len(repairs(logs)) == 1
        for fault in refusals:
            api.faults.active.remove(fault)
        wait_for(lambda: ours_again(run, before, 1) and run.plugin.ready)
        assert api.log.count("delete", "resourceslices", since) == 1


def test_a_transient_error_starts_nothing_again(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """A server that fails for a while (5xx) is retried after a backoff: nothing is deleted."""
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run, structlog.testing.capture_logs() as logs:
        before = run.slices(NVIDIA)
        outage = api.faults.add(Fault(verb="update", resource="resourceslices", status=503))
        since = time.monotonic()
        edit(api, before[0]["metadata"]["name"], 5)
        wait_for(lambda: api.log.count("update", "resourceslices", since) >= 3)  # refused, retried, refused again
        assert not run.plugin.ready and len(run.slices(NVIDIA)) == 1
        api.faults.active.remove(outage)
        wait_for(lambda: ours_again(run, before, 6) and run.plugin.ready)  # bumped past 5, not started again
        assert api.log.count("delete", "resourceslices", since) == 0 and repairs(logs) == []


@pytest.mark.parametrize("profile", ["dgx-h100", "mi300x-x8-cpx"])
def test_ready_means_registered_and_written(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs,
                                            profile: str) -> None:
    with simulated_plugin(api, drakubelet, dirs, profile, ready=False) as run:
        wait_for(lambda: run.plugin.ready)
        assert run.plugin.publisher.in_sync and all(d.sockets.registered for d in run.plugin.drivers.values())
        assert run.slices()


def test_a_driver_published_again_while_its_emptied_pool_is_forgotten_stays_published() -> None:
    """The worker forgets a driver whose pool it found gone and unwanted, as of what it read; a publish
    that wants the driver again meanwhile keeps it, so that its slices are written."""
    wanted = WantedSlices()
    wanted.replace({NVIDIA: [{"spec": {"driver": NVIDIA}}]})
    wanted.replace({})  # served no more
    _, read, drivers = wanted.seen()  # what the worker reconciles: the pool to empty
    assert NVIDIA in drivers and NVIDIA not in read
    wanted.replace({NVIDIA: [{"spec": {"driver": NVIDIA}}]})  # served again before the worker is done
    wanted.emptied(NVIDIA)  # the worker found the pool gone
    assert NVIDIA in wanted.seen()[2]
    wanted.replace({})
    wanted.emptied(NVIDIA)
    assert wanted.seen()[2] == set()


def test_a_pool_over_128_devices_is_split_and_shrinks(api: FakeApiServer, tmp_path: Path) -> None:
    kube = Kube(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    stop = threading.Event()
    publisher = SlicePublisher(kube, NODE, DraMetrics(), stop)
    devices = [DraDevice(f"gpu-{i}", PhysicalDevice(vendor="nvidia", health_key=f"GPU-{i}", visible_id=str(i),
                                                    gpu=f"0000:{i:04x}:00.0")) for i in range(200)]
    try:
        publisher.start()
        publisher.publish({NVIDIA: devices})
        wait_for(lambda: publisher.in_sync and len(api.slices(NODE)) == 2)
        pools = [s["spec"]["pool"] for s in api.slices(NODE)]
        assert pools == [{"name": NODE, "generation": 1, "resourceSliceCount": 2}] * 2
        assert [len(s["spec"]["devices"]) for s in api.slices(NODE)] == [128, 72]
        since = time.monotonic()
        publisher.publish({NVIDIA: devices[:100]})
        wait_for(lambda: publisher.in_sync and len(api.slices(NODE)) == 1)
        (slice_,) = api.slices(NODE)
        assert slice_["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}
        assert api.log.count("update", "resourceslices", since) == 1
        assert api.log.count("delete", "resourceslices", since) == 1
        publisher.publish({})  # the driver is served no more: its slices go
        wait_for(lambda: publisher.in_sync and api.slices(NODE) == [])
    finally:
        stop.set()
        publisher.join()
        kube.close()


@pytest.mark.parametrize(("text", "value"), [("80Gi", 80 * 2**30), ("85899345920", 80 * 2**30), ("1k", 1000),
                                             ("1.5Mi", 1572864), ("500m", Fraction(1, 2)), ("2e3", 2000)])
def test_quantities_compare_by_value(text: str, value: int | Fraction) -> None:
    assert quantity(text) == value


def test_what_the_api_leaves_out_is_no_difference() -> None:
    pool = {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    written: dict[str, Any] = {"driver": NVIDIA, "pool": pool,
                               "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "85899345920"}}}]}
    kept = {**written, "pool": {**pool, "generation": 4}, "allNodes": False, "perDeviceNodeSelection": None,
            "devices": [{"name": "gpu-0", "attributes": {}, "capacity": {"memory": {"value": "80Gi"}}}]}
    assert content(written) == content(kept)
    assert content(written) != content({**kept, "devices": [{"name": "gpu-1"}]})


def test_a_config_that_serves_a_vendor_absent_here_is_not_ready(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                 dirs: Dirs, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write_yaml(config, dra_config("amd"))
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", config_path=config, ready=False) as run:
        wait_for(lambda: run.plugin.probes >= 2)  # probed again: the GPUs may yet come
        assert not run.plugin.ready and run.slices() == [] and drakubelet.seen("registered") == []


def test_ready_only_once_the_slices_are_on_the_api_however_slow_the_first_publish(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    """/readyz must not say ready while the node's devices are not published yet (the window between
    a driver's registration and its first slices; a loaded machine widens it)."""
    publish = SlicePublisher.publish
    entered = threading.Event()

    def slow_publish(self: SlicePublisher, devices: Any) -> None:
        entered.set()
        time.sleep(0.5)  # stands for a slow step, not for a condition: the publish itself is delayed
        publish(self, devices)

    monkeypatch.setattr(SlicePublisher, "publish", slow_publish)
    config_path = dirs.plugins.parent / "dra-config.yaml"
    write_yaml(config_path, dra_config())
    seen_ready_without_slices: list[int] = []
    with open_host(NodeOptions(simulate="dgx-h100", config_path=config_path)) as host, \
            running_plugin(api, drakubelet, dirs, host, config_path=config_path, ready=False) as run:
        wait_for(entered.is_set)
        while not run.slices(NVIDIA):
            if run.plugin.ready and not run.slices(NVIDIA):
                seen_ready_without_slices.append(len(run.plugin.drivers))
            time.sleep(0.005)
        wait_for(lambda: run.plugin.ready)
    assert seen_ready_without_slices == []
