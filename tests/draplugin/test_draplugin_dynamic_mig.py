"""MIG devices made at prepare (``labeller.dra.dynamicMig``), through the running plugin against the
fake API server with 1.34's DRAPartitionableDevices on (its validation of counters) and off (counters
dropped on write): counter sets per MIG-enabled GPU, one device per profile and placement, the MIG
device made through the simulated NVML at prepare and destroyed at unprepare, someone else's MIG
devices left alone, and what a killed plugin made undone at the next start, nothing else."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import structlog
import yaml

from labeller.apps.draplugin.ledger import Ledger
from labeller.host.machine import NodeOptions, open_host
from tests.builders import wait_for
from tests.draplugin.conftest import NVIDIA, Dirs, Running, running_plugin
from tests.draplugin.test_draplugin_prepare import spec_file
from tests.fakes.apiserver import Fault, FakeApiServer, invalid
from tests.fakes.drakubelet import FakeDraKubelet
from tests.plugin.profile_files import write_yaml
from tests.plugin.test_plugin_cdi import check_spec
from vendors.nvidia.migmaker import MigMaker

GATE = "DRAPartitionableDevices"
PROFILE = "dgx-a100-mig-dynamic"  # GPUs 0-1 whole, 2-3 an admin's 3g+2g+1g+1g, 4-7 MIG enabled and empty
DYNAMIC = {"version": "v1", "labeller": {"dra": {"vendors": ["nvidia"], "dynamicMig": True}}}
Obj = dict[str, Any]


@pytest.fixture
def gated_api() -> Iterator[FakeApiServer]:
    with FakeApiServer(feature_gates={GATE}) as server:
        yield server


def dynamic_plugin(api: FakeApiServer, kubelet: FakeDraKubelet, dirs: Dirs, profile: str = PROFILE,
                   config: Obj | None = None, **options: Any) -> Any:
    path = dirs.plugins.parent / "dra-config.yaml"
    write_yaml(path, config or DYNAMIC)
    return _plugin(api, kubelet, dirs, profile, path, **options)


class _plugin:
    """The plugin on a simulated node, its host kept open after the plugin stops (``restart``: a new
    plugin process on the same node, whose NVML keeps the MIG devices made, as a driver does)."""

    def __init__(self, api: FakeApiServer, kubelet: FakeDraKubelet, dirs: Dirs, profile: str, path: Path,
                 **options: Any) -> None:
        self.args = (api, kubelet, dirs)
        self.path, self.options = path, options
        self.host_cm = open_host(NodeOptions(simulate=profile, config_path=path))
        self.host = self.host_cm.__enter__()
        self.plugin_cm: Any = None

    def start(self) -> Running:
        self.plugin_cm = running_plugin(*self.args, self.host, config_path=self.path, **self.options)
        run: Running = self.plugin_cm.__enter__()
        return run

    def stop(self) -> None:
        self.plugin_cm.__exit__(None, None, None)

    def __enter__(self) -> Running:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.host_cm.__exit__(None, None, None)


def counter_slices(run: Running) -> dict[str, Obj]:
    """The slices that carry a counter set, by the set's name."""
    return {s["spec"]["sharedCounters"][0]["name"]: s for s in run.slices(NVIDIA) if s["spec"].get("sharedCounters")}


def mig_layout(nvml: ModuleType, gpu: int) -> list[tuple[str, int]]:
    """The GPU's MIG devices as the simulated driver holds them: (profile, first memory slice)."""
    state = nvml.state.gpus[gpu]
    return sorted((mig.profile, mig.placement_start) for mig in state.migs)


def write_mig_minors(host_root: Path, gpus: int = 8) -> dict[str, int]:
    """The driver's ``/proc/driver/nvidia-caps/mig-minors``, as a real one lays it out (every GPU, GPU
    instance and compute instance a GPU may have, whether made or not: the file does not change), in the
    simulated host root; its minors by name."""
    minors = {"config": 1, "monitor": 2}
    for gpu in range(gpus):
        for gi in range(15):
            minors[f"gpu{gpu}/gi{gi}/access"] = len(minors) + 1
            for ci in range(8):
                minors[f"gpu{gpu}/gi{gi}/ci{ci}/access"] = len(minors) + 1
    path = host_root / "proc/driver/nvidia-caps/mig-minors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{name} {minor}\n" for name, minor in minors.items()))
    return minors


