"""The health and metrics server every process runs: idle, its thread sleeps until a connection
comes (the standard library's loop wakes twice a second to see whether it should stop), and it
still answers, and stops, at once."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

from labeller.runtime import start_http_server
from tests.builders import stays_true


def _wakeups(thread: threading.Thread) -> int:
    """How often ``thread`` has slept and been woken (its voluntary context switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_an_idle_server_sleeps_and_still_answers_and_stops() -> None:
    server = start_http_server(0, "127.0.0.1")
    thread = next(t for t in threading.enumerate() if t.name == f"http-{server.port}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10) as answer:
            assert answer.status == 200
        woken = _wakeups(thread)
        stays_true(lambda: _wakeups(thread) == woken, 1.5)  # the standard loop would wake 3 times
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=10) as answer:
            assert answer.status == 200
    finally:
        server.close()
    thread.join(10)
    assert not thread.is_alive()
    server.close()  # a second close (a restarted server's owner closing all it started) is no error
