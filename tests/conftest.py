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

from tests import tiers
from tests.fakes.apiserver import FakeApiServer

REASON = pytest.StashKey[str]()  # why a test is integration: the chain to the LIVE name it reaches
GUARD = pytest.StashKey[tiers.Guard]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[GUARD] = tiers.Guard()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it reaches; without ``-m`` and paths (plain ``python -m pytest``), keep the unit tier."""
    classifier = tiers.Classifier()
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        fixtures = [definition.func for name in item.fixturenames
                    for definition in item._fixtureinfo.name2fixturedefs.get(name, ())]
        why = tiers.reason(classifier, [item.function, *fixtures])
        if why is not None:
            item.stash[REASON] = why
            item.add_marker(pytest.mark.integration)
    if not _plain_run(config):
        return
    integration = [item for item in items if REASON in item.stash]
    if integration:
        config.hook.pytest_deselected(items=integration)
        items[:] = [item for item in items if REASON not in item.stash]


def _plain_run(config: pytest.Config) -> bool:
    """``python -m pytest`` with neither paths nor ``-m``: the unit tier. Naming a file or a test runs what
    it names, both tiers; ``-m integration``, ``-m "not integration"``, ``-m ""`` (all) select as usual."""
    chose = config.option.markexpr or any(arg.startswith("-m") for arg in config.invocation_params.args)
    return not chose and config.args_source == pytest.Config.ArgsSource.TESTPATHS


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> str:
    integration = sum(REASON in item.stash for item in items)
    return f"tiers: {len(items) - integration} unit, {integration} integration tests selected"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


def _guarded(item: pytest.Item) -> Iterator[None]:
    """A unit test's phase under the guard: what it tripped fails it, naming what it did and where."""
    if REASON in item.stash:
        return (yield)
    with item.config.stash[GUARD].armed() as tripped:
        try:
            outcome = yield
        except BaseException:
            if not tripped:
                raise
            outcome = None  # what it tripped on is the failure, whatever became of the exception
    if tripped:
        pytest.fail(tiers.explain(tripped), pytrace=False)
    return outcome


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