def prepared(kubelet: FakeDraKubelet, run: Running, name: str, *devices: str) -> Any:
    claim = run.claim(name, *devices, requests=[f"r{i}" for i in range(len(devices))])
    return claim, kubelet.prepare(f"pod-{name}", [claim])[claim.uid]


def test_each_mig_gpu_publishes_a_counter_set_and_a_device_per_placement(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with dynamic_plugin(gated_api, drakubelet, dirs) as run:
        sets = counter_slices(run)
        assert sorted(sets) == [f"gpu-{n}-counter-set" for n in range(4, 8)]  # GPUs 2-3 are full: nothing to make
        spec = sets["gpu-4-counter-set"]["spec"]
        (counter_set,) = spec["sharedCounters"]
        assert counter_set["counters"] == {
            **{f"memory-slice-{i}": {"value": "1"} for i in range(8)}, "compute-slices": {"value": "7"},
            "memory": {"value": "40192Mi"}, "multiprocessors": {"value": "98"}, "copy-engines": {"value": "7"},
            "decoders": {"value": "5"}, "encoders": {"value": "0"}, "jpeg-engines": {"value": "1"},
            "ofa-engines": {"value": "1"}}
        names = [d["name"] for d in spec["devices"]]
        # every A100 40GB profile at every placement NVML lists: 7 + 7 + 4 + 3 + 2 + 1 + 1
        assert len(names) == 25 and "gpu-4-mig-3g20gb-9-4" in names and "gpu-4-mig-1g5gb-me-20-6" in names
        device = run.device("gpu-4-mig-3g20gb-9-4")
        assert device["attributes"]["profile"] == {"string": "3g.20gb"}
        assert device["attributes"]["parentUUID"] == {"string": run.uuid("gpu-4-mig-3g20gb-9-4")}
        assert device["consumesCounters"] == [{"counterSet": "gpu-4-counter-set", "counters": {
            **{f"memory-slice-{i}": {"value": "1"} for i in range(4, 8)}, "compute-slices": {"value": "3"},
            "memory": {"value": "19968Mi"}, "multiprocessors": {"value": "42"}, "copy-engines": {"value": "3"},
            "decoders": {"value": "2"}, "encoders": {"value": "0"}, "jpeg-engines": {"value": "0"},
            "ofa-engines": {"value": "0"}}}]
        # the whole GPUs and the admin's MIG devices are published as without dynamicMig, drawing on no counters
        static = [d for s in run.slices(NVIDIA) if not s["spec"].get("sharedCounters") for d in s["spec"]["devices"]]
        assert sorted(d["name"] for d in static if d["name"].startswith(("gpu-0", "gpu-2-"))) == [
            "gpu-0", "gpu-2-mig-1g5gb-19-2", "gpu-2-mig-1g5gb-19-3", "gpu-2-mig-2g10gb-14-0", "gpu-2-mig-3g20gb-9-4"]
        assert not any("consumesCounters" in d for d in static)


def test_prepare_makes_the_mig_device_and_unprepare_destroys_it(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with dynamic_plugin(gated_api, drakubelet, dirs) as run:
        minors = write_mig_minors(run.host.host_root)
        before = run.slices(NVIDIA)
        claim, answer = prepared(drakubelet, run, "three", "gpu-5-mig-3g20gb-9-4")
        assert answer.error == ""
        assert mig_layout(run.nvml, 5) == [("3g.20gb", 4)]
        (made,) = run.nvml.state.gpus[5].migs
        ledger = Ledger(dirs.plugins, NVIDIA)
        assert [(e.device, e.claim, e.made["uuid"]) for e in ledger.entries() if e.made] == [
            ("gpu-5-mig-3g20gb-9-4", claim.uid, made.uuid)]
        (entry,) = ledger.entries()
        assert entry.made is not None
        gi, ci = entry.made["gi"], entry.made["ci"]
        # the claim's CDI device is the MIG device made: its GPU and the capability nodes of the GPU and
        # compute instance made; the spec names no UUID (NVIDIA_VISIBLE_DEVICES=void, as for every claim)
        spec = check_spec(spec_file(dirs, claim))
        (device,) = spec["devices"]
        assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == [
            "/dev/nvidia5", f"/dev/nvidia-caps/nvidia-cap{minors[f'gpu5/gi{gi}/access']}",
            f"/dev/nvidia-caps/nvidia-cap{minors[f'gpu5/gi{gi}/ci{ci}/access']}"]
        assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"] and made.uuid not in json.dumps(spec)
        run.sighup()  # probed again: the MIG device made is the device it was made for, not someone else's
        assert run.slices(NVIDIA) == before
        assert drakubelet.unprepare("pod-three", [claim])[claim.uid].error == ""
        assert mig_layout(run.nvml, 5) == []
        assert Ledger(dirs.plugins, NVIDIA).entries() == []


def test_gpu_test4_claims_fit_one_gpu_each(gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """NVIDIA's gpu-test4: 1g.5gb twice, 2g.10gb and 3g.20gb on one GPU, per pod: made side by side."""
    with dynamic_plugin(gated_api, drakubelet, dirs) as run:
        for gpu in range(4, 8):
            claim, answer = prepared(drakubelet, run, f"test4-{gpu}", f"gpu-{gpu}-mig-1g5gb-19-0",
                                     f"gpu-{gpu}-mig-1g5gb-19-1", f"gpu-{gpu}-mig-2g10gb-14-2",
                                     f"gpu-{gpu}-mig-3g20gb-9-4")
            assert answer.error == ""
            assert len(answer.devices) == 4
            assert mig_layout(run.nvml, gpu) == [("1g.5gb", 0), ("1g.5gb", 1), ("2g.10gb", 2), ("3g.20gb", 4)]


def test_a_placement_taken_is_refused_and_nothing_is_left_made(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with dynamic_plugin(gated_api, drakubelet, dirs) as run:
        assert prepared(drakubelet, run, "small", "gpu-4-mig-1g5gb-19-5")[1].error == ""
        # a scheduler that did not count (or a MIG device made behind Kubernetes' back) gives a second
        # claim a placement that overlaps, with another device first: NVML refuses, the claim fails whole
        claim, answer = prepared(drakubelet, run, "overlap", "gpu-4-mig-1g5gb-19-0", "gpu-4-mig-4g20gb-5-0")
        assert "gpu-4-mig-4g20gb-5-0" in answer.error and "INSUFFICIENT_RESOURCES" in answer.error
        assert mig_layout(run.nvml, 4) == [("1g.5gb", 5)]
        assert all(e.claim != claim.uid for e in Ledger(dirs.plugins, NVIDIA).entries())


def test_someone_elses_mig_devices_are_left_alone_and_their_placements_not_offered(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path) -> None:
    profile = tmp_path / "a100.yaml"
    write_yaml(profile, {"name": "a100", "nvidia": {"driver_version": "550.54.15", "cuda_driver_version": 12040,
                                                     "gpus": [{"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-a100",
                                                               "pci_bus_id": "0000:07:00.0", "pci_device_id": 0x20B0,
                                                               "memory_bytes": 42505273344, "mig_mode": "enabled",
                                                               "mig_devices": [{"profile": "3g.20gb", "uuid": "MIG-x",
                                                                                "placement_start": 0}]}]}})
    with dynamic_plugin(gated_api, drakubelet, dirs, str(profile)) as run:
        names = set(run.devices())
        assert "gpu-0-mig-3g20gb-9-0" in names  # theirs, as without dynamicMig
        assert "consumesCounters" not in run.device("gpu-0-mig-3g20gb-9-0")
        # nothing that overlaps memory slices 0-3, no second 3g.20gb... only placements in 4-7
        dynamic = sorted(n for n in names if "consumesCounters" in run.device(n))
        assert dynamic == ["gpu-0-mig-1g10gb-15-4", "gpu-0-mig-1g10gb-15-6", "gpu-0-mig-1g5gb-19-4",
                           "gpu-0-mig-1g5gb-19-5", "gpu-0-mig-1g5gb-19-6", "gpu-0-mig-1g5gb-me-20-4",
                           "gpu-0-mig-1g5gb-me-20-5", "gpu-0-mig-1g5gb-me-20-6", "gpu-0-mig-2g10gb-14-4",
                           "gpu-0-mig-3g20gb-9-4"]
        (counter_set,) = counter_slices(run)["gpu-0-counter-set"]["spec"]["sharedCounters"]
        # 7 less the 3 theirs hold is 4, but memory slices 4-7 hold at most 3 (no 1-slice profile starts at 7)
        assert counter_set["counters"]["compute-slices"] == {"value": "3"}
        assert "memory-slice-0" not in counter_set["counters"]
        claim, answer = prepared(drakubelet, run, "beside", "gpu-0-mig-3g20gb-9-4")
        assert answer.error == ""
        assert drakubelet.unprepare("pod-beside", [claim])[claim.uid].error == ""
        assert mig_layout(run.nvml, 0) == [("3g.20gb", 0)]  # theirs stays


def test_placements_someone_else_takes_leave_the_slice_at_once_not_kept_as_gone(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """A placement offered on counters is not hardware: when an admin makes a MIG device over it, it is not
    held tainted as a device gone from the probe (it could not be, drawing on counters no longer there)."""
    with structlog.testing.capture_logs() as logs, dynamic_plugin(gated_api, drakubelet, dirs) as run:
        by_name = run.plugin.drivers[NVIDIA].snapshot.by_name
        MigMaker(run.nvml).make(by_name["gpu-4-mig-3g20gb-9-0"])  # no record: someone else's
        run.sighup()
        wait_for(lambda: run.plugin.publisher.in_sync and "gpu-4-mig-1g5gb-19-0" not in run.devices())
        names = run.devices()
        assert "gpu-4-mig-3g20gb-9-0" in names and "consumesCounters" not in run.device("gpu-4-mig-3g20gb-9-0")
        assert not [n for n in names if n.startswith("gpu-4-mig-") and n.endswith(("-0", "-1", "-2", "-3"))
                    and n != "gpu-4-mig-3g20gb-9-0"]
        assert not any("taints" in run.device(n) for n in names)
    assert not [e for e in logs if e.get("reason") in ("device-gone", "write-refused", "feature-gate-off")]


def test_a_mig_device_unmade_while_the_probe_reads_the_gpus_is_not_taken_for_someone_elses(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """A probe reads the GPUs, then what the plugin made: a claim unprepared in between (its MIG device
    destroyed, its record gone) must not make the MIG device the probe saw pass for someone else's, its
    placements withdrawn and the slice written twice (a claim allocated one of them meanwhile would fail)."""
    with dynamic_plugin(gated_api, drakubelet, dirs) as run:
        claim, answer = prepared(drakubelet, run, "racing", "gpu-5-mig-3g20gb-9-4")
        assert answer.error == "" and mig_layout(run.nvml, 5) == [("3g.20gb", 4)]
        before = run.devices()
        probe, unprepared = run.plugin.host.probe, []

        def probe_then_unprepare() -> Any:
            inventory = probe()
            if not unprepared:  # the GPUs read with the MIG device; the claim unprepared before the ledger is
                unprepared.append(drakubelet.unprepare("pod-racing", [claim])[claim.uid].error)
            return inventory
        run.plugin.host.probe = probe_then_unprepare  # type: ignore[method-assign]
        since = time.monotonic()
        run.sighup()
        wait_for(lambda: unprepared)
        run.sighup()  # the loop's next probe: the one that raced is over, what it published is written
        wait_for(lambda: run.plugin.publisher.in_sync)
        assert unprepared == [""] and mig_layout(run.nvml, 5) == []
        assert run.devices() == before and "consumesCounters" in run.device("gpu-5-mig-3g20gb-9-4")
        assert not [v for v in ("create", "update", "delete") if gated_api.log.count(v, "resourceslices", since)]


def test_a_restart_undoes_what_was_made_for_claims_never_prepared_and_nothing_else(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    plugin = dynamic_plugin(gated_api, drakubelet, dirs)
    with plugin:
        run = plugin.start()
        kept, answer = prepared(drakubelet, run, "kept", "gpu-5-mig-2g10gb-14-0")
        assert answer.error == ""
        by_name = run.plugin.drivers[NVIDIA].snapshot.by_name
        plugin.stop()
        # What a plugin killed mid-prepare leaves: a MIG device made and recorded for a claim it never
        # finished; a GPU instance made with only the intent recorded; and a MIG device someone made by hand.
        ledger = Ledger(dirs.plugins, NVIDIA)
        maker = MigMaker(run.nvml)
        ledger.begin("gpu-5-mig-3g20gb-9-4", "never-prepared", by_name["gpu-5-mig-3g20gb-9-4"].make or {})
        ledger.done("gpu-5-mig-3g20gb-9-4", maker.make(by_name["gpu-5-mig-3g20gb-9-4"]).record)
        ledger.begin("gpu-6-mig-7g40gb-0-0", "killed-mid-make", by_name["gpu-6-mig-7g40gb-0-0"].make or {})
        maker.make(by_name["gpu-6-mig-7g40gb-0-0"])
        maker.make(by_name["gpu-7-mig-4g20gb-5-0"])  # no record: someone else's
        assert (mig_layout(run.nvml, 5), mig_layout(run.nvml, 6)) == ([("2g.10gb", 0), ("3g.20gb", 4)],
                                                                      [("7g.40gb", 0)])
        run = plugin.start()
        assert mig_layout(run.nvml, 5) == [("2g.10gb", 0)]  # the prepared claim's stays
        assert mig_layout(run.nvml, 6) == []
        assert mig_layout(run.nvml, 7) == [("4g.20gb", 0)]
        assert [e.device for e in Ledger(dirs.plugins, NVIDIA).entries()] == ["gpu-5-mig-2g10gb-14-0"]
        wait_for(lambda: "gpu-7-mig-4g20gb-5-0" in run.devices()
                 and "consumesCounters" not in run.device("gpu-7-mig-4g20gb-5-0"))
        assert "consumesCounters" in run.device("gpu-5-mig-2g10gb-14-0")  # the claim's, still drawing on counters
        assert drakubelet.unprepare("pod-kept", [kept])[kept.uid].error == ""
        assert mig_layout(run.nvml, 5) == []


def test_without_the_gate_the_devices_that_exist_are_published_with_one_warning(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with structlog.testing.capture_logs() as logs, dynamic_plugin(api, drakubelet, dirs, ready=False) as run:
        wait_for(lambda: run.plugin.ready and len(run.slices(NVIDIA)) == 1)
        (spec,) = [s["spec"] for s in run.slices(NVIDIA)]
        assert "sharedCounters" not in spec
        assert sorted(d["name"] for d in spec["devices"])[:6] == [
            "gpu-0", "gpu-1", "gpu-2-mig-1g5gb-19-2", "gpu-2-mig-1g5gb-19-3", "gpu-2-mig-2g10gb-14-0",
            "gpu-2-mig-3g20gb-9-4"]
        assert len(spec["devices"]) == 10  # GPUs 0-1 and the admin's MIG devices of GPUs 2-3, as without dynamicMig
        run.sighup()
        assert len(run.slices(NVIDIA)) == 1
        assert run.plugin.gates.off == (GATE,) and run.plugin.metrics.registry.get_sample_value(
            "gpu_labeller_dra_feature_gate_off", {"gate": GATE}) == 1
    warned = [e for e in logs if e.get("reason") == "feature-gate-off"]
    assert len(warned) == 1 and warned[0]["driver"] == NVIDIA and warned[0]["gate"] == GATE
    assert warned[0]["fields"] == ["devices[].consumesCounters", "sharedCounters"]


def test_the_simulated_driver_keeps_its_mig_devices_in_the_state_file(tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    source = yaml.safe_load((Path(__file__).resolve().parents[2] / "vendors/profiles" / f"{PROFILE}.yaml").read_text())
    source["nvidia"]["state_file"] = "mig-state.json"
    source["config"] = DYNAMIC
    write_yaml(profile, source)
    with open_host(NodeOptions(simulate=str(profile))) as host:
        inventory = host.probe()
        device = next(d for d in host.dra_devices(inventory, host.offer(inventory))[NVIDIA]
                      if d.name == "gpu-4-mig-2g10gb-14-4")
        made = MigMaker(host.handles["nvidia"]).make(device)
    assert json.loads((tmp_path / "mig-state.json").read_text())["gpus"][made.record["gpu"]][0]["start"] == 4
    with open_host(NodeOptions(simulate=str(profile))) as host:  # another process, the same driver
        assert mig_layout(host.handles["nvidia"], 4) == [("2g.10gb", 4)]
        assert host.handles["nvidia"].state.gpus[4].migs[0].uuid == made.record["uuid"]
        MigMaker(host.handles["nvidia"]).unmake(made.record)
    with open_host(NodeOptions(simulate=str(profile))) as host:
        assert mig_layout(host.handles["nvidia"], 4) == []


def counted_slice(counters: Obj, uses: list[Obj]) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
            "spec": {"driver": NVIDIA, "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                     "sharedCounters": [{"name": "gpu-0-counter-set", "counters": counters}],
                     "devices": [{"name": f"d{i}", "consumesCounters": [use]} for i, use in enumerate(uses)]}}


def test_the_fake_api_server_checks_counters_as_1_34_does_and_drops_them_without_the_gate() -> None:
    good = {"memory-slice-0": {"value": "1"}, "memory": {"value": "4864Mi"}}
    use = {"counterSet": "gpu-0-counter-set", "counters": {"memory-slice-0": {"value": "1"}}}
    with FakeApiServer(feature_gates={GATE}) as gated, FakeApiServer() as plain:
        kept = gated.resource_slices.create("", counted_slice(good, [use]))
        assert kept["spec"]["sharedCounters"][0]["counters"] == good
        assert kept["spec"]["devices"][0]["consumesCounters"] == [use]
        dropped = plain.resource_slices.create("", counted_slice(good, [use]))
        assert "sharedCounters" not in dropped["spec"] and "consumesCounters" not in dropped["spec"]["devices"][0]
        # an update drops them too, unless the stored slice has them already (written while the gate was on):
        # the field is in use and kept, as the real server's ratchet keeps it
        again = plain.resource_slices.replace("", "s", counted_slice(good, [use]))
        assert "sharedCounters" not in again["spec"]
        plain.resource_slices.objects[("", "s")]["spec"]["sharedCounters"] = copy.deepcopy(
            kept["spec"]["sharedCounters"])
        ratchet = plain.resource_slices.replace("", "s", counted_slice(good, [use]))
        assert ratchet["spec"]["sharedCounters"][0]["counters"] == good
        assert ratchet["spec"]["devices"][0]["consumesCounters"] == [use]
        refused = {
            "must reference a counterSet defined": [{**use, "counterSet": "gpu-1-counter-set"}],
            "must reference a counter defined": [{**use, "counters": {"memory-slice-9": {"value": "1"}}}],
            "the total number of shared counters must not exceed 32": None,
        }
        for message, uses in refused.items():
            counters = good if uses is not None else {f"memory-slice-{i}": {"value": "1"} for i in range(33)}
            with pytest.raises(Exception, match=message):
                gated.resource_slices.create("", {**counted_slice(counters, uses or [use]),
                                                  "metadata": {"name": f"s{len(message)}"}})


def test_a_server_that_refuses_slices_with_counters_gets_the_devices_that_exist(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path) -> None:
    """A release that wants counter sets in slices of their own refuses ours (422): one warning, and the
    MIG devices that exist are published, as without the gate (here: none, the GPU has no MIG device yet)."""
    profile = tmp_path / "a100.yaml"
    write_yaml(profile, {"name": "a100", "nvidia": {"driver_version": "550.54.15", "cuda_driver_version": 12040,
                                                     "gpus": [{"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-a100",
                                                               "pci_bus_id": "0000:07:00.0", "pci_device_id": 0x20B0,
                                                               "memory_bytes": 42505273344, "mig_mode": "enabled"}]}})
    message = 'ResourceSlice is invalid: spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed'
    gated_api.faults.add(Fault(verb="create", resource="resourceslices", status=422, times=1, message=message))
    with structlog.testing.capture_logs() as logs, \
            dynamic_plugin(gated_api, drakubelet, dirs, str(profile), ready=False) as run:
        wait_for(lambda: any(e.get("reason") == "feature-gate-off" for e in logs))
        wait_for(lambda: run.plugin.publisher.in_sync)  # published again since: without counters, nothing
        assert run.slices(NVIDIA) == []
    warned = [e for e in logs if e.get("reason") == "feature-gate-off"]
    assert len(warned) == 1 and warned[0]["gate"] == GATE and "only one of `sharedCounters`" in warned[0]["refused"]
    assert not any(e.get("reason") == "write-refused" for e in logs)  # retried without counters, not started again


def test_a_server_upgraded_to_counter_sets_apart_gets_the_pool_without_them_and_nothing_else_deleted(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """A refused slice that replaces a live one (here: a server that from now on takes counter sets only in
    slices of their own, as from 1.35): the pool is written again without counters, not deleted and
    started again."""
    store = gated_api.resource_slices
    validate = store.validate

    def apart(obj: Obj) -> None:  # 1.35's rule: a slice holds either counter sets or devices
        spec = obj.get("spec") or {}
        if spec.get("sharedCounters") and spec.get("devices"):
            raise invalid("ResourceSlice", obj["metadata"]["name"], [
                'spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed'])
        validate(obj)
    with structlog.testing.capture_logs() as logs, dynamic_plugin(gated_api, drakubelet, dirs) as run:
        by_name = run.plugin.drivers[NVIDIA].snapshot.by_name
        store.validate = apart  # type: ignore[method-assign]
        since = time.monotonic()
        MigMaker(run.nvml).make(by_name["gpu-4-mig-3g20gb-9-0"])  # someone's MIG device: the pool is written again
        run.sighup()
        wait_for(lambda: run.plugin.gates.off == (GATE,) and run.plugin.publisher.in_sync
                 and len(run.slices(NVIDIA)) == 1)
        (spec,) = [s["spec"] for s in run.slices(NVIDIA)]
        assert "sharedCounters" not in spec and "gpu-4-mig-3g20gb-9-0" in [d["name"] for d in spec["devices"]]
    assert gated_api.log.count("delete", "resourceslices", since) == 4  # the 4 counter slices, nothing else
    assert not [e for e in logs if e.get("reason") == "write-refused"]
    (said,) = [e for e in logs if e.get("reason") == "feature-gate-off"]
    assert said["gate"] == GATE and "only one of `sharedCounters`" in said["refused"]


def test_a_ledger_record_that_is_not_the_plugins_is_moved_aside_and_nothing_is_undone_for_it(tmp_path: Path) -> None:
    made = tmp_path / NVIDIA / "made"
    made.mkdir(parents=True)
    (made / "gpu-0-mig-1g5gb-19-0.json").write_text('{"version": 1, "device": "gpu-0-mig-1g5gb-19-0"}')
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps({"version": 1, "device": "gpu-0-mig-1g5gb-19-1", "claim": "c", "plan": {},
                                  "made": None}))
    (made / "gpu-0-mig-1g5gb-19-1.json").symlink_to(victim)
    ledger = Ledger(tmp_path, NVIDIA)
    assert ledger.names() == frozenset()
    assert sorted(p.name for p in made.iterdir()) == ["gpu-0-mig-1g5gb-19-0.json.bad", "gpu-0-mig-1g5gb-19-1.json.bad"]
    assert (made / "gpu-0-mig-1g5gb-19-1.json.bad").is_symlink() and victim.exists()
