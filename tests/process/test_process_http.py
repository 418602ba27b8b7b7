"""The health and metrics server every process runs costs nothing while no one asks: its thread
sleeps until a connection comes (an idle DRA plugin's budget is 0.1 % of a core), and it still
answers, and stops, at once."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

from labeller.process.httpserver import start_http_server
from tests.builders import stays_true, wait_for


def _wakeups(thread: threading.Thread) -> int:
    """How often ``thread`` has slept and been woken (its voluntary context switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_an_idle_server_sleeps_and_still_answers_and_stops() -> None:
    server = start_http_server(0, "127.0.0.1")
    thread = next(t for t in threading.enumerate() if t.name == f"http-{server.port}")
    try:
        woken = wait_for(lambda: _wakeups(thread))  # it has gone to sleep once, waiting for a connection
        stays_true(lambda: _wakeups(thread) == woken, 1.5)  # a loop polling twice a second would wake 3 times
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10) as answer:
            assert answer.status == 200
    finally:
        server.close()
    assert not thread.is_alive()
