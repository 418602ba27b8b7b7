"""Health: the environment switches, recovery after a quiet period, and the NVML checker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from labeller.process.health import HealthBoard, checks_enabled
from tests.builders import nvidia_part, offer_of
from tests.plugin.conftest import simulated
from vendors.nvidia.health import APPLICATION_XIDS, HealthPolicy, NvmlChecker


@pytest.mark.parametrize(("env", "critical", "ignored", "checks"), [
    ({}, [79, 94, 48], sorted(APPLICATION_XIDS), True),
    ({"DP_DISABLE_HEALTHCHECKS": "48, 94"}, [79], [48, 94, 13], True),
    ({"DP_DISABLE_HEALTHCHECKS": "xids"}, [], [79, 48], True),
    ({"DP_DISABLE_HEALTHCHECKS": "all"}, [], [79], False),
    ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}, [79], [48, 13], True),
    ({"DP_ENABLE_HEALTHCHECKS": "13,31"}, [13, 31, 79], [43], True),
])
def test_policy_from_env(env: dict[str, str], critical: list[int], ignored: list[int], checks: bool) -> None:
    policy = HealthPolicy.from_env(env)
    assert checks_enabled(env) is checks
    assert all(policy.xid_is_critical(x) for x in critical)
    assert not any(policy.xid_is_critical(x) for x in ignored)


def test_disable_all_xids_still_watches_lost_gpus() -> None:
    env = {"DP_DISABLE_HEALTHCHECKS": "xids"}
    assert checks_enabled(env) and not HealthPolicy.from_env(env).watch_xids


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_recovery_needs_a_quiet_period() -> None:
    clock = Clock()
    board = HealthBoard(["a", "b"], recovery_seconds=10, clock=clock)
    changes: list[tuple[str, bool]] = []
    board.listeners.append(lambda key, healthy, reason: changes.append((key, healthy)))
    board.mark_unhealthy(["a", "unknown"], "XID 79")
    assert not board.healthy("a") and board.healthy("b") and board.generation == 1
    clock.now += 6
    board.mark_unhealthy(["a"], "XID 79 again")  # refreshes the quiet period, no new change
    assert board.generation == 1
    clock.now += 9
    board.answering(["a"])
    assert not board.healthy("a")
    clock.now += 1
    board.answering(["a", "b"])
    assert board.healthy("a") and board.generation == 2
    assert changes == [("a", False), ("a", True)]


def test_recovery_zero_means_never() -> None:
    clock = Clock()
    board = HealthBoard(["a"], recovery_seconds=0, clock=clock)
    board.mark_unhealthy(["a"], "XID 79")
    clock.now += 1e6
    board.answering(["a"])
    assert not board.healthy("a")


@pytest.fixture
def mig_checker() -> Iterator[tuple[NvmlChecker, HealthBoard, Any, list[str]]]:
    with simulated("dgx-a100-mig-mixed") as (inventory, config, _, handles):
        nvml = handles["nvidia"]
        physical = {d.physical.health_key: d.physical for r in offer_of(inventory, config).resources
                    for d in r.devices}
        board = HealthBoard(physical, recovery_seconds=0)
        checker = NvmlChecker(nvml, physical.values(), board, HealthPolicy())
        assert checker.start()
        gpus = [g.uuid for g in nvidia_part(inventory).gpus]
        yield checker, board, nvml, gpus
        checker.stop()


def test_application_xids_are_ignored(mig_checker: tuple[NvmlChecker, HealthBoard, Any, list[str]]) -> None:
    checker, board, nvml, gpus = mig_checker
    for xid in sorted(APPLICATION_XIDS):
        nvml.inject_xid(gpus[0], xid)
        checker.wait_for_event(100)
    assert board.unhealthy_keys() == frozenset()
    nvml.inject_xid(gpus[0], 79)
    checker.wait_for_event(100)
    assert board.unhealthy_keys() == {gpus[0]}


def test_mig_event_marks_only_its_instance(mig_checker: tuple[NvmlChecker, HealthBoard, Any, list[str]]) -> None:
    checker, board, nvml, _ = mig_checker
    mig_gpu = next(g for g in nvml.state.gpus if g.migs)
    nvml.inject_xid(mig_gpu.migs[1].uuid, 94)
    checker.wait_for_event(100)
    assert board.unhealthy_keys() == {mig_gpu.migs[1].uuid}
    nvml.inject_xid(mig_gpu.uuid, 79)  # whole GPU: every MIG device on it
    checker.wait_for_event(100)
    assert board.unhealthy_keys() == {m.uuid for m in mig_gpu.migs}


def test_lost_gpu_found_by_polling(mig_checker: tuple[NvmlChecker, HealthBoard, Any, list[str]]) -> None:
    checker, board, nvml, gpus = mig_checker
    nvml.set_lost(gpus[0], True)
    checker.poll()
    assert board.unhealthy_keys() == {gpus[0]}
