"""One device, one claim: a device prepared for a claim is refused to another unless both
allocations may share it (a ``shareID`` each, as 1.34's consumable capacity allocates a device that
allows multiple allocations); admin access is exempt, as upstream; the devices held are known again
after a restart; two claims prepared at once for one device do not both win; and a claim with no
device of the driver is refused, not recorded."""

from __future__ import annotations

from tests.draplugin.conftest import AMD, NODE, NVIDIA, Dirs, simulated_plugin
from tests.draplugin.test_draplugin_prepare import all_at_once, checkpoint, spec_file
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet


def refusal(claim: Claim, holder: Claim, device: str, more: str = "") -> str:
    return (f"gpu.nvidia.com: claim default/{claim.name}: device {device} is prepared for claim default/{holder.name} "
            f"({holder.uid}){more}, and the allocations do not both allow sharing it")


def test_a_device_prepared_for_one_claim_is_refused_to_another(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                               dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        first, second = run.claim("first", "gpu-0"), run.claim("second", "gpu-1", "gpu-0")
        assert not drakubelet.prepare("pod-a", [first])[first.uid].error
        assert drakubelet.prepare("pod-b", [second])[second.uid].error == refusal(second, first, "gpu-0")
        assert list(checkpoint(dirs)) == [first.uid] and not spec_file(dirs, second).exists()
        assert not drakubelet.prepare("pod-c", [first])[first.uid].error  # the same claim for another pod: fine
        assert not drakubelet.call_prepare(NVIDIA, [first])[first.uid].error  # and asked again: fine
        assert not drakubelet.unprepare("pod-a", [first])  # pod-c still runs
        assert drakubelet.call_prepare(NVIDIA, [second])[second.uid].error == refusal(second, first, "gpu-0")
        assert not drakubelet.unprepare("pod-c", [first])[first.uid].error
        answer = drakubelet.call_prepare(NVIDIA, [second])[second.uid]  # free again
        assert not answer.error and [d.device_name for d in answer.devices] == ["gpu-1", "gpu-0"]


def test_shared_allocations_share_and_admin_access_is_exempt(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                             dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        one, two = run.claim("one", "gpu-2", shared=True), run.claim("two", "gpu-2", shared=True)
        exclusive = run.claim("exclusive", "gpu-2")
        admin = run.claim("admin", "gpu-2", admin=True)
        answers = drakubelet.call_prepare(NVIDIA, [one, two, exclusive, admin])
        assert {c.name: answers[c.uid].error for c in (one, two, admin)} == {"one": "", "two": "", "admin": ""}
        assert answers[exclusive.uid].error == refusal(exclusive, one, "gpu-2", " and 1 other(s)")
        records = checkpoint(dirs)
        assert records[one.uid]["devices"][0]["shareID"] and records[one.uid]["devices"][0]["adminAccess"] is False
        assert records[admin.uid]["devices"][0] == {
            "requests": ["gpu"], "pool": NODE, "device": "gpu-2",
            "cdiDeviceIDs": [f"k8s.gpu-labeller.io/gpu={admin.uid}-gpu-2"], "shareID": None, "adminAccess": True,
            "consumedCapacity": {}}
        # a device only an admin-access claim holds is anyone's
        watcher, worker = run.claim("watcher", "gpu-3", admin=True), run.claim("worker", "gpu-3")
        assert not drakubelet.call_prepare(NVIDIA, [watcher])[watcher.uid].error
        assert not drakubelet.call_prepare(NVIDIA, [worker])[worker.uid].error
        # a shared allocation does not share a device an exclusive claim holds
        late = run.claim("late", "gpu-3", shared=True)
        assert drakubelet.call_prepare(NVIDIA, [late])[late.uid].error == refusal(late, worker, "gpu-3")


def test_the_devices_held_are_known_again_after_a_restart(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                          dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        held, freed = run.claim("held", "gpu-4"), run.claim("freed", "gpu-5")
        assert not any(a.error for a in drakubelet.call_prepare(NVIDIA, [held, freed]).values())
        assert not drakubelet.call_unprepare(NVIDIA, [freed])[freed.uid].error
        rival, taker = run.claim("rival", "gpu-4"), run.claim("taker", "gpu-5")
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100"):
        assert drakubelet.call_prepare(NVIDIA, [rival])[rival.uid].error == refusal(rival, held, "gpu-4")
        assert not drakubelet.call_prepare(NVIDIA, [taker])[taker.uid].error  # what was unprepared is free


def test_of_two_claims_prepared_at_once_for_one_device_one_wins(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        for round_ in range(3):
            device = f"gpu-{round_}"
            claims = [run.claim(f"race-{round_}-{i}", device) for i in range(8)]
            answers = all_at_once(drakubelet, claims)
            winners = [c for c in claims if not answers[c.uid].error]
            assert len(winners) == 1, [answers[c.uid].error for c in claims]
            assert all(answers[c.uid].error == refusal(c, winners[0], device) for c in claims if c != winners[0])
            assert [uid for uid, r in checkpoint(dirs).items() if r["devices"][0]["device"] == device] == [
                winners[0].uid]


def test_a_claim_with_no_device_of_the_driver_is_refused_and_not_recorded(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "mixed-l40s-mi210") as run:
        amd = run.devices(AMD)[0]
        uid = api.create_resource_claim("amd-only", results=[
            {"request": "amd", "driver": AMD, "pool": NODE, "device": amd},
            {"request": "net", "driver": "net.example.com", "pool": "fabric", "device": "nic-0"}])["metadata"]["uid"]
        answer = drakubelet.call_prepare(NVIDIA, [Claim("default", "amd-only", uid, NVIDIA)])[uid]
        assert answer.error == "gpu.nvidia.com: claim default/amd-only: no device of gpu.nvidia.com allocated"
        assert checkpoint(dirs) == {} and list(dirs.cdi.iterdir()) == []
