"""The daemon's pure decisions: no I/O, no threads."""

from __future__ import annotations

import random
from typing import Any

import pytest

from labeller.model import labels
from labeller.model.labels import FIELD_MANAGER, owns
from labeller.apps.daemon.reconcile import FightGuard, Live, ProbeResult, desired_after, label_managers, owned, plan
from labeller.base.backoff import Backoff
from labeller.cluster.nodes import NodeCache

LIVE = {"team": "ml", "nvidia.com/gpu.deploy.gfd": "true", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.present": "true"}
US = (FIELD_MANAGER, "Apply")


def entry(manager: str, operation: str, *keys: str, subresource: str | None = None) -> dict[str, Any]:
    """A managedFields entry in the shape a real API server returns."""
    fields: dict[str, Any] = {".": {}, **{f"f:{key}": {} for key in keys}}
    found: dict[str, Any] = {"manager": manager, "operation": operation, "apiVersion": "v1",
                             "time": "2026-11-23T10:00:00Z", "fieldsType": "FieldsV1",
                             "fieldsV1": {"f:metadata": {"f:labels": fields}}}
    if subresource:
        found["subresource"] = subresource
    return found


def node(labels_: dict[str, str], *entries: dict[str, Any], rv: str = "7") -> dict[str, Any]:
    return {"metadata": {"name": "n", "resourceVersion": rv, "labels": labels_, "managedFields": list(entries)}}


def ours_only(labels_: dict[str, str]) -> Live:
    return Live.of_node(node(labels_, entry(FIELD_MANAGER, "Apply", *labels_)))


def test_owned_keeps_only_our_prefixes() -> None:
    assert owned(LIVE) == {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"}


@pytest.mark.parametrize("key", ["nvidia.com/vgpu.config", "nvidia.com/vgpu.config.state", "nvidia.com/mig.config",
                                 "nvidia.com/mig.config.state", "nvidia.com/gpu.deploy.driver",
                                 "nvidia.com/gpu.workload.config", "nvidia.com/device-plugin.config"])
def test_gpu_operator_keys_are_never_ours(key: str) -> None:
    assert not owns(key)


def test_only_the_exact_device_plugin_config_key_is_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu-labeller writes nvidia.com/device-plugin.config.state: only the GPU Operator's exact key is refused,
    even under a prefix that would cover it."""
    assert owns("nvidia.com/device-plugin.config.state") and owns("nvidia.com/device-plugin.config.applied")
    monkeypatch.setattr(labels, "OWNED_PREFIXES", (*labels.OWNED_PREFIXES, "nvidia.com/device-plugin."))
    assert not owns("nvidia.com/device-plugin.config")
    assert owns("nvidia.com/vgpu.present") and owns("nvidia.com/gpu.imex-domain")


def test_label_managers_reads_real_managed_fields_and_skips_subresources() -> None:
    fields = [entry(FIELD_MANAGER, "Apply", "nvidia.com/gpu.count"),
              entry("kubectl-label", "Update", "nvidia.com/gpu.count", "team"),
              entry("kubelet", "Update", "nvidia.com/gpu.count", subresource="status"), {"manager": "broken"}, "junk"]
    assert label_managers(fields) == {"nvidia.com/gpu.count": {US, ("kubectl-label", "Update")},
                                      "team": {("kubectl-label", "Update")}}


def test_no_change_when_everything_is_ours_and_right() -> None:
    change = plan(ours_only(owned(LIVE)),
                  {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"}, probe_ok=True)
    assert not change.needed and change.foreign == {}


def test_change_lists_added_changed_removed_and_applies_only_owned_keys() -> None:
    # the probe's labels reach plan only through owned(): "team" never gets there
    change = plan(ours_only(owned(LIVE)),
                  owned({"nvidia.com/gpu.count": "4", "nvidia.com/gpu.product": "A100", "team": "x"}),
                  probe_ok=True)
    assert change.added == {"nvidia.com/gpu.product": "A100"}
    assert change.changed == {"nvidia.com/gpu.count": ("8", "4")}
    assert change.removed == ("nvidia.com/gpu.present",) and change.patch_out == {}
    assert change.labels == {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.product": "A100"} and change.apply


def test_a_computed_key_someone_else_set_is_adopted_even_with_the_same_value() -> None:
    live = Live.of_node(node({"nvidia.com/gpu.count": "8"}, entry("kubectl-label", "Update", "nvidia.com/gpu.count")))
    change = plan(live, {"nvidia.com/gpu.count": "8"}, probe_ok=True)
    assert change.apply and change.adopted == {"nvidia.com/gpu.count": ("kubectl-label",)}
    assert change.added == {} and change.changed == {}


def test_foreign_keys_under_our_prefixes_are_left_and_reported() -> None:
    live = Live.of_node(node({"nvidia.com/gpu.imex-domain": "x", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.x": "y",
                              "nvidia.com/vgpu.config": "A100-4C"},
                             entry(FIELD_MANAGER, "Apply", "nvidia.com/gpu.count"),
                             entry("admin", "Update", "nvidia.com/gpu.imex-domain", "nvidia.com/vgpu.config")))
    change = plan(live, {}, probe_ok=True)
    assert change.removed == ("nvidia.com/gpu.count",) and change.apply
    assert change.foreign == {"nvidia.com/gpu.imex-domain": ("admin",), "nvidia.com/gpu.x": ()}  # no recorded manager
    assert "nvidia.com/vgpu.config" not in live.labels  # the GPU Operator's: not even under our prefixes


def test_include_foreign_removes_other_managers_keys_with_a_merge_patch() -> None:
    live = Live.of_node(node({"nvidia.com/gpu.imex-domain": "x"},
                             entry("admin", "Update", "nvidia.com/gpu.imex-domain")))
    change = plan(live, {}, probe_ok=True, include_foreign=True)
    assert change.removed == ("nvidia.com/gpu.imex-domain",) and change.foreign == {}
    assert change.patch_out == {"nvidia.com/gpu.imex-domain": ("admin",)} and not change.apply


def test_a_co_owned_key_is_only_relinquished() -> None:
    live = Live.of_node(node({"nvidia.com/gpu.count": "8"}, entry(FIELD_MANAGER, "Apply", "nvidia.com/gpu.count"),
                             entry("gfd", "Apply", "nvidia.com/gpu.count")))
    change = plan(live, {}, probe_ok=True)
    assert change.relinquished == ("nvidia.com/gpu.count",) and change.removed == () and change.apply


def test_keys_only_an_older_gpu_labeller_merge_patched_are_patched_out() -> None:
    """SSA cannot drop what an update set, so a key owned only by our own Update entry needs a merge patch."""
    live = Live.of_node(node({"nvidia.com/gpu.count": "8", "nvidia.com/gpu.family": "hopper"},
                             entry(FIELD_MANAGER, "Update", "nvidia.com/gpu.count", "nvidia.com/gpu.family"),
                             entry(FIELD_MANAGER, "Apply", "nvidia.com/gpu.family")))
    change = plan(live, {}, probe_ok=True)
    assert change.removed == ("nvidia.com/gpu.count", "nvidia.com/gpu.family")
    assert set(change.patch_out) == {"nvidia.com/gpu.count", "nvidia.com/gpu.family"}
    assert change.apply  # the apply drops gpu.family from our Apply entry first
    only_update = Live.of_node(node({"nvidia.com/gpu.count": "8"},
                                    entry(FIELD_MANAGER, "Update", "nvidia.com/gpu.count")))
    assert not plan(only_update, {}, probe_ok=True).apply


def test_an_incomplete_probe_never_removes() -> None:
    live = ours_only(owned(LIVE))
    change = plan(live, {"nvidia.com/gpu.product": "A100"}, probe_ok=False)
    assert change.removed == () and change.added == {"nvidia.com/gpu.product": "A100"}
    assert change.labels == {**owned(LIVE), "nvidia.com/gpu.product": "A100"}
    assert not plan(live, {}, probe_ok=False).needed


def test_no_gpus_means_an_empty_owned_set() -> None:
    change = plan(ours_only(owned(LIVE)), {}, probe_ok=True)
    assert change.labels == {} and set(change.removed) == set(owned(LIVE))


def test_desired_after_each_kind_of_probe() -> None:
    good = {"nvidia.com/gpu.count": "8"}
    assert desired_after(ProbeResult(owned({"nvidia.com/gpu.count": "4", "team": "x"})), good) == {
        "nvidia.com/gpu.count": "4"}
    partial = ProbeResult({"nvidia.com/gpu.count": "7", "nvidia.com/gpu.clique": "c"}, partial=True)
    assert desired_after(partial, good) == {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.clique": "c"}
    assert desired_after(ProbeResult({}, error="boom"), good) == good
    assert desired_after(ProbeResult({}, error="boom"), None) == {}


def test_backoff_retries_within_a_second_for_a_minute_then_grows_to_its_cap() -> None:
    backoff = Backoff(base_s=0.2, cap_s=10.0, quick_cap_s=1.0, quick_for_s=60.0, rng=random.Random(1))
    quick = [backoff.next(now=t) for t in range(60)]
    assert all(0.1 <= d <= 1.0 for d in quick) and quick[0] <= 0.2
    slow = [backoff.next(now=60 + t) for t in range(40)]
    assert all(0.1 <= d <= 10.0 for d in slow) and max(slow[-10:]) > 2.0
    backoff.reset()
    assert backoff.next(now=500) <= 0.2


def test_plain_backoff_is_capped_and_jittered() -> None:
    backoff = Backoff(0.2, 5.0, rng=random.Random(1))
    delays = [backoff.next() for _ in range(12)]
    assert all(0.1 <= d <= 5.0 for d in delays) and max(delays[-4:]) > 1.0


def test_fight_guard_lets_repairs_through_until_the_bucket_is_empty() -> None:
    guard = FightGuard(burst=3, base_s=0.5, share=0.04)
    guard.wrote({"k"}, now=0.0)  # the first apply
    for t in (1.0, 1.1, 1.2):
        assert not guard.lost("k", t) or t == 1.2  # the third loss in a row is reported as a fight
        assert guard.wait_s("k", t) == 0.0
        guard.wrote({"k"}, t)
    guard.lost("k", 1.3)
    # 3 tokens, 3 spent, 0.6 back by 1.3 s (one every 0.5 s): the next in 0.2 s
    assert guard.wait_s("k", 1.3) == pytest.approx(0.2, abs=0.01)


def test_fight_guard_counts_no_loss_without_a_successful_write() -> None:
    """Failed writes (403, timeouts, etcd down) are no fight: only a successful write can be undone."""
    guard = FightGuard(burst=1, base_s=10.0)
    guard.wrote({"k"}, now=0.0)
    assert not guard.lost("k", 1.0)
    for t in range(2, 100):  # retries that fail: lost() is called again, wrote() never
        guard.lost("k", float(t))
        assert guard.wait_s("k", float(t)) == 0.0
    assert guard.streaks["k"].losses == 1


def test_fight_guard_forgets_a_key_that_stayed_ours() -> None:
    guard = FightGuard(burst=1, base_s=1.0, share=0.5, peace_s=30.0)
    guard.wrote({"k"}, 0.0)
    for t in range(1, 20):
        guard.lost("k", float(t))
        guard.wrote({"k"}, float(t))
    assert guard.interval_s("k") > 5.0
    guard.lost("k", 60.0)  # our value stood for 41 s: a new disturbance, not the same fight
    assert guard.interval_s("k") == 1.0 and guard.wait_s("k", 60.0) == 0.0


def test_an_outage_between_two_losses_adds_little_to_the_pace() -> None:
    guard = FightGuard(burst=3, base_s=0.5, share=0.04, peace_s=30.0)
    guard.wrote({"k"}, 0.0)
    guard.lost("k", 1.0)  # deleted; our writes then fail for 20 s (no wrote())
    guard.wrote({"k"}, 21.0)
    guard.lost("k", 22.0)  # deleted again a second later: the same streak, but 21 s were no fight
    assert guard.interval_s("k") == 0.5 and guard.wait_s("k", 22.0) == 0.0


def simulate(guard: FightGuard, other_writes_at: Any, until: float, step: float = 0.001) -> list[float]:
    """Our writes of one key against another writer, in simulated time. ``other_writes_at(t, ours_at)``
    says whether the other writer undoes our value at t. Returns the times of our writes."""
    t, ours, writes = 0.0, True, [0.0]
    guard.wrote({"k"}, 0.0)
    while t < until:
        t = round(t + step, 6)
        if ours and other_writes_at(t, writes[-1]):
            ours = False
            guard.lost("k", t)
        if not ours and guard.wait_s("k", t) == 0.0:
            ours = True
            writes.append(t)
            guard.wrote({"k"}, t)
    return writes


def test_against_an_instant_reverter_the_write_rate_is_bounded_and_falls_off() -> None:
    writes = simulate(FightGuard(), lambda t, last: t - last >= 0.005, until=600.0, step=0.005)
    per_minute = [sum(1 for w in writes if m * 60 <= w < (m + 1) * 60) for m in range(10)]
    assert per_minute[0] <= 100 and sum(per_minute) <= 150  # an unpaced repair would write 12,000 times a minute
    assert per_minute[0] > per_minute[1] > per_minute[4] >= per_minute[9] and per_minute[9] <= 3


def test_after_a_kubectl_loop_stops_our_value_is_back_within_half_a_second() -> None:
    """A person's loop overwrites the key every 0.2 s for 10 s, whatever we do; then it stops."""
    writes = simulate(FightGuard(), lambda t, last: t <= 10.0 and round(t * 1000) % 200 == 0, until=30.0)
    last_other = 10.0
    assert 0 < writes[-1] - last_other <= 0.5
    assert len(writes) <= 30  # not one write per overwrite (50 of them)


def test_node_cache_ignores_older_resource_versions_and_other_labels() -> None:
    cache = NodeCache(Live.of_node)
    assert cache.put(node({"nvidia.com/gpu.count": "1"}, rv="10"))
    assert not cache.put(node({"nvidia.com/gpu.count": "0"}, rv="9"))
    assert not cache.put(node({"nvidia.com/gpu.count": "1", "team": "x"}, rv="11"))  # not ours to watch
    assert cache.put(node({"nvidia.com/gpu.count": "1"},
                          entry("kubectl-label", "Update", "nvidia.com/gpu.count"), rv="12"))
    synced, exists, live = cache.snapshot()
    assert (synced, exists, live.labels, live.names("nvidia.com/gpu.count")) == (
        True, True, {"nvidia.com/gpu.count": "1"}, ("kubectl-label",))
    assert cache.put(None) and cache.snapshot()[1] is False


def test_a_write_answer_older_than_the_nodes_deletion_does_not_bring_it_back() -> None:
    """The watch's DELETED (resourceVersion 103) can arrive while our write, answered at 102, is on its
    way back: the answer is older news, and the node stays gone (the daemon says "node not found")."""
    cache = NodeCache(Live.of_node)
    assert cache.put(node({"nvidia.com/gpu.count": "1"}, rv="101"))
    assert cache.put(None, gone_at=103)  # the watch: DELETED at 103
    assert not cache.put(node({"nvidia.com/gpu.count": "1"}, rv="102"))  # the write's answer, late
    assert cache.snapshot()[:2] == (True, False)
    assert cache.put(node({}, rv="104"))  # created again: newer than the deletion
    assert cache.snapshot()[:2] == (True, True)


def test_a_list_without_the_node_is_as_new_as_the_lists_resource_version() -> None:
    cache = NodeCache(Live.of_node)
    assert cache.put(None, gone_at=50)  # listed, absent, at 50
    assert not cache.put(node({"nvidia.com/gpu.count": "1"}, rv="49"))
    assert cache.snapshot()[:2] == (True, False)
