"""Opaque configs through the running plugin (fake API server, kubelet stand-in, NVIDIA's tools'
stand-ins): NVIDIA's gpu-test5 applied (a time slice set with nvidia-smi, an MPS control daemon told
its limits, the CDI spec carrying the MPS edits), every config that cannot be honoured refused with
one line naming the entry, the key and the value (nothing applied, nothing recorded), Kubernetes'
order (class first, later entries override), per-request targeting, unprepare undoing it all, and a
restarted plugin finding (or restarting) its MPS daemons; AMD's GpuConfig accepted as AMD defines it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.builders import wait_for
from tests.draplugin.conftest import AMD, NVIDIA, Dirs, ToolLogs, simulated_plugin
from tests.draplugin.test_draplugin_prepare import checkpoint, spec_file
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet

NV_API = "resource.nvidia.com/v1beta1"
Obj = dict[str, Any]


def opaque(parameters: Any, requests: list[str] | None = None, source: str = "FromClaim",
           driver: str = NVIDIA) -> Obj:
    """One entry of status.allocation.devices.config."""
    return {"source": source, **({"requests": requests} if requests else {}),
            "opaque": {"driver": driver, "parameters": parameters}}


def gpu_config(**sharing: Any) -> Obj:
    return {"apiVersion": NV_API, "kind": "GpuConfig", **({"sharing": sharing} if sharing else {})}


def time_slicing(interval: str) -> Obj:
    return gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": interval})


def mps(**config: Any) -> Obj:
    return gpu_config(strategy="MPS", mpsConfig=config)


# NVIDIA's demo/specs/quickstart/v1/gpu-test5.yaml: its two requests and their configs
GPU_TEST5 = [opaque(time_slicing("Long"), ["ts-gpu"]),
             opaque(mps(defaultActiveThreadPercentage=50, defaultPinnedDeviceMemoryLimit="10Gi"), ["mps-gpu"])]


def spec(dirs: Dirs, claim: Claim) -> Obj:
    return json.loads(spec_file(dirs, claim).read_text())


def edits_of(dirs: Dirs, claim: Claim, device: str) -> Obj:
    return next(d["containerEdits"] for d in spec(dirs, claim)["devices"] if d["name"] == f"{claim.uid}-{device}")


def daemons(dirs: Dirs) -> list[str]:
    """The MPS daemons' directories under the MPS root."""
    return sorted(p.name for p in dirs.mps.iterdir() if p.name != "shm") if dirs.mps.exists() else []


def prepared_ok(kubelet: FakeDraKubelet, claim: Claim) -> None:
    answer = kubelet.call_prepare(claim.driver, [claim])[claim.uid]
    assert answer.error == ""


def unprepared_ok(kubelet: FakeDraKubelet, claim: Claim) -> None:
    assert kubelet.call_unprepare(claim.driver, [claim])[claim.uid].error == ""


# --- NVIDIA's gpu-test5 ---------------------------------------------------------------------------

