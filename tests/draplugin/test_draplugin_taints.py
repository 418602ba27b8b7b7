"""Health as device taints, through the running plugin and the fake API server: with DRADeviceTaints
on, an unhealthy device stays in its slice tainted (NVIDIA's keys for an XID and a lost GPU, AMD's
for a lost KFD node), a device gone from the probe stays tainted NoExecute while it may still be in
use, and the taints go on recovery; with the gate off (the server drops the taints), today's
removal, said once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from labeller.host.machine import NodeOptions, open_host
from tests.builders import AT_ONCE_S, RECOVERY_OUTLASTS_S, kfd_node_goes, wait_for
from tests.draplugin.conftest import AMD, NVIDIA, Dirs, Running, dra_config, running_plugin, simulated_plugin
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import FakeDraKubelet
from tests.plugin.profile_files import l40s_node, write_yaml

XID, LOST = "gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost"


@pytest.fixture
def gated_api() -> Iterator[FakeApiServer]:
    """A fake API server with DRADeviceTaints on (off by default, as on a real v1.34 one)."""
    with FakeApiServer(feature_gates={"DRADeviceTaints"}) as server:
        yield server


def taints(run: Running, name: str, driver: str = NVIDIA) -> list[tuple[str, str, str]]:
    """(key, value, effect) of each taint of device ``name`` as published."""
    return [(t["key"], t.get("value", ""), t["effect"]) for t in run.device(name, driver).get("taints", [])]


def stamps(run: Running, name: str) -> dict[str, str]:
    return {t["key"]: t["timeAdded"] for t in run.device(name).get("taints", [])}


def generation(run: Running, driver: str = NVIDIA) -> int:
    (pool,) = {s["spec"]["pool"]["generation"] for s in run.slices(driver)}
    return int(pool)


def within(condition: Any) -> float:
    started = time.monotonic()
    wait_for(condition)
    return time.monotonic() - started


def name_of(run: Running, index: int) -> tuple[str, str]:
    """(device name, GPU UUID) of the ``index``-th NVIDIA device."""
    name = sorted(run.plugin.drivers[NVIDIA].snapshot.by_name)[index]
    return name, run.uuid(name)


def test_an_xid_taints_the_gpu_where_it_is_until_it_recovers(gated_api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                             dirs: Dirs) -> None:
    with simulated_plugin(gated_api, drakubelet, dirs, "dgx-h100", recovery_seconds=RECOVERY_OUTLASTS_S) as run:
        name, uuid = name_of(run, 3)
        before = generation(run)
        run.nvml.inject_xid(uuid, 13)  # an application's fault: ignored
        run.nvml.inject_xid(uuid, 79)
        assert within(lambda: taints(run, name) == [(XID, "79", "NoSchedule")]) < AT_ONCE_S
        assert len(run.devices()) == 8 and generation(run) == before + 1  # one write, the device still there
        assert all(not taints(run, other) for other in run.devices() if other != name)
        assert stamps(run, name)[XID].endswith("Z")  # the server's stamp
        # gone once it has answered normally for the recovery window
        assert within(lambda: not taints(run, name)) < RECOVERY_OUTLASTS_S + AT_ONCE_S
        assert generation(run) == before + 2 and "taints" not in run.device(name)


def test_a_lost_gpu_is_tainted_no_execute_beside_its_xid(gated_api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                         dirs: Dirs) -> None:
    with simulated_plugin(gated_api, drakubelet, dirs, "dgx-h100", recovery_seconds=60) as run:
        name, uuid = name_of(run, 1)
        run.nvml.inject_xid(uuid, 48)
        wait_for(lambda: taints(run, name) == [(XID, "48", "NoSchedule")])
        stamped = stamps(run, name)[XID]
        run.nvml.set_lost(uuid, True)  # stops answering NVML
        assert within(lambda: taints(run, name) == [(LOST, "", "NoExecute"), (XID, "48", "NoSchedule")]) < AT_ONCE_S
        assert stamps(run, name)[XID] == stamped  # the XID's taint is the same taint, written again
        run.nvml.set_lost(uuid, False)
        run.nvml.inject_xid(uuid, 79)  # the latest XID is the value, as NVIDIA's driver keeps it
        wait_for(lambda: (XID, "79", "NoSchedule") in taints(run, name))


def test_an_amd_device_whose_kfd_node_goes_is_tainted_until_it_is_back(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(gated_api, drakubelet, dirs, "mi210-x8", recovery_seconds=0.2) as run:
        name = run.devices(AMD)[2]
        device = run.plugin.drivers[AMD].snapshot.by_name[name].physical
        back = kfd_node_goes(run.host.host_root, device.health_key.split(":")[1])
        assert within(lambda: taints(run, name, AMD) == [("gpu.amd.com/kfd-node-lost", "", "NoExecute")]) < AT_ONCE_S
        assert len(run.devices(AMD)) == 8
        back()
        assert within(lambda: not taints(run, name, AMD)) < AT_ONCE_S


def test_a_gpu_gone_from_the_probe_stays_tainted_no_execute_while_a_claim_holds_it(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(2, config=dra_config()))
    with open_host(NodeOptions(simulate=str(profile))) as host, \
            running_plugin(gated_api, drakubelet, dirs, host, gone_hold_seconds=0) as run:
        held = run.claim("held", "gpu-1")
        assert not drakubelet.call_prepare(NVIDIA, [held])[held.uid].error
        attributes = run.device("gpu-1")["attributes"]
        write_yaml(profile, l40s_node(1, config=dra_config()))  # the GPU is gone from the node
        assert within(lambda: taints(run, "gpu-1") == [(LOST, "", "NoExecute")]) < AT_ONCE_S
        assert run.device("gpu-1")["attributes"] == attributes and not taints(run, "gpu-0")
        later = run.claim("later", "gpu-1")
        assert "device gpu-1 is not on this node" in drakubelet.call_prepare(NVIDIA, [later])[later.uid].error
        run.sighup()  # probed again: still held
        assert taints(run, "gpu-1") == [(LOST, "", "NoExecute")]
        assert not drakubelet.call_unprepare(NVIDIA, [held])[held.uid].error
        run.sighup()  # nothing holds it and its hold time is over: gone
        assert within(lambda: run.devices() == ["gpu-0"]) < AT_ONCE_S


def test_a_gpu_gone_from_the_probe_stays_its_hold_time_and_comes_back_untainted(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(2, config=dra_config()))
    with open_host(NodeOptions(simulate=str(profile))) as host, \
            running_plugin(gated_api, drakubelet, dirs, host) as run:
        write_yaml(profile, l40s_node(1, config=dra_config()))
        wait_for(lambda: taints(run, "gpu-1") == [(LOST, "", "NoExecute")])
        run.sighup()
        assert taints(run, "gpu-1") == [(LOST, "", "NoExecute")]  # no claim holds it, but 300 s have not passed
        write_yaml(profile, l40s_node(2, config=dra_config()))  # back
        assert within(lambda: run.devices() == ["gpu-0", "gpu-1"] and not taints(run, "gpu-1")) < AT_ONCE_S


def test_without_the_gate_an_unhealthy_gpu_leaves_the_slice_and_the_log_says_why_once(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", recovery_seconds=60) as run, \
            structlog.testing.capture_logs() as logs:
        first, first_uuid = name_of(run, 2)
        second, second_uuid = name_of(run, 5)
        run.nvml.inject_xid(first_uuid, 79)
        assert within(lambda: first not in run.devices()) < AT_ONCE_S
        run.nvml.set_lost(second_uuid, True)
        assert within(lambda: second not in run.devices()) < AT_ONCE_S
        assert len(run.devices()) == 6
        assert not [d for s in run.slices() for d in s["spec"]["devices"] if "taints" in d]
        said = [e for e in logs if e.get("reason") == "feature-gate-off"]  # the one gate-off mechanism's line
        assert len(said) == 1 and said[0]["gate"] == "DRADeviceTaints" and said[0]["log_level"] == "warning"
        assert said[0]["fields"] == ["devices[].taints"] and "unhealthy device left out" in said[0]["instead"]
        assert run.plugin.gates.off == ("DRADeviceTaints",) and run.plugin.metrics.registry.get_sample_value(
            "gpu_labeller_dra_feature_gate_off", {"gate": "DRADeviceTaints"}) == 1


def test_a_taints_stamp_is_no_difference_and_is_kept_when_its_slice_is_written_again(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(gated_api, drakubelet, dirs, "dgx-h100", recovery_seconds=60) as run:
        first, first_uuid = name_of(run, 3)
        second, second_uuid = name_of(run, 6)
        run.nvml.inject_xid(first_uuid, 79)
        wait_for(lambda: taints(run, first))
        (slice_,) = run.slices()
        old = "2020-01-01T00:00:00Z"

        def restamp(obj: dict[str, Any]) -> None:  # someone else sets the stamp: nothing to repair
            for device in obj["spec"]["devices"]:
                for taint in device.get("taints", []):
                    taint["timeAdded"] = old
        since = time.monotonic()
        gated_api.resource_slices.change("", slice_["metadata"]["name"], restamp)
        wait_for(lambda: old in str(run.plugin.publisher.live()) and run.plugin.publisher.in_sync)
        assert run.writes(since) == 0
        run.nvml.inject_xid(second_uuid, 48)  # another device's fault: the slice is written again
        wait_for(lambda: taints(run, second))
        assert run.writes(since) == 1 and stamps(run, first) == {XID: old}


def test_nothing_is_written_while_tainted_devices_stay_as_they_are(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path) -> None:
    """Budget: 0 slice writes while idle, with a tainted device and one gone from the probe."""
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(3, config=dra_config()))
    with open_host(NodeOptions(simulate=str(profile))) as host, \
            running_plugin(gated_api, drakubelet, dirs, host, recovery_seconds=60, probe_interval=0.05) as run:
        run.nvml.inject_xid(run.uuid("gpu-0"), 79)
        write_yaml(profile, l40s_node(2, config=dra_config()))
        wait_for(lambda: taints(run, "gpu-0") and taints(run, "gpu-2") and run.plugin.publisher.in_sync)
        since, probes = time.monotonic(), run.plugin.probes
        wait_for(lambda: run.plugin.probes >= probes + 20)
        assert run.writes(since) == 0


def test_a_lost_gpu_the_probe_then_leaves_out_is_published_the_same(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path) -> None:
    """A GPU that stops answering NVML is tainted by the health check, then missing from the next probe (NVML
    skips it): it is gone from the probe, tainted the same, where it was: nothing more is written."""
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(3, config=dra_config()))
    with open_host(NodeOptions(simulate=str(profile))) as host, \
            running_plugin(gated_api, drakubelet, dirs, host, recovery_seconds=60) as run:
        since = time.monotonic()
        run.nvml.set_lost(run.uuid("gpu-0"), True)
        wait_for(lambda: taints(run, "gpu-0") == [(LOST, "", "NoExecute")] and run.plugin.publisher.in_sync)
        run.sighup()  # probed: NVML leaves the lost GPU out
        run.sighup()  # once more: the probe before it has published what it found
        assert [d.name for _, d in run.plugin.gone.devices().get(NVIDIA, [])] == ["gpu-0"]
        wait_for(lambda: run.plugin.publisher.in_sync)
        assert run.writes(since) == 1  # the taint; the GPU gone from the probe changed nothing more
        assert run.devices() == ["gpu-0", "gpu-1", "gpu-2"] and taints(run, "gpu-0") == [(LOST, "", "NoExecute")]
