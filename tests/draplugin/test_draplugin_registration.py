"""Registration with the kubelet's plugin watcher: one driver per vendor present, the DRA service
where GetInfo says, and registered again when the kubelet removed the registration socket."""

from __future__ import annotations

import time

import grpc
import structlog

from labeller.apps.draplugin.api import dra_pb2
from tests.builders import AT_ONCE_S, stays_true, wait_for
from tests.draplugin.conftest import AMD, NVIDIA, Dirs, simulated_plugin
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet


def test_each_vendor_present_registers_its_driver(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "mixed-l40s-mi210"):
        assert drakubelet.wait_for(lambda: len(drakubelet.seen("registered")) == 2)
        registered = {e.driver: e.detail for e in drakubelet.seen("registered")}
        assert registered == {
            driver: {"endpoint": str(dirs.plugins / driver / "dra.sock"), "versions": ["v1.DRAPlugin"],
                     "socket": str(dirs.registry / f"{driver}-reg.sock")}
            for driver in (NVIDIA, AMD)}
        assert drakubelet.seen("rejected") == []


def test_a_node_of_one_vendor_registers_one_driver(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                   dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100"):
        assert drakubelet.wait_for(lambda: [e.driver for e in drakubelet.seen("registered")] == [NVIDIA])
        assert sorted(p.name for p in dirs.registry.iterdir()) == [f"{NVIDIA}-reg.sock"]


def test_a_removed_registration_socket_registers_again(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                       dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("before-restart", "gpu-1")
        assert not drakubelet.prepare("pod-1", [claim])[claim.uid].error
        removed = time.monotonic()
        (dirs.registry / f"{NVIDIA}-reg.sock").unlink()  # the kubelet restarts
        assert drakubelet.wait_for(lambda: drakubelet.seen("registered", NVIDIA, since=removed))
        registered_again = drakubelet.seen("registered", NVIDIA, since=removed)[0].at
        assert registered_again - removed < AT_ONCE_S
        assert drakubelet.seen("deregistered", NVIDIA, since=removed)
        wait_for(lambda: run.plugin.ready)
        # prepared claims are still known: answered from the checkpoint, the spec file still there
        again = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid]
        assert not again.error and [d.device_name for d in again.devices] == ["gpu-1"]
        assert not drakubelet.unprepare("pod-1", [claim])[claim.uid].error


def test_a_removed_dra_socket_is_created_again(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        socket = dirs.plugins / NVIDIA / "dra.sock"
        socket.unlink()
        claim = run.claim("after", "gpu-2")
        answer = wait_for(lambda: _prepared(drakubelet, claim))  # the kubelet's channel reconnects to the new socket
        assert [d.device_name for d in answer.devices] == ["gpu-2"] and socket.exists()
        assert [e.driver for e in drakubelet.seen("registered")] == [NVIDIA]  # no need to register again


def _prepared(kubelet: FakeDraKubelet, claim: Claim) -> dra_pb2.NodePrepareResourceResponse | None:
    try:
        answer = kubelet.call_prepare(NVIDIA, [claim])[claim.uid]
    except grpc.RpcError:
        return None
    return answer if not answer.error else None


def test_stopping_removes_the_sockets_and_keeps_the_slices(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                           dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        stopped = time.monotonic()
    assert drakubelet.wait_for(lambda: drakubelet.seen("deregistered", NVIDIA, since=stopped))
    assert list(dirs.registry.iterdir()) == [] and not (dirs.plugins / NVIDIA / "dra.sock").exists()
    assert run.exit_code == [0]
    # the next plugin takes them over; the kubelet deletes them 30 s after a driver that did not come back
    assert len(run.devices()) == 8


def test_a_directory_at_the_dra_socket_path_is_one_error_line_and_a_retry(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    taken = dirs.plugins / NVIDIA / "dra.sock"
    taken.mkdir(parents=True)
    problem = "cannot create the plugin socket; retrying"
    with structlog.testing.capture_logs() as logs, \
            simulated_plugin(api, drakubelet, dirs, "dgx-h100", ready=False) as run:
        wait_for(lambda: any(e["event"] == problem for e in logs))
        assert [e["error"] for e in logs if e["event"] == problem] == [f"{taken}: a directory, not a socket; remove it"]
        # ticks come every few ms here: a line (or a traceback) per tick would show at once
        stays_true(lambda: sum(e["event"] == problem for e in logs) == 1 and not any("exc_info" in e for e in logs),
                   seconds=1.0)
        assert not run.plugin.ready
        taken.rmdir()
        assert drakubelet.wait_for(lambda: [e.driver for e in drakubelet.seen("registered")] == [NVIDIA])
        wait_for(lambda: run.plugin.ready)