def test_gpu_test5_sets_the_time_slice_and_runs_an_mps_daemon_with_its_limits(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("multiple-gpus", "gpu-0", "gpu-1", requests=["ts-gpu", "mps-gpu"], config=GPU_TEST5)
        ts, shared = run.uuid("gpu-0"), run.uuid("gpu-1")
        answer = drakubelet.prepare("pod0", [claim])[claim.uid]
        assert answer.error == "" and [d.device_name for d in answer.devices] == ["gpu-0", "gpu-1"]
        (daemon,) = daemons(dirs)
        assert daemon.startswith(f"{claim.uid}-")
        assert tool_logs.smi() == [f"compute-policy -i {ts} --set-timeslice 3", f"{shared} EXCLUSIVE_PROCESS"]
        told = [line for line in tool_logs.mps() if "get_default" not in line]
        assert told == [f"{daemon}: START CUDA_VISIBLE_DEVICES={shared}",
                        f"{daemon}: CMD: set_default_device_pinned_mem_limit {shared} 10240M",
                        f"{daemon}: CMD: set_default_active_thread_percentage 50"]
        pipe = dirs.mps / daemon / "pipe"
        assert edits_of(dirs, claim, "gpu-1") | {"deviceNodes": None} == {
            "deviceNodes": None, "env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"],
            "mounts": [{"hostPath": str(pipe), "containerPath": "/tmp/nvidia-mps",
                        "options": ["rw", "nosuid", "nodev", "bind"]},
                       {"hostPath": str(dirs.mps / "shm"), "containerPath": "/dev/shm",
                        "options": ["rw", "nosuid", "nodev", "bind"]}]}
        assert "env" not in edits_of(dirs, claim, "gpu-0") and "mounts" not in edits_of(dirs, claim, "gpu-0")
        assert (dirs.mps / "shm").is_dir() and (pipe / "nvidia-cuda-mps-control.pid").exists()
        assert checkpoint(dirs)[claim.uid]["configs"] == [
            {"devices": ["gpu-0"], "applied": {"kind": "GpuConfig", "strategy": "TimeSlicing", "interval": "Long",
                                               "gpus": [ts]}},
            {"devices": ["gpu-1"], "applied": {"kind": "GpuConfig", "strategy": "MPS", "daemon": daemon,
                                               "devices": [shared], "gpus": [shared],
                                               "defaultActiveThreadPercentage": 50,
                                               "pinnedMemoryLimitsMiB": {shared: 10240}}}]
        # the second container of the pod: prepared once
        assert not drakubelet.prepare("pod1", [claim])[claim.uid].error and len(tool_logs.smi()) == 2
        assert not drakubelet.unprepare("pod0", [claim]) and not drakubelet.unprepare("pod1", [claim])[claim.uid].error
        assert tool_logs.smi()[2:] == [f"{shared} DEFAULT", f"compute-policy -i {ts} --set-timeslice 0"]
        assert tool_logs.mps()[-2:] == [f"{daemon}: CMD: quit", f"{daemon}: QUIT"]
        assert daemons(dirs) == [] and checkpoint(dirs) == {} and not spec_file(dirs, claim).exists()


