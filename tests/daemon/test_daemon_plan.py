"""The daemon's pure decisions: no I/O, no threads."""

from __future__ import annotations

import random

from labeller.reconcile import Backoff, FightDetector, ProbeResult, desired_after, owned, plan
from labeller.sinks import NodeCache

LIVE = {"team": "ml", "nvidia.com/gpu.deploy.gfd": "true", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"}


def test_owned_keeps_only_our_prefixes() -> None:
    assert owned(LIVE) == {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"}


def test_no_change_when_live_equals_desired() -> None:
    change = plan(LIVE, {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"}, probe_ok=True)
    assert not change.needed


def test_change_lists_added_changed_removed_and_applies_only_owned_keys() -> None:
    change = plan(LIVE, {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.product": "A100", "team": "x"}, probe_ok=True)
    assert change.added == {"nvidia.com/gpu.product": "A100"}
    assert change.changed == {"nvidia.com/gpu.count": ("8", "4")}
    assert change.removed == ("nvidia.com/gpu.present",)
    assert change.labels == {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.product": "A100"}


def test_an_incomplete_probe_never_removes() -> None:
    change = plan(LIVE, {"nvidia.com/gpu.product": "A100"}, probe_ok=False)
    assert change.removed == () and change.added == {"nvidia.com/gpu.product": "A100"}
    assert change.labels == {**owned(LIVE), "nvidia.com/gpu.product": "A100"}
    assert not plan(LIVE, {}, probe_ok=False).needed


def test_no_gpus_means_an_empty_owned_set() -> None:
    change = plan(LIVE, {}, probe_ok=True)
    assert change.labels == {} and set(change.removed) == set(owned(LIVE))


def test_desired_after_each_kind_of_probe() -> None:
    good = {"nvidia.com/gpu.count": "8"}
    assert desired_after(ProbeResult({"nvidia.com/gpu.count": "4", "team": "x"}), good) == {"nvidia.com/gpu.count": "4"}
    partial = ProbeResult({"nvidia.com/gpu.count": "7", "nvidia.com/gpu.clique": "c"}, partial=True)
    assert desired_after(partial, good) == {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.clique": "c"}
    assert desired_after(ProbeResult({}, error="boom"), good) == good
    assert desired_after(ProbeResult({}, error="boom"), None) == {}


def test_fight_detector_holds_off_exponentially_and_forgets_quiet_keys() -> None:
    fights = FightDetector(threshold=3, window_s=10, base_hold_s=2, max_hold_s=16)
    assert [fights.record({"k"}, t) for t in (0, 1, 2)] == [[], [], []]
    assert fights.record({"k"}, 3) == ["k"] and fights.hold_until == 5
    assert fights.record({"k"}, 5) == ["k"] and fights.hold_until == 9
    assert fights.record({"k"}, 9) == ["k"] and fights.hold_until == 17
    assert fights.record({"k"}, 17) == ["k"] and fights.hold_until == 33  # capped at 16 s
    assert fights.record({"k"}, 100) == []  # quiet for long: not a fight any more
    assert fights.level == 0


def test_backoff_is_capped_and_jittered() -> None:
    backoff = Backoff(0.2, 5.0, random.Random(1))
    delays = [backoff.next() for _ in range(12)]
    assert all(0.1 <= d <= 5.0 for d in delays) and max(delays[-4:]) > 1.0
    backoff.reset()
    assert backoff.next() <= 0.2


def test_node_cache_ignores_older_resource_versions() -> None:
    cache = NodeCache()
    assert cache.put({"metadata": {"resourceVersion": "10", "labels": {"a": "1"}}})
    assert not cache.put({"metadata": {"resourceVersion": "9", "labels": {"a": "0"}}})
    assert not cache.put({"metadata": {"resourceVersion": "11", "labels": {"a": "1"}}})
    assert cache.snapshot() == (True, True, {"a": "1"})
    assert cache.put(None) and cache.snapshot() == (True, False, {})
