"""The one runner of the long-running processes on a node (``labeller.process.serve``): a signal that
comes while a process starts, its exit code and its "stopped" line, ``--once``, what it holds closed
in order, its node on the log, and signals left as they were when a start is refused."""

from __future__ import annotations

import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest
import structlog
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from labeller.base.errors import InputError
from labeller.host.machine import Host, NodeOptions
from labeller.process.follow import ConfigFollower
from labeller.process.loop import Exit
from labeller.process.serve import Endpoint, Process, Served, serve
from labeller.process.signals import run_until_signalled, signals_deferred
from tests.core.cli import error_line, in_process


class Idle:
    """A service with nothing to do; ``exit_code``: its first probe ends the process with it."""

    def __init__(self, exit_code: int | None = None) -> None:
        self.exit_code = exit_code

    @property
    def ready(self) -> bool:
        return True

    def begin(self, wake: Callable[[], None], stop: threading.Event) -> None:
        return None

    def probe(self) -> str | None:
        if self.exit_code is not None:
            raise Exit(self.exit_code)
        return None

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        return None

    def recovered(self, attempts: int, waited_s: float) -> None:
        return None

    def work(self, now: float) -> float:
        return math.inf


@pytest.fixture
def handler() -> Iterator[list[int]]:
    """SIGTERM and SIGHUP recorded (not fatal) for the test: what a process had before it served."""
    got: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    before = {signum: signal.signal(signum, record) for signum in (signal.SIGTERM, signal.SIGHUP)}
    yield got
    for signum, previous in before.items():
        signal.signal(signum, previous)


def process(tmp_path: Path, service: Callable[[Host, ConfigFollower | None], Iterator[Served]],
            node_name: str | None = "node-1") -> Process:
    return Process(NodeOptions(host_root=tmp_path, node_name=node_name), Endpoint(0, "127.0.0.1"),
                   CollectorRegistry(), "test", contextmanager(service))


def test_a_sigterm_while_the_process_starts_is_a_clean_stop_once_it_serves(tmp_path: Path,
                                                                           handler: list[int]) -> None:
    """The kubelet may stop a pod the moment it started it: the stop waits for the process to serve,
    then ends it as any stop does (exit 0, the "stopped" line); what follows the cluster beside the
    loop is stopped before the service is closed."""
    steps: list[str] = []
    follows: list[threading.Event] = []

    def service(host: Host, follower: ConfigFollower | None) -> Iterator[Served]:
        os.kill(os.getpid(), signal.SIGTERM)  # while it starts
        steps.append(f"built with node={structlog.contextvars.get_contextvars().get('node')}")
        try:
            yield Served(Idle(), follow=follows.append)
        finally:
            steps.append(f"closed after the follow stopped: {follows[0].is_set()}")

    with capture_logs() as logs:
        assert serve(process(tmp_path, service)) == 0
    assert steps == ["built with node=node-1", "closed after the follow stopped: True"]
    assert [(e["event"], e.get("signal")) for e in logs if e["event"] in ("signal received", "stopped")] == [
        ("signal received", "SIGTERM"), ("stopped", None)]
    assert "node" not in structlog.contextvars.get_contextvars()
    assert handler == []  # the process took it; and put the handler it found back:
    os.kill(os.getpid(), signal.SIGTERM)
    assert handler == [signal.SIGTERM]


def test_the_services_exit_code_is_the_processes_and_no_stopped_line(tmp_path: Path, handler: list[int]) -> None:
    """``flags.failOnInitError``: the service ends the process with exit code 1; it did not stop."""

    def service(host: Host, follower: ConfigFollower | None) -> Iterator[Served]:
        yield Served(Idle(exit_code=1))

    with capture_logs() as logs:
        assert serve(process(tmp_path, service)) == 1
    assert "stopped" not in [e["event"] for e in logs] and "started" in [e["event"] for e in logs]