def test_the_mps_demo_claim_without_limits_leaves_the_daemon_at_its_defaults(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("shared-gpu", "gpu-2", "gpu-3", requests=["mps-gpu", "mps-gpu"],
                          config=[opaque(gpu_config(strategy="MPS"), ["mps-gpu"])])
        prepared_ok(drakubelet, claim)
        (daemon,) = daemons(dirs)
        uuids = sorted((run.uuid("gpu-2"), run.uuid("gpu-3")))
        assert [line for line in tool_logs.mps() if "get_default" not in line] == [
            f"{daemon}: START CUDA_VISIBLE_DEVICES={','.join(uuids)}"]
        assert sorted(tool_logs.smi()) == [f"{u} EXCLUSIVE_PROCESS" for u in uuids]
        for device in ("gpu-2", "gpu-3"):  # one daemon, both devices' containers talk to it
            assert edits_of(dirs, claim, device)["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]


def test_per_device_limits_by_uuid_and_index_override_the_default(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        uuids = sorted((run.uuid("gpu-4"), run.uuid("gpu-5")))
        claim = run.claim("limits", "gpu-4", "gpu-5", config=[opaque(mps(
            defaultPinnedDeviceMemoryLimit="8Gi", defaultPerDevicePinnedMemoryLimit={uuids[1]: "2Gi", "0": 3 << 30}))])
        prepared_ok(drakubelet, claim)
        (daemon,) = daemons(dirs)
        assert [line for line in tool_logs.mps() if "pinned" in line] == [
            f"{daemon}: CMD: set_default_device_pinned_mem_limit {uuids[0]} 3072M",
            f"{daemon}: CMD: set_default_device_pinned_mem_limit {uuids[1]} 2048M"]


# --- refused, with one line -----------------------------------------------------------------------

WHERE = "config[0] (from the claim)"
REFUSALS: dict[str, tuple[Any, str]] = {
    "a made-up kind": ({"apiVersion": NV_API, "kind": "NoSuchConfig"},
                       f'kind: "NoSuchConfig" is not a kind of {NV_API} (GpuConfig, MigDeviceConfig)'),
    "a wrong apiVersion": ({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
                           f'apiVersion: "resource.nvidia.com/v1" is not {NV_API}'),
    "no apiVersion": ({"kind": "GpuConfig"}, f"apiVersion: null is not {NV_API}"),
    "an unknown field": (gpu_config(strategy="TimeSlicing", timeSlicingConfig={"intervall": "Long"}),
                         "sharing.timeSlicingConfig.intervall: unknown field (known: interval)"),
    "a field in the wrong case": ({"apiVersion": NV_API, "kind": "GpuConfig", "Sharing": {}},
                                  "Sharing: unknown field (known: apiVersion, kind, sharing)"),
    "a bad interval": (time_slicing("VeryLong"),
                       'sharing.timeSlicingConfig.interval: "VeryLong" is not one of Default, Short, Medium, Long'),
    "an unknown strategy": (gpu_config(strategy="Exclusive"),
                            'sharing.strategy: "Exclusive" is not TimeSlicing or MPS'),
    "TimeSlicing with an MPS config": (
        gpu_config(strategy="TimeSlicing", mpsConfig={"defaultActiveThreadPercentage": 50}),
        'sharing.mpsConfig: {"defaultActiveThreadPercentage": 50}: an MPS config with the TimeSlicing strategy'),
    "MPS with a time-slicing config": (
        gpu_config(strategy="MPS", timeSlicingConfig={"interval": "Long"}),
        'sharing.timeSlicingConfig: {"interval": "Long"}: a time-slicing config with the MPS strategy'),
    "thread percentage 0": (mps(defaultActiveThreadPercentage=0),
                            "sharing.mpsConfig.defaultActiveThreadPercentage: 0 is not a whole number from 1 to 100"),
    "thread percentage 101": (
        mps(defaultActiveThreadPercentage=101),
        "sharing.mpsConfig.defaultActiveThreadPercentage: 101 is not a whole number from 1 to 100"),
    "thread percentage as a string": (
        mps(defaultActiveThreadPercentage="50"),
        'sharing.mpsConfig.defaultActiveThreadPercentage: "50" is not a whole number from 1 to 100'),
    "a pinned limit that is no quantity": (
        mps(defaultPinnedDeviceMemoryLimit="ten gigs"),
        'sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "ten gigs" is not a quantity (10Gi, 512Mi)'),
    "a pinned limit above the device's memory": (
        mps(defaultPinnedDeviceMemoryLimit="100Gi"),
        "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 102400Mi is more than the 81559Mi of device {gpu-0}"),
    "a per-device limit naming a device not in the claim": (
        mps(defaultPerDevicePinnedMemoryLimit={"GPU-00000000-0000-0000-0000-000000000000": "1Gi"}),
        'sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit["GPU-00000000-0000-0000-0000-000000000000"]: names no '
        "device of this config (its devices: {gpu-0}, or their index 0-0)"),
    "a per-device limit naming an index not in the claim": (
        mps(defaultPerDevicePinnedMemoryLimit={"1": "1Gi"}),
        'sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit["1"]: names no device of this config '
        "(its devices: {gpu-0}, or their index 0-0)"),
    "VfioDeviceConfig": ({"apiVersion": NV_API, "kind": "VfioDeviceConfig"},
                         "kind: VfioDeviceConfig (passing a GPU through to a virtual machine with vfio-pci) is not "
                         "supported by gpu-labeller's driver"),
    "ComputeDomainChannelConfig": (
        {"apiVersion": NV_API, "kind": "ComputeDomainChannelConfig", "domainID": "d"},
        "kind: ComputeDomainChannelConfig (an IMEX channel of a ComputeDomain (NVIDIA's compute-domain.nvidia.com "
        "driver)) is not supported by gpu-labeller's driver"),
    "parameters that are no object": (["GpuConfig"], 'opaque.parameters: ["GpuConfig"] is not an object'),
    "a 9.5 KB blob of garbage": (
        {"apiVersion": NV_API, "kind": "GpuConfig", **{f"junk{i:04d}": "x" * 82 for i in range(100)}},
        "junk0000: unknown field (known: apiVersion, kind, sharing)"),
    "a blob over the API's 10 KiB": (
        {"apiVersion": NV_API, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "pad": "x" * 10300}},
        "opaque.parameters: 10401 bytes, more than the API's 10240"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_config_that_cannot_be_honoured_fails_the_claim_with_one_line(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs, case: str) -> None:
    parameters, problem = REFUSALS[case]
    if case.startswith("a 9.5 KB blob"):
        assert len(json.dumps(parameters, separators=(",", ":"))) == 9663  # within the API's 10 KiB: it gets here
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("refused", "gpu-0", config=[opaque(parameters)])
        error = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid].error
        assert error == f"gpu.nvidia.com: claim default/refused: {WHERE}: " + problem.replace("{gpu-0}",
                                                                                              run.uuid("gpu-0"))
        assert "\n" not in error and len(error) < 400
        assert checkpoint(dirs) == {} and not spec_file(dirs, claim).exists()
        assert tool_logs.smi() == [] and daemons(dirs) == []
        # the device is free: the claim did not take it
        assert not drakubelet.call_prepare(NVIDIA, [run.claim("next", "gpu-0")]).popitem()[1].error


def test_entries_that_are_not_configs_fail_the_claim(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs,
                                                     tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        cases = {
            "source": ([{"source": "FromPod", "opaque": {"driver": NVIDIA, "parameters": gpu_config()}}],
                       'config[0]: source "FromPod" is not FromClass or FromClaim'),
            "not opaque": ([{"source": "FromClass", "structured": {}}],
                           'config[0] (from the class): only opaque configs are supported, not {"source": '
                           '"FromClass", "structured": {}}'),
        }
        for name, (config, problem) in cases.items():
            claim = run.claim(name.replace(" ", "-"), "gpu-0", config=config)
            assert drakubelet.call_prepare(NVIDIA, [claim])[claim.uid].error == (
                f"gpu.nvidia.com: claim default/{claim.name}: {problem}")


def test_another_drivers_config_is_left_to_it(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs,
                                              tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("nic-too", "gpu-0", config=[
            opaque({"anything": "the NIC driver reads"}, driver="nic.example.com"), opaque(time_slicing("Short"))])
        prepared_ok(drakubelet, claim)
        assert tool_logs.smi() == [f"compute-policy -i {run.uuid('gpu-0')} --set-timeslice 1"]


# --- which config a device gets -------------------------------------------------------------------

def interval_set(logs: ToolLogs) -> list[str]:
    return [line.rsplit(" ", 1)[1] for line in logs.smi() if "--set-timeslice" in line]


def test_class_configs_come_first_and_later_entries_override(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                             dirs: Dirs, tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        # listed claim first: the class's still comes first, so the claim's wins
        first = run.claim("claim-wins", "gpu-0", config=[opaque(time_slicing("Long")),
                                                         opaque(time_slicing("Short"), source="FromClass")])
        prepared_ok(drakubelet, first)
        # of the claim's, the later one wins; a request's own config beats an earlier one for every request
        second = run.claim("later-wins", "gpu-1", config=[
            opaque(time_slicing("Short"), source="FromClass"), opaque(time_slicing("Long")),
            opaque(time_slicing("Medium"), ["gpu"])])
        prepared_ok(drakubelet, second)
        # ... and a later one for every request beats an earlier one for the request
        third = run.claim("all-later", "gpu-2", config=[opaque(time_slicing("Medium"), ["gpu"]),
                                                        opaque(time_slicing("Short"))])
        prepared_ok(drakubelet, third)
        assert interval_set(tool_logs) == ["3", "2", "1"]


def test_a_config_applies_to_its_requests_and_subrequests(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                          dirs: Dirs, tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        # firstAvailable: results name "<request>/<subrequest>"; the request's name covers them all
        claim = run.claim("first-available", "gpu-0", "gpu-1", "gpu-2", requests=["big/h100", "small/any", "other"],
                          config=[opaque(time_slicing("Long"), ["big"]), opaque(time_slicing("Short"), ["small/any"]),
                                  opaque(time_slicing("Medium"), ["small/other"])])
        prepared_ok(drakubelet, claim)
        assert tool_logs.smi() == [f"compute-policy -i {run.uuid('gpu-0')} --set-timeslice 3",
                                   f"compute-policy -i {run.uuid('gpu-1')} --set-timeslice 1"]
        assert [c["devices"] for c in checkpoint(dirs)[claim.uid]["configs"]] == [["gpu-0"], ["gpu-1"]]


def test_gpu_and_mig_configs_apply_to_their_own_devices(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs,
                                                        tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-a100-mig-mixed") as run:
        by_name = run.plugin.drivers[NVIDIA].snapshot.by_name
        mig = next(n for n in by_name if "-mig-" in n)
        gpu = next(n for n in by_name if "-mig-" not in n)
        # a GpuConfig for every request passes a MIG device over; a MigDeviceConfig gets it
        both = run.claim("both", gpu, mig, requests=["a", "b"], config=[
            opaque({"apiVersion": NV_API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}),
            opaque(time_slicing("Long"))])
        prepared_ok(drakubelet, both)
        (daemon,) = daemons(dirs)
        assert tool_logs.smi() == [f"compute-policy -i {run.uuid(gpu)} --set-timeslice 3"]  # no compute mode: MIG
        assert f"{daemon}: START CUDA_VISIBLE_DEVICES={run.uuid(mig)}" in tool_logs.mps()
        # a GpuConfig that names a MIG device's request is refused, as NVIDIA's driver refuses it
        named = run.claim("named", next(n for n in by_name if "-mig-" in n and n != mig), requests=["m"],
                          config=[opaque(time_slicing("Long"), ["m"])])
        assert drakubelet.call_prepare(NVIDIA, [named])[named.uid].error.endswith(
            "config[0] (from the claim, requests m): kind GpuConfig cannot apply to device "
            f"{named_device(api, named)} of type mig (request m)")
        # TimeSlicing on a MIG device is accepted and sets nothing (a time slice is a whole GPU's)
        sliced = run.claim("mig-sliced", next(n for n in by_name if "-mig-" in n and n not in (mig,)
                                              and n != named_device(api, named)),
                           config=[opaque({"apiVersion": NV_API, "kind": "MigDeviceConfig",
                                           "sharing": {"strategy": "TimeSlicing"}})])
        prepared_ok(drakubelet, sliced)
        assert len(tool_logs.smi()) == 1
        assert checkpoint(dirs)[sliced.uid]["configs"][0]["applied"] == {"kind": "MigDeviceConfig",
                                                                         "strategy": "TimeSlicing"}
        unprepared_ok(drakubelet, both)
        assert tool_logs.smi()[1:] == [f"compute-policy -i {run.uuid(gpu)} --set-timeslice 0"]
        assert tool_logs.mps()[-1] == f"{daemon}: QUIT" and daemons(dirs) == []


def named_device(api: FakeApiServer, claim: Claim) -> str:
    obj = api.resource_claims.get(claim.namespace, claim.name)
    return str(obj["status"]["allocation"]["devices"]["results"][0]["device"])


# --- claims that share a GPU ----------------------------------------------------------------------

def test_claims_sharing_a_gpu_agree_on_its_time_slice_and_the_last_one_resets_it(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        gpu = run.uuid("gpu-2")
        one = run.claim("one", "gpu-2", shared=True, config=[opaque(time_slicing("Long"))])
        two = run.claim("two", "gpu-2", shared=True, config=[opaque(time_slicing("Long"))])
        other = run.claim("other", "gpu-2", shared=True, config=[opaque(time_slicing("Short"))])
        mps_too = run.claim("mps-too", "gpu-2", shared=True, config=[opaque(mps())])
        prepared_ok(drakubelet, one)
        prepared_ok(drakubelet, two)
        for refused, asked in ((other, "TimeSlicing Short"), (mps_too, "MPS")):
            assert drakubelet.call_prepare(NVIDIA, [refused])[refused.uid].error == (
                f"gpu.nvidia.com: claim default/{refused.name}: {WHERE}: sharing: {asked} asked for {gpu}, which "
                f"prepared claim {one.uid} shares with TimeSlicing Long (claims that share a GPU must ask for the "
                "same time slice, and cannot share it under MPS)")
        assert interval_set(tool_logs) == ["3", "3"] and daemons(dirs) == []
        unprepared_ok(drakubelet, one)
        assert interval_set(tool_logs) == ["3", "3"]  # two still uses it
        unprepared_ok(drakubelet, two)
        assert interval_set(tool_logs) == ["3", "3", "0"]
        prepared_ok(drakubelet, other)  # nobody's interval in force any more
        assert interval_set(tool_logs)[-1] == "1"


def test_admin_access_is_prepared_beside_an_mps_claim_and_an_exclusive_claim_is_not(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        holder = run.claim("holder", "gpu-3", config=[opaque(mps(defaultActiveThreadPercentage=25))])
        prepared_ok(drakubelet, holder)
        watcher = run.claim("watcher", "gpu-3", admin=True)
        prepared_ok(drakubelet, watcher)
        rival = run.claim("rival", "gpu-3", config=[opaque(time_slicing("Long"))])
        assert drakubelet.call_prepare(NVIDIA, [rival])[rival.uid].error == (
            f"gpu.nvidia.com: claim default/rival: device gpu-3 is prepared for claim default/holder ({holder.uid}), "
            "and the allocations do not both allow sharing it")
        # an admin-access claim may not change what another claim's MPS daemon runs under either
        meddler = run.claim("meddler", "gpu-3", admin=True, config=[opaque(time_slicing("Long"))])
        assert drakubelet.call_prepare(NVIDIA, [meddler])[meddler.uid].error.endswith(
            f"sharing: TimeSlicing Long asked for {run.uuid('gpu-3')}, which prepared claim {holder.uid} shares with "
            "MPS (claims that share a GPU must ask for the same time slice, and cannot share it under MPS)")
        assert interval_set(tool_logs) == [] and len(daemons(dirs)) == 1


# --- failures of the tools ------------------------------------------------------------------------

def test_a_tool_that_fails_fails_the_claim_and_leaves_nothing(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                              dirs: Dirs, tool_logs: ToolLogs,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        monkeypatch.setenv("FAKE_NVIDIA_SMI_FAIL", "1")
        claim = run.claim("gpu-test5", "gpu-0", "gpu-1", requests=["ts-gpu", "mps-gpu"], config=GPU_TEST5)
        error = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid].error
        assert error.startswith("gpu.nvidia.com: claim default/gpu-test5: config[0] (from the claim, requests ts-gpu): "
                                "sharing.timeSlicingConfig.interval: Long not set: ")
        assert "Insufficient Permissions" in error and "\n" not in error
        mps_only = run.claim("mps-only", "gpu-1", requests=["mps-gpu"], config=GPU_TEST5)
        error = drakubelet.call_prepare(NVIDIA, [mps_only])[mps_only.uid].error
        assert error.startswith("gpu.nvidia.com: claim default/mps-only: config[1] (from the claim, requests mps-gpu): "
                                f"sharing.strategy: MPS: the control daemon for {run.uuid('gpu-1')} did not start: ")
        assert checkpoint(dirs) == {} and daemons(dirs) == [] and tool_logs.mps() == []
        monkeypatch.delenv("FAKE_NVIDIA_SMI_FAIL")
        prepared_ok(drakubelet, claim)  # the kubelet's retry, once the tool works
        monkeypatch.setenv("FAKE_NVIDIA_SMI_FAIL", "1")
        error = drakubelet.call_unprepare(NVIDIA, [claim])[claim.uid].error
        assert error.startswith("gpu.nvidia.com: claim default/gpu-test5: cannot undo its configs: ")
        assert spec_file(dirs, claim).exists() and claim.uid in checkpoint(dirs)  # kept for the retry
        monkeypatch.delenv("FAKE_NVIDIA_SMI_FAIL")
        unprepared_ok(drakubelet, claim)
        assert tool_logs.smi()[-2:] == [f"{run.uuid('gpu-1')} DEFAULT",
                                        f"compute-policy -i {run.uuid('gpu-0')} --set-timeslice 0"]
        assert daemons(dirs) == [] and checkpoint(dirs) == {}


# --- a restart ------------------------------------------------------------------------------------

def test_a_restarted_plugin_finds_its_mps_daemon_or_starts_it_again_and_unprepare_still_resets(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        found = run.claim("found", "gpu-0", "gpu-1", requests=["ts-gpu", "mps-gpu"], config=GPU_TEST5)
        restarted = run.claim("restarted", "gpu-2", config=[opaque(mps(defaultActiveThreadPercentage=30))])
        prepared_ok(drakubelet, found)
        prepared_ok(drakubelet, restarted)
        ts = run.uuid("gpu-0")
    kept, killed = (next(d for d in daemons(dirs) if d.startswith(c.uid)) for c in (found, restarted))
    os.kill(int((dirs.mps / killed / "pipe" / "nvidia-cuda-mps-control.pid").read_text()), signal.SIGKILL)
    wait_for(lambda: not (dirs.mps / killed / "pipe" / "control").exists() or not alive(dirs, killed))
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        assert tool_logs.mps().count(f"{kept}: START CUDA_VISIBLE_DEVICES={run.uuid('gpu-1')}") == 1  # found
        assert tool_logs.mps().count(f"{killed}: START CUDA_VISIBLE_DEVICES={run.uuid('gpu-2')}") == 2  # again
        assert f"{killed}: CMD: set_default_active_thread_percentage 30" in tool_logs.mps()[-3:]
        # the kubelet asks again after the restart: answered from the checkpoint, nothing applied again
        smi = len(tool_logs.smi())
        prepared_ok(drakubelet, found)
        assert len(tool_logs.smi()) == smi
        unprepared_ok(drakubelet, found)
        unprepared_ok(drakubelet, restarted)
        assert f"compute-policy -i {ts} --set-timeslice 0" in tool_logs.smi()[smi:]
        assert {f"{kept}: QUIT", f"{killed}: QUIT"} <= set(tool_logs.mps()) and daemons(dirs) == []


def test_an_mps_daemon_a_killed_plugin_never_recorded_is_stopped_at_unprepare(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    """Killed after starting the daemon, before writing the checkpoint: the kubelet, which never got
    an answer, unprepares the claim (its pod deleted); the daemon's note says what to undo."""
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("orphan", "gpu-6", config=[opaque(mps(defaultActiveThreadPercentage=40))])
        prepared_ok(drakubelet, claim)
        gpu = run.uuid("gpu-6")
    (dirs.plugins / NVIDIA / "claims" / f"{claim.uid}.json").unlink()
    spec_file(dirs, claim).unlink()
    (daemon,) = daemons(dirs)
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100"):
        assert tool_logs.mps().count(f"{daemon}: START CUDA_VISIBLE_DEVICES={gpu}") == 1  # not recovered: unknown
        unprepared_ok(drakubelet, claim)
        assert tool_logs.mps()[-2:] == [f"{daemon}: CMD: quit", f"{daemon}: QUIT"]
        assert tool_logs.smi()[-1] == f"{gpu} DEFAULT" and daemons(dirs) == []
        unprepared_ok(drakubelet, claim)  # again: nothing left to do


def alive(dirs: Dirs, daemon: str) -> bool:
    pid_file = dirs.mps / daemon / "pipe" / "nvidia-cuda-mps-control.pid"
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def test_a_version_2_record_is_still_read(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs,
                                          tool_logs: ToolLogs) -> None:
    """What the previous release wrote (no configs): answered from it, unprepared without a tool call."""
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        old = run.claim("old", "gpu-5")
        prepared_ok(drakubelet, old)
    path = dirs.plugins / NVIDIA / "claims" / f"{old.uid}.json"
    doc = json.loads(path.read_text())
    assert doc.pop("configs") == [] and doc["version"] == 4
    for device in doc["devices"]:
        assert device.pop("consumedCapacity") == {}
    path.write_text(json.dumps({**doc, "version": 2}))
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100"):
        reads = api.log.count("get", "resourceclaims")
        prepared_ok(drakubelet, old)
        assert api.log.count("get", "resourceclaims") == reads
        unprepared_ok(drakubelet, old)
        assert tool_logs.smi() == [] and checkpoint(dirs) == {}


# --- AMD ------------------------------------------------------------------------------------------

AMD_API = "gpu.resource.amd.com/v1alpha1"


def test_amds_gpu_config_is_accepted_as_amd_defines_it_and_nothing_else(api: FakeApiServer,
                                                                        drakubelet: FakeDraKubelet,
                                                                        dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "mixed-l40s-mi210") as run:
        device = run.devices(AMD)[0]
        ok = run.claim("amd", device, driver=AMD, config=[
            opaque({"apiVersion": AMD_API, "kind": "GpuConfig"}, driver=AMD),
            opaque(time_slicing("Long"))])  # NVIDIA's, for another request's devices: not AMD's to read
        prepared_ok(drakubelet, ok)
        assert checkpoint(dirs, AMD)[ok.uid]["configs"] == [{"devices": [device], "applied": {"kind": "GpuConfig"}}]
        unprepared_ok(drakubelet, ok)
        for parameters, problem in (
                ({"apiVersion": AMD_API, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}},
                 "sharing: unknown field (known: apiVersion, kind)"),
                ({"apiVersion": AMD_API, "kind": "PartitionConfig"},
                 f'kind: "PartitionConfig" is not a kind of {AMD_API} (GpuConfig)'),
                ({"apiVersion": NV_API, "kind": "GpuConfig"}, f'apiVersion: "{NV_API}" is not {AMD_API}')):
            claim = run.claim(f"amd-{len(problem)}", device, driver=AMD, config=[opaque(parameters, driver=AMD)])
            assert drakubelet.call_prepare(AMD, [claim])[claim.uid].error == (
                f"gpu.amd.com: claim default/{claim.name}: {WHERE}: {problem}")
        assert list(checkpoint(dirs, AMD)) == []


def test_a_plain_claim_records_no_config_and_calls_no_tool(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                          dirs: Dirs, tool_logs: ToolLogs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        plain = run.claim("plain", "gpu-7")
        prepared_ok(drakubelet, plain)
        unprepared_ok(drakubelet, plain)
        assert tool_logs.smi() == [] and tool_logs.mps() == [] and not Path(dirs.mps).exists()
