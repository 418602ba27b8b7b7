"""GPU-memory sharing in DRA (``sharing.memory``, Kubernetes 1.34's consumable capacity) through the
running plugin: with ``DRAConsumableCapacity`` on the API server each whole GPU is published for
several claims with a ``memory`` capacity they consume in the config's unit, and nothing is written
while nothing changes; without it the server drops those fields, the plugin notices from its answer,
says so once and publishes today's exclusive GPUs. Prepare gives each share its own CDI device and
gpushare's environment, never lets a GPU's prepared shares pass its memory, and under an MPS config
serves a GPU's shares from one MPS daemon that tells each client its share as its pinned memory limit."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.builders import wait_for
from tests.draplugin.conftest import NVIDIA, Dirs, ToolLogs, dra_config, simulated_plugin
from tests.draplugin.test_draplugin_configs import daemons, mps, opaque, prepared_ok, unprepared_ok
from tests.draplugin.test_draplugin_prepare import KIND, checkpoint, spec_file
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet
from tests.plugin.profile_files import write_yaml
from tests.plugin.test_plugin_cdi import check_spec, resolvable

GATE = "DRAConsumableCapacity"
T4 = "t4-x4-gpushare"  # 4 Tesla T4, 15109 MiB each: 14 GiB shared
Obj = dict[str, Any]


def config_file(dirs: Dirs, unit: str = "GiB") -> Path:
    path = dirs.plugins.parent / "memory.yaml"
    write_yaml(path, dra_config("nvidia", memory_unit=unit))
    return path


def results(api: FakeApiServer, claim: Claim) -> list[Obj]:
    return list(api.resource_claims.get(claim.namespace, claim.name)["status"]["allocation"]["devices"]["results"])


def edits(dirs: Dirs, claim: Claim) -> dict[str, Obj]:
    """The claim's CDI devices' edits, by CDI device name."""
    return {d["name"]: d["containerEdits"] for d in json.loads(spec_file(dirs, claim).read_text())["devices"]}


def env(entries: list[str]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in entries)


def refused(kubelet: FakeDraKubelet, claim: Claim) -> str:
    error = kubelet.call_prepare(claim.driver, [claim])[claim.uid].error
    assert error
    return str(error)


# --- publishing -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("unit", "policy"), [
    ("GiB", {"default": "14Gi", "validRange": {"min": "1Gi", "max": "14Gi", "step": "1Gi"}}),
    ("MiB", {"default": "15109Mi", "validRange": {"min": "1Mi", "max": "15109Mi", "step": "1Mi"}}),
])
def test_each_gpu_is_published_for_claims_that_consume_its_memory_in_the_configs_unit(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, unit: str, policy: Obj) -> None:
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs, unit)) as run:
        assert run.devices() == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        for name in run.devices():
            device = run.device(name)
            assert device["allowMultipleAllocations"] is True
            assert device["capacity"] == {"memory": {"value": "15472384Ki", "requestPolicy": policy}}
        assert run.plugin.gates.off == ()


def test_a_mig_gpu_stays_one_claims_while_the_whole_gpus_are_shared(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                    dirs: Dirs) -> None:
    api.feature_gates.add(GATE)
    path = dirs.plugins.parent / "memory.yaml"
    write_yaml(path, {**dra_config("nvidia", memory_unit="GiB"), "flags": {"migStrategy": "none"}})
    with simulated_plugin(api, drakubelet, dirs, "dgx-a100-mig-mixed", config_path=path) as run:
        shared = [name for name in run.devices() if run.device(name).get("allowMultipleAllocations")]
        assert shared == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]  # the four GPUs with MIG off
        migs = [name for name in run.devices() if "-mig-" in name]
        assert len(migs) == 22 and all("requestPolicy" not in c for name in migs
                                       for c in run.device(name)["capacity"].values())


def test_nothing_is_written_while_nothing_changes(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """The budget: 0 slice writes while idle, the policies' quantities compared by value."""
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        assert run.device("gpu-0")["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "1Gi"
        assert run.writes_while_idle() == 0


def test_without_the_gate_the_plugin_notices_says_so_once_and_publishes_exclusive_gpus(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """A 1.34 API server with DRAConsumableCapacity off (its default) drops the fields from what it
    stores: the plugin's first write tells it, and from then on it publishes what that server keeps."""
    with structlog.testing.capture_logs() as logs, \
            simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        wait_for(lambda: run.plugin.publisher.in_sync)
        for name in run.devices():
            assert run.device(name)["capacity"] == {"memory": {"value": "15472384Ki"}}
            assert "allowMultipleAllocations" not in run.device(name)
        assert run.plugin.gates.off == (GATE,)
        since = time.monotonic()
        for _ in range(2):
            run.sighup()
        assert run.writes(since) == 0 and run.writes() == 1  # the one write that told it
        said = [e for e in logs if e.get("reason") == "feature-gate-off"]
        assert [(e["gate"], e["driver"], e["fields"]) for e in said] == [
            (GATE, NVIDIA, ["devices[].allowMultipleAllocations", "devices[].capacity.memory.requestPolicy"])]
        assert "scheduler extender" in said[0]["instead"]
        assert not [e for e in logs if e.get("reason") == "fields-dropped"]
        # prepared as published: a GPU for one claim, no share to account for
        whole = run.claim("whole", "gpu-0")
        prepared_ok(drakubelet, whole)
        assert "ALIYUN_COM_GPU_MEM_POD" not in env(check_spec(spec_file(dirs, whole))["containerEdits"]["env"])
        assert "do not both allow sharing it" in refused(drakubelet, run.claim("second", "gpu-0"))
        prepared_ok(drakubelet, run.claim("shared", "gpu-1", shared=True))  # a shareID alone: as before the gate


def test_slices_a_server_without_the_gate_kept_are_replaced_once_by_a_plugin_that_knows(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """A restarted plugin writes the fields again (the stored slices lack them), learns, writes no more."""
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        wait_for(lambda: run.plugin.publisher.in_sync)
    before = api.log.count("update", "resourceslices")
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        wait_for(lambda: run.plugin.publisher.in_sync and run.plugin.gates.off == (GATE,))
        run.sighup()
        assert api.log.count("update", "resourceslices") == before + 1
        assert "allowMultipleAllocations" not in run.device("gpu-0")


# --- preparing shares ---------------------------------------------------------------------------------

def test_each_share_gets_its_cdi_device_and_gpushares_environment(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                  dirs: Dirs) -> None:
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        small, large = (run.claim("small", "gpu-1", consumed={"memory": "4Gi"}),
                        run.claim("large", "gpu-1", consumed={"memory": "8Gi"}))
        answers = drakubelet.call_prepare(NVIDIA, [small, large])
        for claim, units in ((small, 4), (large, 8)):
            (result,) = results(api, claim)
            (device,) = answers[claim.uid].devices
            name = f"{claim.uid}-gpu-1-{result['shareID']}"
            assert answers[claim.uid].error == "" and list(device.cdi_device_ids) == [f"{KIND}={name}"]
            spec = check_spec(spec_file(dirs, claim))
            assert env(edits(dirs, claim)[name]["env"]) == {"ALIYUN_COM_GPU_MEM_IDX": "1",
                                                           "ALIYUN_COM_GPU_MEM_CONTAINER": str(units),
                                                           "ALIYUN_COM_GPU_MEM_DEV": "14"}
            common = env(spec["containerEdits"]["env"])
            assert common["ALIYUN_COM_GPU_MEM_POD"] == str(units)
            assert common["NVIDIA_VISIBLE_DEVICES"] == "void"  # the device comes from CDI, as NVIDIA's driver does
            (recorded,) = checkpoint(dirs)[claim.uid]["devices"]
            assert (recorded["shareID"], recorded["consumedCapacity"]) == (result["shareID"], {"memory": f"{units}Gi"})
        assert resolvable(dirs.cdi) == {i for a in answers.values() for d in a.devices for i in d.cdi_device_ids}


def test_two_shares_of_one_gpu_in_one_claim_are_two_cdi_devices(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                dirs: Dirs) -> None:
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        claim = run.claim("pair", "gpu-0", "gpu-0", requests=["a", "b"], consumed={"memory": "3Gi"})
        answer = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid]
        assert answer.error == ""
        shares = [r["shareID"] for r in results(api, claim)]
        assert [(list(d.request_names), list(d.cdi_device_ids)) for d in answer.devices] == [
            ([request], [f"{KIND}={claim.uid}-gpu-0-{share}"]) for request, share in zip("ab", shares)]
        assert env(check_spec(spec_file(dirs, claim))["containerEdits"]["env"])["ALIYUN_COM_GPU_MEM_POD"] == "6"
        assert len(checkpoint(dirs)[claim.uid]["devices"]) == 2


def test_a_gpus_prepared_shares_never_pass_its_memory(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                      dirs: Dirs) -> None:
    """15109.5 MiB (15472384Ki): 8 + 4 GiB fit, 4 GiB more do not; an unprepared share makes room; a restarted plugin
    still counts the shares it prepared."""
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        first, second = (run.claim("first", "gpu-2", consumed={"memory": "8Gi"}),
                         run.claim("second", "gpu-2", consumed={"memory": "4Gi"}))
        third = run.claim("third", "gpu-2", consumed={"memory": "4Gi"})
        prepared_ok(drakubelet, first)
        prepared_ok(drakubelet, second)
        assert refused(drakubelet, third) == (
            "gpu.nvidia.com: claim default/third: device gpu-2: 4Gi of its memory asked, but 12Gi of its 15472384Ki is "
            "prepared for 2 other claim(s) (default/first, default/second)")
        assert third.uid not in checkpoint(dirs) and not spec_file(dirs, third).exists()
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)):
        assert "12Gi of its 15472384Ki is prepared" in refused(drakubelet, third)
        unprepared_ok(drakubelet, second)
        prepared_ok(drakubelet, third)


