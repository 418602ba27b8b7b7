"""Signals reach a running process at once, however many come and whichever thread the kernel
hands them to: SIGHUP reloads, SIGTERM stops with exit code 0."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from tests.builders import wait_for
from tests.core.cli import COMMAND


def test_a_burst_of_sighups_then_sigterm_stops_the_daemon_promptly(tmp_path: Path) -> None:
    """A signal handler that set the event the main thread was inside, or a signal given to a thread
    other than the main one while it slept, once kept a daemon running for its whole interval."""
    features = tmp_path / "features"
    log = tmp_path / "log"
    with log.open("w") as stderr:
        process = subprocess.Popen([*COMMAND, "--log-format", "json", "run", "--node-name", "n1", "--output",
                                    "features-file", "--features-file", str(features), "--simulate", "l40s-x4-mps",
                                    "--interval", "3600", "--start-jitter", "0", "--metrics-port", "0",
                                    "--metrics-bind", "127.0.0.1"], stderr=stderr, text=True)
    try:
        wait_for(features.exists, timeout=60)
        for _ in range(200):
            process.send_signal(signal.SIGHUP)
        # the loop took a SIGHUP (a stop that came first would rightly win over a pending reload)
        wait_for(lambda: '"reason": "sighup"' in log.read_text(), timeout=60)
        stopped_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        # an interval is an hour: a stop slept through would not be here; 60 s allows for a loaded machine
        assert time.monotonic() - stopped_at < 60
    finally:
        process.kill()
        process.wait()
    text = log.read_text()
    assert '"signal": "SIGTERM"' in text and '"reason": "sighup"' in text and "Traceback" not in text


def test_sigterm_stops_a_server_whose_log_reader_went_away(tmp_path: Path) -> None:
    """``gpu-labeller ... 2>&1 | head`` closes the pipe the log goes to: logging "signal received" then
    failed with a broken pipe, the stop was never passed on, and the process waited for its loop
    thread for ever. A log line that cannot be written is dropped; SIGTERM still stops it, exit 0."""
    features = tmp_path / "features"
    process = subprocess.Popen([*COMMAND, "--log-format", "json", "run", "--node-name", "n1", "--output",
                                "features-file", "--features-file", str(features), "--simulate", "dgx-h100",
                                "--interval", "3600", "--start-jitter", "0", "--metrics-port", "0",
                                "--metrics-bind", "127.0.0.1"], stderr=subprocess.PIPE)
    try:
        wait_for(features.exists, timeout=60)
        assert process.stderr is not None
        process.stderr.close()  # the reader is gone: every later write to the log pipe fails
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        process.kill()
        process.wait()
