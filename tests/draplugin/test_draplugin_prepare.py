"""NodePrepareResources and NodeUnprepareResources over real gRPC, claims read from the fake API
server: the CDI device IDs of exactly the allocated devices, a valid CDI spec file per claim, a
checkpoint that survives a restart, one error per bad claim, and a shared claim prepared once."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from labeller.apps.draplugin.checkpoint import DIRECTORY, Checkpoint, PreparedClaim, PreparedDevice
from labeller.apps.draplugin.prepare import ClaimRef, Preparer
from labeller.model.offer import PhysicalDevice
from tests.builders import wait_for
from tests.draplugin.conftest import AMD, NODE, NVIDIA, Dirs, Running, simulated_plugin
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet
from tests.plugin.test_plugin_cdi import check_spec, resolvable
from vendors.amd.devices import AmdDevice
from vendors.nvidia.devices import NvidiaDevice

KIND = "k8s.gpu-labeller.io/gpu"


def physical(run: Running, name: str, driver: str = NVIDIA) -> PhysicalDevice:
    return run.plugin.drivers[driver].snapshot.by_name[name].physical


def spec_file(dirs: Dirs, claim: Claim) -> Path:
    return dirs.cdi / f"gpu-labeller-dra_{claim.driver}_{claim.uid}.json"


def checkpoint(dirs: Dirs, driver: str = NVIDIA) -> dict[str, Any]:
    """The checkpoint's claims by UID."""
    return {p.stem: json.loads(p.read_text()) for p in (dirs.plugins / driver / DIRECTORY).glob("*.json")}


def claim_reads(api: FakeApiServer) -> int:
    return api.log.count("get", "resourceclaims")


def test_prepare_answers_exactly_the_allocated_devices(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                      dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("two-gpus", "gpu-1", "gpu-3")
        answer = drakubelet.prepare("pod-1", [claim])[claim.uid]
        assert answer.error == ""
        assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
                for d in answer.devices] == [
            (["gpu"], NODE, name, [f"{KIND}={claim.uid}-{name}"]) for name in ("gpu-1", "gpu-3")]
        spec = check_spec(spec_file(dirs, claim))
        assert {i for d in answer.devices for i in d.cdi_device_ids} == resolvable(dirs.cdi)
        gpus = [physical(run, name) for name in ("gpu-1", "gpu-3")]
        assert all(isinstance(g, NvidiaDevice) for g in gpus)
        nodes = [[n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]]
        assert nodes == [[f"/dev/nvidia{g.nvml_gpu.minor_number}"] for g in gpus if isinstance(g, NvidiaDevice)]
        edits = spec["containerEdits"]
        # as NVIDIA's DRA driver: spec-wide edits reach every container using any device of the claim, so
        # they name none (a legacy runtime hook would inject the GPUs NVIDIA_VISIBLE_DEVICES names)
        assert [e for e in edits["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")] == ["NVIDIA_VISIBLE_DEVICES=void"]
        assert not any(g.visible_id in json.dumps(spec) for g in gpus)
        assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= {n["path"] for n in edits["deviceNodes"]}
        assert list(checkpoint(dirs)) == [claim.uid]