def test_a_share_that_does_not_say_what_it_consumes_is_refused(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                               dirs: Dirs) -> None:
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        silent = run.claim("silent", "gpu-0", shared=True)
        why = refused(drakubelet, silent)
        assert "a share (shareID" in why and "that does not say what it consumes of memory (no consumedCapacity" in why
        odd = run.claim("odd", "gpu-0", consumed={"memory": "lots"})
        assert 'consumedCapacity {"memory": "lots"} is not quantities' in refused(drakubelet, odd)
        alien = run.claim("alien", "gpu-0", consumed={"memory": "1Gi", "cores": "2"})
        assert "consumedCapacity names cores, which the device does not have" in refused(drakubelet, alien)


def test_an_exclusive_claim_and_shares_do_not_mix(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        share = run.claim("share", "gpu-3", consumed={"memory": "2Gi"})
        whole = run.claim("whole", "gpu-3")
        prepared_ok(drakubelet, share)
        assert "and the allocations do not both allow sharing it" in refused(drakubelet, whole)


# --- MPS: the share as each client's pinned memory limit ------------------------------------------------

def test_mps_serves_a_gpus_shares_from_one_daemon_that_limits_each_client_to_its_share(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    api.feature_gates.add(GATE)
    config = [opaque(mps(defaultActiveThreadPercentage=25), source="FromClass")]  # the DeviceClass's config
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        gpu = run.uuid("gpu-0")
        one = run.claim("one", "gpu-0", consumed={"memory": "4Gi"}, config=config)
        two = run.claim("two", "gpu-0", consumed={"memory": "6Gi"}, config=config)
        prepared_ok(drakubelet, one)
        prepared_ok(drakubelet, two)
        (daemon,) = daemons(dirs)
        assert daemon.startswith("shares-")
        assert tool_logs.smi() == [f"{gpu} EXCLUSIVE_PROCESS"]  # once, for the first share
        assert [line for line in tool_logs.mps() if "START" in line] == [f"{daemon}: START CUDA_VISIBLE_DEVICES={gpu}"]
        for claim, mib in ((one, 4096), (two, 6144)):
            (share,) = results(api, claim)
            told = edits(dirs, claim)[f"{claim.uid}-gpu-0-{share['shareID']}"]
            assert env(told["env"]) == {
                "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mib}M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "ALIYUN_COM_GPU_MEM_IDX": "0",
                "ALIYUN_COM_GPU_MEM_CONTAINER": str(mib // 1024), "ALIYUN_COM_GPU_MEM_DEV": "14"}
            assert told["mounts"][0]["hostPath"] == str(dirs.mps / daemon / "pipe")
        # a share without MPS cannot run on a GPU in EXCLUSIVE_PROCESS mode
        plain = run.claim("plain", "gpu-0", consumed={"memory": "1Gi"})
        assert "runs under the MPS control daemon of claim(s)" in refused(drakubelet, plain)
        unprepared_ok(drakubelet, one)
        assert daemons(dirs) == [daemon] and len(tool_logs.smi()) == 1  # the other share still runs
        unprepared_ok(drakubelet, two)
        assert daemons(dirs) == [] and tool_logs.smi()[-1] == f"{gpu} DEFAULT"
        assert tool_logs.mps()[-1] == f"{daemon}: QUIT"


def test_mps_is_refused_for_a_gpu_shares_without_mps_hold_and_above_the_share(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        plain = run.claim("plain", "gpu-1", consumed={"memory": "1Gi"})
        prepared_ok(drakubelet, plain)
        late = run.claim("late", "gpu-1", consumed={"memory": "1Gi"}, config=[opaque(mps())])
        assert f"is shared by claim(s) {plain.uid} without MPS" in refused(drakubelet, late)
        greedy = run.claim("greedy", "gpu-2", consumed={"memory": "2Gi"},
                           config=[opaque(mps(defaultPinnedDeviceMemoryLimit="3Gi"))])
        assert ("sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 3072Mi is more than the 2048Mi of the claim's "
                f"share of device {run.uuid('gpu-2')}") in refused(drakubelet, greedy)
        assert tool_logs.smi() == [] and daemons(dirs) == []


def test_a_restarted_plugin_finds_the_shared_daemon_and_stops_it_after_the_last_share(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        gpu = run.uuid("gpu-3")
        claim = run.claim("kept", "gpu-3", consumed={"memory": "5Gi"}, config=[opaque(mps())])
        prepared_ok(drakubelet, claim)
        (daemon,) = daemons(dirs)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        assert [line for line in tool_logs.mps() if "START" in line] == [f"{daemon}: START CUDA_VISIBLE_DEVICES={gpu}"]
        plain = run.claim("plain", "gpu-3", consumed={"memory": "1Gi"})
        assert "runs under the MPS control daemon" in refused(drakubelet, plain)  # known again
        unprepared_ok(drakubelet, claim)
        assert daemons(dirs) == [] and tool_logs.smi()[-1] == f"{gpu} DEFAULT"
        assert checkpoint(dirs) == {}


def test_a_shared_daemon_no_recorded_claim_uses_is_stopped_when_its_claim_is_unprepared(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tool_logs: ToolLogs) -> None:
    """A plugin killed after starting a GPU's shared daemon for its first share and before recording
    the claim: the claim's unprepare (no record) stops the daemon no prepared claim uses."""
    api.feature_gates.add(GATE)
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)) as run:
        gpu = run.uuid("gpu-1")
        claim = run.claim("lost", "gpu-1", consumed={"memory": "2Gi"}, config=[opaque(mps())])
        prepared_ok(drakubelet, claim)
        (daemon,) = daemons(dirs)
    (dirs.plugins / NVIDIA / "claims" / f"{claim.uid}.json").unlink()  # as if never written
    with simulated_plugin(api, drakubelet, dirs, T4, config_path=config_file(dirs)):
        assert daemons(dirs) == [daemon]
        unprepared_ok(drakubelet, claim)
        assert daemons(dirs) == [] and tool_logs.smi()[-1] == f"{gpu} DEFAULT"
        assert tool_logs.mps()[-1] == f"{daemon}: QUIT"
