"""Fixtures every test package shares: the fake API server over real HTTP, a kubeconfig for it, and a
short directory for device plugin sockets. And the two tiers (tests/tiers.py): each collected test is
marked ``integration`` or left a unit test, a plain ``python -m pytest`` runs the unit tier, and a unit
test runs under the guard that fails it if it starts a process, opens a socket or waits on real time."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tests.fakes.apiserver import FakeApiServer
from tests.tiers import (  # noqa: F401 - the tiers' hooks, found here by name
    pytest_collection_modifyitems, pytest_configure, pytest_report_collectionfinish, pytest_runtest_call,
    pytest_runtest_setup, pytest_runtest_teardown)


@pytest.fixture(autouse=True)
def _logging_as_before() -> Iterator[None]:
    """A command run in-process (click's CliRunner) configures structlog for the whole process, its
    level included: put it back after each test, so that no test sees what an earlier one left (a
    test that reads debug lines failed only after one that ran ``run`` in-process)."""
    before = structlog.get_config()
    yield
    structlog.configure(**before)
    structlog.contextvars.clear_contextvars()


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # unix socket paths are limited to 108 bytes: keep the directory short, not pytest's tmp_path
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
