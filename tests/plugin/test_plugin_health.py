"""Health: the environment switches, recovery after a quiet period, and the NVML checker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from labeller.process.health import HealthBoard, HealthMonitor, checks_enabled
from tests.builders import nvidia_part, offer_of, stays_true, wait_for
from tests.plugin.conftest import simulated
from labeller.model.vendor.plugin import Fault
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
        assert checker.start() and checker.wants_events and checker.watch()
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


def test_a_lost_gpu_is_seen_by_nvmls_unavailable_event(
        mig_checker: tuple[NvmlChecker, HealthBoard, Any, list[str]]) -> None:
    checker, board, nvml, gpus = mig_checker
    reasons: list[str] = []
    board.listeners.append(lambda key, healthy, reason: reasons.append(reason))
    nvml.set_lost(gpus[0], True)  # the GPU falls off the bus: the driver says so through NVML's events
    checker.wait_for_event(100)
    assert board.unhealthy_keys() == {gpus[0]} and reasons == ["GPU unavailable (NVML event)"]
    assert Fault.kind_of(reasons[0]) == (Fault.LOST, None)


def test_while_every_gpu_is_healthy_only_the_events_are_watched(
        mig_checker: tuple[NvmlChecker, HealthBoard, Any, list[str]]) -> None:
    """Idle, the poll asks NVML nothing (it would every second); once a device is Unhealthy it asks
    every GPU, to see that one answer again, or another one gone."""
    checker, board, nvml, gpus = mig_checker
    next(g for g in nvml.state.gpus if g.uuid == gpus[0]).lost = True  # lost, and the driver said nothing
    checker.poll()
    assert board.unhealthy_keys() == frozenset()
    nvml.inject_xid(gpus[1], 48)
    checker.wait_for_event(100)
    checker.poll()
    assert board.unhealthy_keys() == {gpus[0], gpus[1]}


def test_without_xid_events_the_poll_finds_a_lost_gpu() -> None:
    with simulated("dgx-h100") as (inventory, config, _, handles):
        nvml = handles["nvidia"]
        physical = [d.physical for r in offer_of(inventory, config).resources for d in r.devices]
        board = HealthBoard({p.health_key for p in physical}, recovery_seconds=0)
        checker = NvmlChecker(nvml, physical, board, HealthPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "xids"}))
        assert checker.start() and not checker.wants_events and not checker.watches_events
        uuid = nvidia_part(inventory).gpus[3].uuid
        try:
            next(g for g in nvml.state.gpus if g.uuid == uuid).lost = True
            checker.poll()
            assert board.unhealthy_keys() == {uuid}
        finally:
            checker.stop()


def test_a_mig_reconfiguration_is_reported_as_a_hardware_change(
        mig_checker: tuple[NvmlChecker, HealthBoard, Any, list[str]]) -> None:
    checker, board, nvml, gpus = mig_checker
    reasons: list[str] = []
    board.hardware_listeners.append(reasons.append)
    nvml.inject_mig_change(gpus[5])
    checker.wait_for_event(100)
    assert reasons == [f"MIG configuration changed on {gpus[5]}"] and board.hardware_changes == 1
    assert board.unhealthy_keys() == frozenset()


class Checker:
    """A checker that records its polls; ``polling`` and its event wait are the test's to set."""

    def __init__(self, polling: bool = True, events: bool = False) -> None:
        self.polling, self.watches_events = polling, events
        self.polls = 0
        self.stopped = False
        self.release = threading.Event()

    def start(self) -> bool:
        return True

    @property
    def wants_events(self) -> bool:
        return self.watches_events

    def watch(self) -> bool:
        return self.watches_events

    def poll(self) -> None:
        self.polls += 1

    def wait_for_event(self, timeout_ms: int) -> None:
        self.release.wait()  # a driver's wait: nothing interrupts it

    def stop(self) -> None:
        assert not self.stopped, "stopped twice"
        self.stopped = True


def test_a_monitor_with_nothing_to_poll_sleeps_until_nudged() -> None:
    """NVIDIA's devices all Healthy: the events say what goes wrong, and the poll thread sleeps
    (it would wake every second for nothing); a health change wakes it, and it polls while it must."""
    checker = Checker(polling=False)
    monitor = HealthMonitor([checker], poll_seconds=0.01)
    monitor.start()
    try:
        stays_true(lambda: checker.polls == 0)
        checker.polling = True  # a device went Unhealthy: the checker wants to see it recover
        monitor.nudge()
        wait_for(lambda: checker.polls >= 3)
    finally:
        monitor.stop()
    assert checker.stopped


def test_stopping_does_not_wait_for_a_driver_event_wait() -> None:
    """The thread waiting for events stops its checker once its wait returns, never under it."""
    checker = Checker(polling=False, events=True)
    monitor = HealthMonitor([checker])
    monitor.start()
    monitor.stop()
    assert not checker.stopped  # still waiting: freeing the event set now would be freeing it under NVML
    checker.release.set()
    wait_for(lambda: checker.stopped)


