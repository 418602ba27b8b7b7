"""The log's set-up: structlog loads with the first line logged, configured as asked before it loaded."""

from __future__ import annotations

import json
import threading

import pytest

from labeller.base import log


def test_what_was_configured_before_structlog_loaded_applies_to_the_first_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(log, "_pending", ("error", True))  # as configure leaves it when structlog is not loaded
    logger = log.get_logger("gpu_labeller.test")
    logger.warning("below the level", reason="test")
    logger.error("at the level", reason="test", device="0000:3b:00.0")
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert (record["event"], record["level"], record["device"]) == ("at the level", "error", "0000:3b:00.0")
    assert log._pending is None


def test_threads_logging_their_first_lines_at_once_apply_the_configuration_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[tuple[str, bool]] = []
    seen_after: list[int] = []
    monkeypatch.setattr(log, "_apply", lambda level, json_output: applied.append((level, json_output)))
    monkeypatch.setattr(log, "_pending", ("info", True))
    start = threading.Barrier(8)

    def first_line() -> None:
        start.wait()
        log.loaded()
        seen_after.append(len(applied))  # no thread goes on to log before the configuration is in place

    threads = [threading.Thread(target=first_line) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert applied == [("info", True)]
    assert seen_after == [1] * 8
