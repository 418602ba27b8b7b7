"""AMD compute partitions made at prepare (``labeller.dra.dynamicMig``), through the running plugin
against the fake API server with DRAPartitionableDevices on: a counter set per GPU that can switch
its compute partition mode and a device per partition of every mode; prepare switches the mode
through sysfs when no claim holds the GPU (the simulated driver lays the KFD topology out again),
and a claim for another mode than the one held is refused until the holders are gone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tests.draplugin.conftest import AMD, Dirs, Running
from tests.draplugin.test_draplugin_dynamic_mig import GATE, dynamic_plugin
from tests.draplugin.test_draplugin_prepare import spec_file
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet
from tests.plugin.test_plugin_cdi import check_spec
from vendors.amd.facts import PCI_AMDGPU_DRIVER
from vendors.amd.model import AmdInventory

PROFILE = "mi300x-x8-spx"  # 8 x MI300X in SPX/NPS1: SPX, DPX, QPX and CPX available
GPU0, PREFIX = "0000:05:00.0", "gpu-0000-05-00-0"
CONFIG = {"version": "v1", "labeller": {"dra": {"vendors": ["amd"], "dynamicMig": True}}}


@pytest.fixture
def gated_api() -> Iterator[FakeApiServer]:
    with FakeApiServer(feature_gates={GATE}) as server:
        yield server


def mode(run: Running, bdf: str = GPU0) -> str:
    return (run.host.host_root / PCI_AMDGPU_DRIVER / bdf / "current_compute_partition").read_text().strip()


def kfd_nodes(run: Running, bdf: str = GPU0) -> int:
    part = run.host.probe().part(AmdInventory)
    assert part is not None
    return len(next(g for g in part.gpus if g.bdf == bdf).nodes)


def claim(run: Running, name: str, *devices: str) -> Claim:
    return run.claim(name, *devices, driver=AMD, requests=[f"r{i}" for i in range(len(devices))])


def test_a_switchable_gpu_publishes_every_partition_of_every_mode_drawing_on_its_xccs(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with dynamic_plugin(gated_api, drakubelet, dirs, PROFILE, CONFIG) as run:
        slices = [s["spec"] for s in run.slices(AMD)]
        assert len(slices) == 8 and all(len(s["sharedCounters"]) == 1 for s in slices)
        spec = next(s for s in slices if s["sharedCounters"][0]["name"] == f"{PREFIX}-counter-set")
        counters = spec["sharedCounters"][0]["counters"]
        assert sorted(counters) == ["compute-units", "memory", *(f"xcc-{i}" for i in range(8))]
        assert counters["compute-units"] == {"value": "304"}
        assert [d["name"] for d in spec["devices"]] == [
            f"{PREFIX}-spx-0", *(f"{PREFIX}-dpx-{i}" for i in range(2)), *(f"{PREFIX}-qpx-{i}" for i in range(4)),
            *(f"{PREFIX}-cpx-{i}" for i in range(8))]
        dpx = run.device(f"{PREFIX}-dpx-1", AMD)
        assert dpx["attributes"]["partitionProfile"] == {"string": "dpx_nps1"}
        assert dpx["attributes"]["type"] == {"string": "amdgpu-partition"}
        assert dpx["consumesCounters"][0]["counters"] == {
            "compute-units": {"value": "152"}, "memory": {"value": "98296Mi"},
            **{f"xcc-{i}": {"value": "1"} for i in range(4, 8)}}


def test_prepare_switches_a_gpu_no_claim_holds_and_holds_it_in_that_mode(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with dynamic_plugin(gated_api, drakubelet, dirs, PROFILE, CONFIG) as run:
        before = run.slices(AMD)
        first = claim(run, "cpx-three", f"{PREFIX}-cpx-3")
        assert drakubelet.prepare("pod-1", [first])[first.uid].error == ""
        assert mode(run) == "CPX" and kfd_nodes(run) == 8
        part = run.host.probe().part(AmdInventory)
        assert part is not None
        third = sorted(next(g for g in part.gpus if g.bdf == GPU0).nodes, key=lambda n: n.location_id)[3]
        (device,) = check_spec(spec_file(dirs, first))["devices"]
        assert f"/dev/dri/renderD{third.render_minor}" in [n["path"] for n in device["containerEdits"]["deviceNodes"]]
        # another mode on the held GPU: refused, the mode kept; the same mode: prepared, no switch
        rival = claim(run, "dpx-one", f"{PREFIX}-dpx-1")
        refused = drakubelet.prepare("pod-2", [rival])[rival.uid].error
        assert "held in another mode (cpx)" in refused and first.uid in refused
        assert mode(run) == "CPX"
        second = claim(run, "cpx-five", f"{PREFIX}-cpx-5")
        assert drakubelet.prepare("pod-3", [second])[second.uid].error == ""
        run.sighup()
        assert run.slices(AMD) == before  # names and counters do not move with the mode
        for pod, held in (("pod-1", first), ("pod-3", second)):
            assert drakubelet.unprepare(pod, [held])[held.uid].error == ""
        assert drakubelet.prepare("pod-2", [rival])[rival.uid].error == ""  # the kubelet's retry, once free
        assert mode(run) == "DPX" and kfd_nodes(run) == 2


def test_a_gpu_whose_files_offer_no_switch_is_published_as_it_is(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with structlog.testing.capture_logs() as logs, \
            dynamic_plugin(gated_api, drakubelet, dirs, "mi300x-x8-cpx", CONFIG) as run:
        devices = run.devices(AMD)
        assert len(devices) == 63 and all(d.startswith("gpu-") and "-cpx-" not in d for d in devices)
        assert not any(s["spec"].get("sharedCounters") for s in run.slices(AMD))
    assert any(e.get("reason") == "dynamic-partitions-unavailable" for e in logs)


def test_the_simulated_driver_refuses_a_mode_its_memory_mode_does_not_allow(tmp_path: Path) -> None:
    from labeller.host.machine import NodeOptions, open_host
    from tests.plugin.profile_files import write_yaml

    profile = tmp_path / "nps4.yaml"
    write_yaml(profile, {"name": "nps4", "amd": {"gpus": [{
        "device_id": 0x74A1, "gfx_target_version": 90402, "simd_count": 1216, "vram_bytes": 206141652992,
        "compute_partition": "cpx", "partitions": 8, "memory_partition": "nps4"}]}})
    with open_host(NodeOptions(simulate=str(profile))) as host:
        with pytest.raises(OSError, match="cannot switch to compute partition 'dpx'"):
            host.handles["amd"].write_compute_partition(host.host_root, GPU0, "dpx")
        assert (host.host_root / PCI_AMDGPU_DRIVER / GPU0 / "available_compute_partition").read_text() == "CPX\n"
