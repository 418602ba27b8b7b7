"""The kubelet emulator itself (tests/fakes/kubelet.py) holds to what a real kubelet does where a race
could tell them apart: a registration dials its endpoint afresh, and a restarted kubelet owes nothing to
a Register the stopped one was still handling. Both cost a CI run: the plugin re-registered after a
kubelet restart and the emulator still reported the resource with no device."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from labeller.apps.plugin.api import api_pb2 as pb
from labeller.apps.plugin.api import api_pb2_grpc as pb_grpc
from tests.fakes.kubelet import FakeKubelet

RESOURCE = "example.com/dev"


class _OneDevice(pb_grpc.DevicePluginServicer):
    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        ended = threading.Event()
        context.add_callback(ended.set)
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="dev0", health="Healthy")])
        ended.wait()


def _serve(path: Path) -> grpc.Server:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_DevicePluginServicer_to_server(_OneDevice(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


def _register(kubelet: FakeKubelet, endpoint: str) -> grpc.StatusCode | None:
    """Register RESOURCE as a plugin does; the error code, or None."""
    request = pb.RegisterRequest(version="v1beta1", endpoint=endpoint, resource_name=RESOURCE)
    # a channel of its own, as each of the plugin's registrations has
    with grpc.insecure_channel(f"unix://{kubelet.socket}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        try:
            pb_grpc.RegistrationStub(channel).Register(request, timeout=30)  # type: ignore[no-untyped-call]
        except grpc.RpcError as exc:
            return exc.code()
    return None


def test_a_registration_dials_afresh_whatever_failed_before_on_its_socket(sock_dir: Path,
                                                                          kubelet: FakeKubelet) -> None:
    """A dial to the socket failed while the plugin was re-creating it (what a late Register of a
    restarted kubelet did): grpc-python shares one connection, and its reconnect backoff, between
    channels to one address, so the next registration's stream failed at once and its devices never
    came. A kubelet's blocking dial owes nothing to an earlier one."""
    path = sock_dir / "dev.sock"
    with grpc.insecure_channel(f"unix://{path}") as earlier:
        stream = pb_grpc.DevicePluginStub(earlier).ListAndWatch(pb.Empty(), timeout=30)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as failed:
            next(iter(stream))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE  # nothing there yet
        server = _serve(path)
        try:
            assert _register(kubelet, path.name) is None
            assert kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1)
        finally:
            server.stop(grace=None)


def test_a_register_the_stopped_kubelet_was_handling_changes_nothing_after_a_restart(
        sock_dir: Path, kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch) -> None:
    handling, release, handled = threading.Event(), threading.Event(), threading.Event()
    register = kubelet.register

    def held(request: pb.RegisterRequest, epoch: int | None = None) -> str | None:
        if handling.is_set():
            return register(request, *(() if epoch is None else (epoch,)))
        handling.set()  # the first Register waits inside the kubelet, as under load
        release.wait(30)
        try:
            return register(request, *(() if epoch is None else (epoch,)))
        finally:
            handled.set()

    monkeypatch.setattr(kubelet, "register", held)
    path = sock_dir / "dev.sock"
    old_server = _serve(path)
    late: list[grpc.StatusCode | None] = []
    plugin = threading.Thread(target=lambda: late.append(_register(kubelet, path.name)))
    plugin.start()
    try:
        assert handling.wait(30)
        restarted = kubelet.restart()  # deletes dev.sock; the held Register is still being handled
        new_server = _serve(path)
        try:
            assert _register(kubelet, path.name) is None
            assert kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1)
            current = kubelet.endpoint(RESOURCE)
            release.set()
            assert handled.wait(30)  # the stopped kubelet's handler has run to its end
            plugin.join(30)
            assert late and late[0] is not None  # the plugin saw its registration fail, and retries
            # the stopped kubelet's Register registered nothing in the new one
            assert [r.resource for r in kubelet.registrations if r.at >= restarted] == [RESOURCE]
            assert kubelet.endpoint(RESOURCE) is current and kubelet.allocatable(RESOURCE) == 1
        finally:
            new_server.stop(grace=None)
    finally:
        release.set()
        plugin.join(30)
        old_server.stop(grace=None)
