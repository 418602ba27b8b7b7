"""The one process loop every long-running command runs on: when it probes, what wakes it, and
that a stop is never slept through, whatever the loop is doing when it comes."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from labeller.model.config import Config
from labeller.host.machine import Host
from labeller.process.configsource import ConfigSource
from labeller.process import loop as loop_module
from labeller.process.loop import Exit, LoopOptions, ProcessLoop
from labeller.process.serve import readiness
from labeller.base.backoff import Backoff
from tests.builders import stays_true, wait_for


@dataclass
class Recorder:
    """A service that records what the loop asks of it; ``answers`` are its probes' outcomes in turn."""

    answers: list[str | None] = field(default_factory=list)
    on_probe: Callable[[], None] = lambda: None
    probes: int = 0
    works: int = 0
    retries: list[tuple[str, int, float]] = field(default_factory=list)
    recoveries: list[int] = field(default_factory=list)
    began: bool = False

    @property
    def ready(self) -> bool:
        return self.probes > 0

    def begin(self, wake: Callable[[], None], stop: threading.Event) -> None:
        self.began = True

    def probe(self) -> str | None:
        self.probes += 1
        self.on_probe()
        return self.answers.pop(0) if self.answers else None

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        self.retries.append((reason, attempt, delay_s))

    def recovered(self, attempts: int, waited_s: float) -> None:
        self.recoveries.append(attempts)

    def work(self, now: float) -> float:
        self.works += 1
        return math.inf


@contextmanager
def running(loop: ProcessLoop) -> Iterator[list[int]]:
    """``loop.run()`` on a thread; its exit code lands in the list. The loop must end when stopped."""
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(loop.run()), daemon=True)
    thread.start()
    try:
        yield code
    finally:
        loop.stop()
        thread.join(30)
        assert not thread.is_alive(), "the loop did not end after stop()"


def test_it_probes_at_start_and_then_only_when_asked() -> None:
    service = Recorder()
    loop = ProcessLoop(service)
    with running(loop):
        wait_for(lambda: service.probes == 1)
        assert service.began
        loop.request_reload()
        wait_for(lambda: service.probes == 2)
        loop.wake()
        wait_for(lambda: service.works >= 3)
        assert service.probes == 2  # a wake runs the service's work, not a probe


def test_a_stop_during_a_reload_ends_the_loop_at_once() -> None:
    """SIGTERM while the SIGHUP's probe runs: the loop ends when that probe returns, not an interval later."""
    release = threading.Event()
    service = Recorder()
    loop = ProcessLoop(service, LoopOptions(interval_s=3600))
    with running(loop) as code:
        wait_for(lambda: service.probes == 1)
        service.on_probe = lambda: (loop.stop(), release.wait(30))  # type: ignore[func-returns-value]
        loop.request_reload()
        wait_for(lambda: service.probes == 2)
        stopped_at = time.monotonic()
        release.set()
        wait_for(lambda: code == [0], timeout=30)
        # no interval (3600 s) and no heartbeat turn (5 s) was waited
        assert time.monotonic() - stopped_at < 4.0


def test_a_stop_before_the_first_turn_is_not_slept_through() -> None:
    service = Recorder()
    loop = ProcessLoop(service, LoopOptions(interval_s=3600))
    loop.stop()
    assert loop.run() == 0 and service.probes == 0


def test_a_failed_probe_is_retried_with_backoff_capped_by_the_interval() -> None:
    service = Recorder(answers=["no driver", "no driver", "no driver"])
    loop = ProcessLoop(service, LoopOptions(interval_s=3600), retry=Backoff(0.01, 0.04))
    with running(loop):
        wait_for(lambda: service.recoveries == [4])  # three failures, then a probe that works
    assert [(reason, attempt) for reason, attempt, _ in service.retries] == [("no driver", 1), ("no driver", 2),
                                                                           ("no driver", 3)]
    assert all(0.005 <= delay <= 0.04 for _, _, delay in service.retries)
    capped = Recorder(answers=["no driver"])
    loop = ProcessLoop(capped, LoopOptions(interval_s=0.02), retry=Backoff(60, 120))
    with running(loop):
        wait_for(lambda: capped.probes >= 2)
    assert capped.retries[0][2] == 0.02


def test_a_service_can_end_the_process_with_an_exit_code() -> None:
    def fail() -> None:
        raise Exit(1)

    loop = ProcessLoop(Recorder(on_probe=fail))
    assert loop.run() == 1


