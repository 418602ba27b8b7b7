"""Fixtures every test package shares: the fake API server over real HTTP and a kubeconfig for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.apiserver import FakeApiServer


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")
