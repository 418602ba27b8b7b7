"""The health and metrics server every process runs costs nothing while no one asks: its thread
sleeps until a connection comes (an idle DRA plugin's budget is 0.1 % of a core), and it still
answers, and stops, at once."""

from __future__ import annotations

import platform
import threading
import urllib.request
from pathlib import Path

from labeller.process.httpserver import start_http_server
from tests.builders import stays_true, wait_for


# epoll_wait and epoll_pwait by machine: the selector's wait (its timeout is their fourth argument)
EPOLL_WAITS = {"x86_64": {"232", "281"}, "aarch64": {"22"}}[platform.machine()]


def _waits_for_a_connection(thread: threading.Thread) -> bool:
    """``thread`` is blocked in epoll with no timeout (-1): nothing but a connection, or ``close``,
    wakes it (``/proc/<tid>/syscall``: the call's number and arguments while it is blocked)."""
    fields = Path(f"/proc/self/task/{thread.native_id}/syscall").read_text().split()
    return fields[0] in EPOLL_WAITS and int(fields[4], 16) & 0xFFFFFFFF == 0xFFFFFFFF


def _wakeups(thread: threading.Thread) -> int:
    """How often ``thread`` has slept and been woken (its voluntary context switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_an_idle_server_sleeps_and_still_answers_and_stops() -> None:
    server = start_http_server(0, "127.0.0.1")
    thread = next(t for t in threading.enumerate() if t.name == f"http-{server.port}")
    try:
        wait_for(lambda: _waits_for_a_connection(thread))
        woken = _wakeups(thread)
        stays_true(lambda: _wakeups(thread) == woken, 1.5)  # a loop polling twice a second would wake 3 times
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10) as answer:
            assert answer.status == 200
    finally:
        server.close()
    assert not thread.is_alive()