def test_hardware_stamps_are_polled_and_a_moved_one_is_said() -> None:
    stamp: list[object] = ["80"]
    said: list[str] = []
    seen: dict[str, object] = {}
    monitor = HealthMonitor([], poll_seconds=0.01, stamps={"amd": lambda: stamp[0]}, seen=seen, changed=said.append)
    monitor.start()
    try:
        wait_for(lambda: said)  # the first read: the caller compares it with what it probed
        wait_for(lambda: seen == {"amd": "80"})
        stays_true(lambda: len(said) == 1)
        stamp[0] = "81"
        wait_for(lambda: len(said) == 2)
        assert said == ["amd: hardware stamp changed"] * 2
    finally:
        monitor.stop()


def test_while_a_device_is_unhealthy_the_monitor_polls_often() -> None:
    """Idle, once a second (an hour here); a device Unhealthy is seen answering again soon after
    its quiet period, not up to a poll later."""
    unhealthy = [False]
    checker = Checker(polling=True)
    monitor = HealthMonitor([checker], poll_seconds=3600, recovering=lambda: unhealthy[0])
    monitor.start()
    try:
        unhealthy[0] = True
        monitor.nudge()  # what a health change does
        wait_for(lambda: checker.polls >= 3)
    finally:
        monitor.stop()


def test_nvml_makes_no_event_set_while_a_thread_waits_on_one() -> None:
    """What a real H200's NVML does (driver 580.159.04, tests/fixtures/nvidia/h200-passthrough/
    lock.txt), and so the simulated one: nvmlEventSetCreate returns only once another thread's
    nvmlEventSetWait has."""
    with simulated("dgx-h100") as (inventory, _, _, handles):
        nvml = handles["nvidia"]
        nvml.nvmlInit()
        gpu = nvidia_part(inventory).gpus[0].uuid
        waiting = nvml.nvmlEventSetCreate()
        nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByUUID(gpu), nvml.nvmlEventTypeXidCriticalError,
                                      waiting)
        events: list[Any] = []
        waiter = threading.Thread(target=lambda: events.append(nvml.nvmlEventSetWait(waiting, 60_000)))
        waiter.start()
        wait_for(lambda: nvml.state.event_waits == 1)
        made: list[Any] = []
        creator = threading.Thread(target=lambda: made.append(nvml.nvmlEventSetCreate()))
        creator.start()
        stays_true(lambda: not made)
        nvml.inject_xid(gpu, 48)
        waiter.join(10)
        creator.join(10)
        assert [int(e.eventData) for e in events] == [48] and len(made) == 1
        for event_set in (waiting, *made):
            nvml.nvmlEventSetFree(event_set)
        nvml.nvmlShutdown()


def test_a_new_monitor_starts_while_the_one_it_replaces_still_waits_for_events() -> None:
    """A config switch replaces the health monitor while the old one's thread sits in NVML's event
    wait (5 s at a time). Starting the new one does not wait for it (on a real H200 a switch to DRA
    took 3.4-4.4 s to reach the slices, 32 ms without this); until the new checker has registered,
    it polls, and an XID in between is the old set's to report; then the new set sees the next."""
    with simulated("dgx-h100") as (inventory, config, _, handles):
        nvml = handles["nvidia"]
        physical = [d.physical for r in offer_of(inventory, config).resources for d in r.devices]
        board = HealthBoard({p.health_key for p in physical}, recovery_seconds=0)
        gpus = [g.uuid for g in nvidia_part(inventory).gpus]
        old = HealthMonitor([NvmlChecker(nvml, physical, board, HealthPolicy())], poll_seconds=0.05,
                            event_wait_ms=60_000)
        old.start()
        wait_for(lambda: nvml.state.event_waits == 1)
        old.stop()
        checker = NvmlChecker(nvml, physical, board, HealthPolicy())
        new = HealthMonitor([checker], poll_seconds=0.05, event_wait_ms=60_000)
        started = threading.Thread(target=new.start)
        started.start()
        started.join(10)
        try:
            assert not started.is_alive() and not checker.watches_events and checker.polling
            next(g for g in nvml.state.gpus if g.uuid == gpus[2]).lost = True  # no event: the poll sees it
            wait_for(lambda: not board.healthy(gpus[2]))
            nvml.inject_xid(gpus[0], 48)  # ends the old wait: the old set reports it, the new one registers
            wait_for(lambda: not board.healthy(gpus[0]) and checker.watches_events)
            nvml.inject_xid(gpus[1], 48)
            wait_for(lambda: not board.healthy(gpus[1]))
        finally:
            new.stop()
            nvml.inject_xid(gpus[3], 48)  # ends the new monitor's wait, so that it frees its set
