"""The labeller follows the MPS control daemon's readiness file within a second, whatever its
probe interval: ``mps.capable`` and ``sharing-strategy=mps`` only while the daemon serves."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from labeller.apps.daemon.run import probe_labels
from labeller.host.machine import NodeOptions, open_host
from tests.builders import AT_ONCE_S, offer_of, wait_for
from tests.daemon.conftest import NODE, Running
from tests.fakes.apiserver import FakeApiServer
from vendors.nvidia import mps


@pytest.fixture
def mps_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_labels_follow_the_readiness_file_within_a_second(api: FakeApiServer, start: Callable[..., Running],
                                                          tmp_path: Path, mps_root: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"version": "v1", "flags": {"mpsRoot": str(mps_root)},
                                  "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}))
    api.create_node(NODE)
    with open_host(NodeOptions(simulate="l40s-x4-mps", config_path=config)) as node:
        start(lambda: probe_labels(node), inputs=node.offer_inputs, interval_s=600)

        def labels() -> dict[str, str]:
            return api.labels(NODE)

        wait_for(lambda: labels().get("nvidia.com/mps.capable") == "false")
        assert labels()["nvidia.com/gpu.sharing-strategy"] == "none"
        served = [mps.served(h.resource) for h in offer_of(node.probe(), node.config).held]
        mps.ready_file(str(mps_root)).write_text(mps.ready_document(served, time.time(), 30))
        ready_at = time.monotonic()
        wait_for(lambda: labels().get("nvidia.com/mps.capable") == "true")
        assert time.monotonic() - ready_at < AT_ONCE_S  # a look every second, not the 600 s probe interval
        assert labels()["nvidia.com/gpu.sharing-strategy"] == "mps" and labels()["nvidia.com/gpu.replicas"] == "4"
        mps.ready_file(str(mps_root)).unlink()  # the control daemon stopped
        wait_for(lambda: labels().get("nvidia.com/mps.capable") == "false")
        assert labels()["nvidia.com/gpu.count"] == "0"