def test_a_mig_device_gets_its_parent_and_capability_nodes(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                          dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-a100-mig-mixed") as run:
        by_name = run.plugin.drivers[NVIDIA].snapshot.by_name
        name, mig = next((n, d.physical) for n, d in by_name.items()
                         if isinstance(d.physical, NvidiaDevice) and d.physical.mig is not None)
        assert isinstance(mig, NvidiaDevice)
        claim = run.claim("mig", name)
        answer = drakubelet.prepare("pod-1", [claim])[claim.uid]
        assert answer.error == "" and [d.device_name for d in answer.devices] == [name]
        spec = check_spec(spec_file(dirs, claim))
        (device,) = spec["devices"]
        paths = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
        assert paths[0] == f"/dev/nvidia{mig.nvml_gpu.minor_number}"
        assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"] and mig.visible_id not in json.dumps(spec)


def test_an_amd_partition_gets_kfd_and_its_render_node(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                       dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "mi300x-x8-cpx") as run:
        name = run.devices(AMD)[5]
        part = physical(run, name, AMD)
        assert isinstance(part, AmdDevice)
        claim = run.claim("partition", name, driver=AMD)
        answer = drakubelet.prepare("pod-1", [claim])[claim.uid]
        assert (answer.error == ""
                and [list(d.cdi_device_ids) for d in answer.devices] == [[f"{KIND}={claim.uid}-{name}"]])
        spec = check_spec(spec_file(dirs, claim))
        assert spec["containerEdits"] == {"deviceNodes": [{"path": "/dev/kfd", "permissions": "rwm"}]}
        (device,) = spec["devices"]
        assert (f"/dev/dri/renderD{part.node.render_minor}"
                in [n["path"] for n in device["containerEdits"]["deviceNodes"]])


def test_prepare_is_idempotent(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("once", "gpu-0")
        first = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid]
        written = spec_file(dirs, claim).stat()
        again = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid]
        assert again == first and not again.error
        assert claim_reads(api) == 1  # answered from the checkpoint
        assert spec_file(dirs, claim).stat().st_mtime_ns == written.st_mtime_ns
        assert list(checkpoint(dirs)) == [claim.uid]