def test_once_runs_instead_of_serving_and_a_signal_kept_meanwhile_is_delivered_first(
        tmp_path: Path, handler: list[int]) -> None:
    """``run --once`` is known only once the config is read: a SIGTERM kept until then reaches the
    process's own handler before the one reconcile (without a handler of its own: it ends it, as
    before), and nothing is served or logged as stopped."""
    seen_by_once: list[list[int]] = []

    def once() -> int:
        seen_by_once.append(list(handler))
        return 3

    def service(host: Host, follower: ConfigFollower | None) -> Iterator[Served]:
        os.kill(os.getpid(), signal.SIGTERM)
        yield Served(Idle(), once=once)

    with capture_logs() as logs:
        assert serve(process(tmp_path, service)) == 3
    assert seen_by_once == [[signal.SIGTERM]]
    assert [e["event"] for e in logs if e["event"] in ("started", "stopped")] == []


def test_a_refused_start_leaves_the_signals_as_they_were(tmp_path: Path, handler: list[int]) -> None:
    """A config that does not load is one line and exit 2; a test or a caller in the same process
    must not find SIGTERM kept for a server that never came."""
    (tmp_path / "config.yaml").write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    options = NodeOptions(host_root=tmp_path, config_path=tmp_path / "config.yaml")

    def service(host: Host, follower: ConfigFollower | None) -> Iterator[Served]:
        raise AssertionError("never built: the config does not load")
        yield Served(Idle())

    with pytest.raises(InputError, match="migStrategy"):
        serve(Process(options, Endpoint(0, "127.0.0.1"), CollectorRegistry(), "test", contextmanager(service)))
    os.kill(os.getpid(), signal.SIGTERM)
    assert handler == [signal.SIGTERM]


@pytest.mark.parametrize("args", [
    ["device-plugin", "--kubelet-socket", "/elsewhere/kubelet.sock", "--socket-dir", "/tmp"],
    ["dra-plugin", "--mps-root", "relative"],
    ["scheduler-extender", "--tls-cert-file", "cert.pem"],
], ids=["device-plugin", "dra-plugin", "scheduler-extender"])
def test_a_command_refused_before_it_serves_leaves_the_signals_as_they_were(
        args: list[str], handler: list[int]) -> None:
    """The servers kept SIGTERM and SIGHUP from their first line, and a bad flag left them kept."""
    result = in_process(*args)
    assert result.returncode == 2 and error_line(result)
    os.kill(os.getpid(), signal.SIGHUP)
    assert handler == [signal.SIGHUP]


def test_run_until_signalled_takes_a_sighup_kept_while_starting(handler: list[int]) -> None:
    """The deferred SIGHUP reaches ``reload`` once the work runs; then SIGTERM stops it."""
    reloaded, stopped = threading.Event(), threading.Event()

    def work() -> int:
        stopped.wait()
        return 0

    def reload() -> None:
        reloaded.set()
        os.kill(os.getpid(), signal.SIGTERM)

    with signals_deferred():
        os.kill(os.getpid(), signal.SIGHUP)
        assert run_until_signalled(work, stopped.set, reload) == 0
    assert reloaded.is_set() and handler == []


def test_a_server_out_of_descriptors_once_started_still_takes_its_signals(handler: list[int],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections that flood a server as it comes up can take every descriptor before it serves: the
    pipe signals reach the main thread through was made when it started (a CI run saw the extender
    die of EMFILE making it)."""
    stopped = threading.Event()

    def work() -> int:
        stopped.wait()
        return 0

    def out_of_descriptors() -> tuple[int, int]:
        raise OSError(24, "Too many open files")

    with signals_deferred():
        monkeypatch.setattr(os, "pipe", out_of_descriptors)  # what a flood leaves after start-up
        os.kill(os.getpid(), signal.SIGTERM)  # kept while starting, delivered once it serves
        assert run_until_signalled(work, stopped.set, lambda: None) == 0
    assert stopped.is_set() and handler == []