def test_changed_inputs_probe_again_and_no_inputs_are_not_polled() -> None:
    inputs: list[object] = ["daemon not ready"]
    service = Recorder()
    loop = ProcessLoop(service, LoopOptions(inputs_poll_s=0.01), inputs=lambda: inputs[0])
    with running(loop):
        wait_for(lambda: service.probes == 1)
        inputs[0] = "daemon ready"
        wait_for(lambda: service.probes == 2)
    quiet = Recorder()
    looks: list[int] = []
    loop = ProcessLoop(quiet, LoopOptions(inputs_poll_s=0.01, heartbeat_s=0.05),
                       inputs=lambda: looks.append(1))  # type: ignore[func-returns-value]
    with running(loop):
        wait_for(lambda: quiet.works >= 5)  # five turns, one every heartbeat
    assert len(looks) <= quiet.works + 1  # looked at once per turn at most: None is nothing to poll


def test_a_wake_looks_at_the_inputs_at_once() -> None:
    """A service whose inputs are watched (inotify, driver events) wakes the loop when they change:
    the loop looks at them then, not at its next poll (an hour away here)."""
    inputs: list[object] = ["generation 80"]
    service = Recorder()
    loop = ProcessLoop(service, LoopOptions(inputs_poll_s=3600), inputs=lambda: inputs[0])
    with running(loop):
        wait_for(lambda: service.probes == 1)
        inputs[0] = "generation 81"
        loop.wake()
        wait_for(lambda: service.probes == 2)


def test_inputs_that_need_no_polling_are_looked_at_only_when_woken() -> None:
    inputs: list[object] = ["profile v1"]
    looks: list[int] = []
    polled = [False]

    def read() -> object:
        looks.append(1)
        return inputs[0]

    service = Recorder()
    loop = ProcessLoop(service, LoopOptions(inputs_poll_s=0.01, heartbeat_s=0.05), inputs=read,
                       inputs_polled=lambda: polled[0])
    with running(loop):
        wait_for(lambda: service.works >= 4)  # turns on the heartbeat alone
        assert len(looks) == 1  # before the first probe, never since
        inputs[0] = "profile v2"
        stays_true(lambda: service.probes == 1)
        polled[0] = True  # something now cannot be watched: it is polled again
        wait_for(lambda: service.probes == 2)


def test_a_config_that_fails_to_reload_changes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n")
    from labeller.model.config import load_config
    from vendors import RESOURCE_NAMES

    host = Host(tmp_path, load_config(config, RESOURCE_NAMES))
    service = Recorder()
    loop = ProcessLoop(service, config=ConfigSource(host, config))
    with running(loop):
        wait_for(lambda: service.probes == 1)
        config.write_text("version: v1\nsharing: {timeSlicing: {replicas: 3}}\n")  # no resources: invalid
        loop.request_reload()
        wait_for(lambda: not loop.reload_pending and service.works >= 2)
        assert service.probes == 1 and host.config.sharing.resources[0].replicas == 2
        config.write_text("version: v1\n")
        loop.request_reload()
        wait_for(lambda: service.probes == 2)
        assert host.config == Config()


def test_a_stalled_loop_is_not_healthy() -> None:
    release = threading.Event()
    service = Recorder(on_probe=lambda: release.wait(30) and None)
    loop = ProcessLoop(service, LoopOptions(stall_s=0.2, heartbeat_s=0.05))
    with running(loop):
        wait_for(lambda: service.probes == 1)
        wait_for(lambda: not loop.healthy())  # the probe hangs: no turn for longer than stall_s
        release.set()
        wait_for(loop.healthy)


def test_a_turn_that_runs_long_makes_the_process_not_ready_until_it_ends() -> None:
    # A reload that validated for minutes at 100% CPU left /readyz at 200: readiness now follows the
    # loop's current turn, and comes back as soon as the turn ends.
    release = threading.Event()
    service = Recorder(on_probe=lambda: release.wait(30) and None)
    loop = ProcessLoop(service, LoopOptions(busy_s=0.2, heartbeat_s=0.05))
    ready = readiness(loop, lambda: True)
    assert ready()  # not started yet: nothing stalls
    with running(loop):
        wait_for(lambda: service.probes == 1)
        wait_for(lambda: not ready())  # the probe hangs past busy_s
        assert loop.healthy()  # ...not yet long enough to count as dead (stall_s)
        release.set()
        wait_for(ready)


def test_the_memory_a_probe_freed_is_given_back_once_things_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat after each probe, once: an idle loop asks the C allocator nothing more."""
    released: list[float] = []
    monkeypatch.setattr(loop_module, "release_free_memory", lambda: released.append(time.monotonic()))
    service = Recorder()
    loop = ProcessLoop(service, LoopOptions(heartbeat_s=0.05))
    with running(loop):
        wait_for(lambda: len(released) == 1)
        works = service.works
        wait_for(lambda: service.works >= works + 5)  # five more heartbeats, idle
        assert len(released) == 1 and service.probes == 1
        loop.request_reload()
        wait_for(lambda: service.probes == 2 and len(released) == 2)