def test_a_restart_between_prepare_and_unprepare_loses_nothing(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                               dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        kept, done = run.claim("kept", "gpu-4"), run.claim("done", "gpu-5")
        answers = drakubelet.call_prepare(NVIDIA, [kept, done])
        assert not any(a.error for a in answers.values())
    api.resource_claims.delete("default", "kept")  # the restarted plugin must not need the API to answer
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100"):
        again = drakubelet.call_prepare(NVIDIA, [kept])[kept.uid]
        assert again == answers[kept.uid]
        assert not drakubelet.call_unprepare(NVIDIA, [done])[done.uid].error
        assert not spec_file(dirs, done).exists() and list(checkpoint(dirs)) == [kept.uid]
        assert not drakubelet.call_unprepare(NVIDIA, [kept])[kept.uid].error
        assert list(dirs.cdi.iterdir()) == [] and checkpoint(dirs) == {}


def test_unprepare_cleans_a_spec_file_the_checkpoint_never_heard_of(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                    dirs: Dirs) -> None:
    """A plugin killed after writing the spec file and before the checkpoint: nothing leaks."""
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("half-done", "gpu-0")
        dirs.cdi.mkdir(parents=True, exist_ok=True)
        spec_file(dirs, claim).write_text("{}")
        assert not drakubelet.call_unprepare(NVIDIA, [claim])[claim.uid].error
        assert not spec_file(dirs, claim).exists()
        never = Claim("default", "never-prepared", "0b7c0e8e-0000-4000-8000-000000000000", NVIDIA)
        assert not drakubelet.call_unprepare(NVIDIA, [never])[never.uid].error


def test_each_bad_claim_fails_alone_naming_its_device(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                      dirs: Dirs) -> None:
    # recovery after 60 s, not 0.3 s: on a loaded machine gpu-6 was healthy again before its claim was prepared
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", recovery_seconds=60) as run:
        sick = physical(run, "gpu-6")
        run.nvml.inject_xid(sick.health_key, 79)
        wait_for(lambda: "gpu-6" not in run.devices())
        good = run.claim("good", "gpu-0")
        missing = run.claim("missing", "gpu-42")
        unhealthy = run.claim("unhealthy", "gpu-6")
        elsewhere = run.claim("elsewhere", "gpu-1", pool="gpu-node-2")
        unallocated = Claim("default", "unallocated", api.create_resource_claim("unallocated")["metadata"]["uid"],
                            NVIDIA)
        replaced = run.claim("replaced", "gpu-2")
        api.resource_claims.delete("default", "replaced")
        run.claim("replaced", "gpu-2")  # the same name, another object
        absent = Claim("default", "absent", "5d1f0c7e-0000-4000-8000-000000000000", NVIDIA)
        claims = [good, missing, unhealthy, elsewhere, unallocated, replaced, absent]
        answers = drakubelet.call_prepare(NVIDIA, claims)
        errors = {c.name: answers[c.uid].error for c in claims}
        assert errors["good"] == "" and [d.device_name for d in answers[good.uid].devices] == ["gpu-0"]
        assert errors["missing"] == "gpu.nvidia.com: claim default/missing: device gpu-42 is not on this node"
        assert errors["unhealthy"] == "gpu.nvidia.com: claim default/unhealthy: device gpu-6 is unhealthy"
        assert errors["elsewhere"] == ("gpu.nvidia.com: claim default/elsewhere: device gpu-1 is in pool gpu-node-2, "
                                       f"not this node's ({NODE})")
        assert errors["unallocated"] == "gpu.nvidia.com: claim default/unallocated: not allocated"
        assert "the ResourceClaim has UID" in errors["replaced"] and replaced.uid in errors["replaced"]
        assert errors["absent"].startswith("gpu.nvidia.com: claim default/absent: cannot read the ResourceClaim: 404")
        assert sorted(p.name for p in dirs.cdi.iterdir()) == [spec_file(dirs, good).name]
        assert list(checkpoint(dirs)) == [good.uid]
        later = run.claim("later", "gpu-7")  # the plugin keeps serving
        assert not drakubelet.call_prepare(NVIDIA, [later])[later.uid].error


def test_a_claim_failed_by_a_bug_is_counted_as_failed(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubelet gets the error, and gpu_labeller_dra_prepares_total{outcome="failed"} counts it: the
    GpuLabellerDraPrepareFailing alert sees a bug as it sees a bad claim."""
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("hits-a-bug", "gpu-0")

        def bug(self: Preparer, ref: ClaimRef) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(Preparer, "prepare", bug)
        assert drakubelet.call_prepare(NVIDIA, [claim])[claim.uid].error == "gpu.nvidia.com: internal error: a bug"
        assert run.plugin.metrics.registry.get_sample_value(
            "gpu_labeller_dra_prepares_total", {"driver": NVIDIA, "outcome": "failed"}) == 1


def test_a_claim_shared_by_pods_is_prepared_once_and_unprepared_after_the_last(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        shared = run.claim("shared", "gpu-2")
        first = drakubelet.prepare("pod-a", [shared])[shared.uid]
        second = drakubelet.prepare("pod-b", [shared])[shared.uid]
        assert first == second and not first.error
        assert len(drakubelet.seen("prepare")) == 1 and claim_reads(api) == 1
        # a kubelet that lost its own state asks again: the plugin answers the same, still once
        assert drakubelet.call_prepare(NVIDIA, [shared])[shared.uid] == first and claim_reads(api) == 1
        assert drakubelet.unprepare("pod-a", [shared]) == {}  # pod-b still runs: not unprepared
        assert spec_file(dirs, shared).exists() and list(checkpoint(dirs)) == [shared.uid]
        assert not drakubelet.unprepare("pod-b", [shared])[shared.uid].error
        assert not spec_file(dirs, shared).exists() and checkpoint(dirs) == {}


def test_concurrent_prepares_of_different_claims(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claims = [run.claim(f"claim-{i}", f"gpu-{i % 8}", shared=True) for i in range(24)]
        answers = all_at_once(drakubelet, claims)
        assert {uid: a.error for uid, a in answers.items()} == {c.uid: "" for c in claims}
        assert all(list(answers[c.uid].devices[0].cdi_device_ids) == [f"{KIND}={c.uid}-gpu-{i % 8}-{share(api, c)}"]
                   for i, c in enumerate(claims))
        assert sorted(checkpoint(dirs)) == sorted(c.uid for c in claims)
        assert resolvable(dirs.cdi) == {i for a in answers.values() for d in a.devices for i in d.cdi_device_ids}


def share(api: FakeApiServer, claim: Claim) -> str:
    """The share ID of the claim's one allocation result."""
    (result,) = api.resource_claims.get(claim.namespace, claim.name)["status"]["allocation"]["devices"]["results"]
    return str(result["shareID"])


def all_at_once(drakubelet: FakeDraKubelet, claims: list[Claim]) -> dict[str, Any]:
    """Each claim prepared in its own call, the calls let go together."""
    answers: dict[str, Any] = {}
    start = threading.Barrier(len(claims))

    def prepare(claim: Claim) -> None:
        start.wait(30)
        answers.update(drakubelet.call_prepare(NVIDIA, [claim]))

    threads = [threading.Thread(target=prepare, args=(c,)) for c in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_only_this_drivers_results_are_prepared(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "mixed-l40s-mi210") as run:
        amd = run.devices(AMD)[0]
        results = [{"request": "nv", "driver": NVIDIA, "pool": NODE, "device": "gpu-0"},
                   {"request": "amd", "driver": AMD, "pool": NODE, "device": amd},
                   {"request": "net", "driver": "net.example.com", "pool": "fabric", "device": "nic-0"}]
        uid = api.create_resource_claim("both", results=results)["metadata"]["uid"]
        # the kubelet calls each driver's plugin with the claims that have results of that driver
        nvidia = drakubelet.call_prepare(NVIDIA, [Claim("default", "both", uid, NVIDIA)])[uid]
        amd_answer = drakubelet.call_prepare(AMD, [Claim("default", "both", uid, AMD)])[uid]
        assert not nvidia.error and not amd_answer.error
        assert [(list(d.request_names), d.device_name) for d in nvidia.devices] == [(["nv"], "gpu-0")]
        assert [(list(d.request_names), d.device_name) for d in amd_answer.devices] == [(["amd"], amd)]
        assert (sorted(p.name for p in dirs.cdi.iterdir())
                == sorted(f"gpu-labeller-dra_{d}_{uid}.json" for d in (AMD, NVIDIA)))


def test_an_unreadable_checkpoint_is_moved_aside_and_the_claim_prepared_again(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("torn", "gpu-0")
        first = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid]
        record = dirs.plugins / NVIDIA / DIRECTORY / f"{claim.uid}.json"
        record.write_text("{not json")
        assert drakubelet.call_prepare(NVIDIA, [claim])[claim.uid] == first
        assert claim_reads(api) == 2 and record.with_name(record.name + ".bad").read_text() == "{not json"
        assert checkpoint(dirs)[claim.uid]["devices"][0]["device"] == "gpu-0"


def test_a_checkpoint_record_is_the_claim_as_answered(tmp_path: Path) -> None:
    book = Checkpoint(tmp_path, NVIDIA, NODE)
    claim = PreparedClaim("uid-1", "default", "c", (
        PreparedDevice(("gpu",), NODE, "gpu-0", (f"{KIND}=uid-1-gpu-0-0b7c0e8e-0000-4000-8000-00000000000a",),
                       "0b7c0e8e-0000-4000-8000-00000000000a", consumed=(("memory", "4Gi"),)),
        PreparedDevice(("gpu/admin",), NODE, "gpu-1", (f"{KIND}=uid-1-gpu-1",), None, True)))
    book.add(claim)
    assert Checkpoint(tmp_path, NVIDIA, NODE).get("uid-1") == claim  # what a restart reads
    assert Checkpoint(tmp_path, NVIDIA, NODE).claims() == [claim]
    assert Checkpoint(tmp_path, AMD, NODE).get("uid-1") is None  # another driver's directory
    assert (tmp_path / NVIDIA / DIRECTORY / "uid-1.json").stat().st_mode & 0o777 == 0o600
    book.remove("uid-1")
    assert book.get("uid-1") is None and book.claims() == []


def test_a_uid_that_is_not_one_is_refused(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100"):
        bad = Claim("default", "x", "../../etc/passwd", NVIDIA)
        assert "is not a UID" in drakubelet.call_prepare(NVIDIA, [bad])[bad.uid].error
        assert "is not a UID" in drakubelet.call_unprepare(NVIDIA, [bad])[bad.uid].error
