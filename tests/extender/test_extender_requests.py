"""What reaches the extender's port is bounded: wrong-typed bodies get a 400 with a one-line reason,
bodies are capped, a request must arrive within the request timeout, connections are capped, and the
server neither holds slow clients forever nor spins while they wait. (Connections that never send a
request, or never finish a TLS handshake: tests/process/test_process_httpserver.py.)"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from labeller.apps.extender.app import Running
from labeller.process.httpserver import HttpLimits
from tests.builders import AT_ONCE_S, PATIENCE_S, stays_true, wait_for
from tests.extender.conftest import Client, Start, mem_pod, share_node
from tests.extender.test_extender_cli import free_port
from tests.fakes.apiserver import FakeApiServer


FILTER = "/gpushare-scheduler/filter"


@pytest.mark.parametrize(("body", "reason"), [
    ({"NodeNames": 5}, "NodeNames is not a list of node names"),
    ({"NodeNames": "gs-a"}, "NodeNames is not a list of node names"),
    ({"NodeNames": ["gs-a", 5]}, "NodeNames is not a list of node names"),
    ({"Nodes": {"items": [1]}}, "Nodes is not a NodeList"),
    ({"Nodes": 5}, "Nodes is not a NodeList"),
    ({"NodeNames": ["gs-a"], "Pod": {"spec": {"containers": [1]}}}, "Pod.spec.containers is not a list of containers"),
    ({"NodeNames": ["gs-a"], "Pod": {"spec": {"containers": [{"resources": 1}]}}},
     "Pod.spec.containers[0].resources is not an object"),
    ({"NodeNames": ["gs-a"], "Pod": {"spec": {"containers": [{"resources": {"limits": [1]}}]}}},
     "Pod.spec.containers[0].resources.limits is not an object"),
    ({"NodeNames": ["gs-a"], "Pod": {"spec": 5}}, "Pod.spec is not an object"),
    ({"NodeNames": ["gs-a"], "Pod": {"metadata": 5}}, "Pod.metadata is not an object"),
])
def test_wrong_typed_bodies_get_a_400_with_a_one_line_reason(api: FakeApiServer, client: Client, body: dict[str, Any],
                                                             reason: str) -> None:
    if "Pod" not in body:
        body = {"Pod": mem_pod(api, "p", 4), **body}
    for verb in ("filter", "prioritize"):
        assert client.call("POST", f"/gpushare-scheduler/{verb}", body) == (400, {"Error": reason})
    assert client.call("GET", "/healthz")[0] == 200  # the server is still there


@pytest.mark.parametrize("field", ["PodName", "PodNamespace", "PodUID", "Node"])
def test_bind_args_must_be_strings(client: Client, field: str) -> None:
    args: dict[str, Any] = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1", field: ["x"]}
    assert client.call("POST", "/gpushare-scheduler/bind", args) == (400, {"Error": f"{field} is not a string"})


def raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[bytes, float]:
    """Send ``head`` and ``body`` and keep the socket open (no EOF): the server's whole answer, and how
    long it took to close the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as sock:
        sent = time.monotonic()
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer, time.monotonic() - sent


def head(length: str | None) -> bytes:
    lines = [f"POST {FILTER} HTTP/1.1", "Host: x", "Content-Type: application/json", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_body_without_a_usable_length_is_refused_at_once(extender: Running) -> None:
    port = extender.http.port
    for length, status in (("-1", b"400"), ("ten", b"400"), (None, b"411"), ("100000000", b"413")):
        answer, seconds = raw_request(port, head(length))
        assert answer.split(b" ", 2)[1] == status, (length, answer)
        assert seconds < AT_ONCE_S  # answered and closed without reading to EOF


def test_a_body_over_the_cap_is_refused_unread(api: FakeApiServer, start_extender: Start) -> None:
    extender = start_extender(limits=HttpLimits(max_body_bytes=1 << 20))
    body = json.dumps({"Pod": mem_pod(api, "p", 4), "NodeNames": ["n"] * 300_000}).encode()
    assert len(body) > 1 << 20
    answer, _ = raw_request(extender.http.port, head(str(len(body))), body)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"body of %d bytes is over the limit of 1048576 (--max-body-bytes)" % len(body) in answer
    small = json.dumps({"Pod": mem_pod(api, "q", 4), "NodeNames": ["n"] * 1000}).encode()
    assert raw_request(extender.http.port, head(str(len(small))), small)[0].startswith(b"HTTP/1.1 200 ")


@contextmanager
def slow_clients(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections that each sent the first byte of a request and nothing more."""
    with ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S))
            sock.sendall(b"P")
            socks.append(sock)
        yield socks


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_slow_clients_are_closed_and_the_filter_is_answered_meanwhile(
        api: FakeApiServer, start_extender: Start) -> None:
    extender = start_extender(limits=HttpLimits(request_timeout_s=2.0, max_connections=64))
    share_node(api, "n1")
    wait_for(lambda: extender.cache.counts[0] == 1)
    client = Client(extender.http.port)
    pod = mem_pod(api, "p", 4)
    with slow_clients(extender.http.port, 48) as socks:
        cpu, wall = time.process_time(), time.monotonic()
        asked = time.monotonic()
        assert client.filter(pod, ["n1"])["NodeNames"] == ["n1"]
        assert time.monotonic() - asked < AT_ONCE_S
        # Each slow client is closed once the request timeout (2 s) is up, not held.
        for sock in socks:
            assert closed_by_server(sock)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    assert wall < 2.0 + AT_ONCE_S
    # Nothing spun while they waited: a busy loop would take a whole core for the whole wait.
    assert cpu < 0.5 * wall, (cpu, wall)


def answers(client: Client) -> bool:
    try:
        return client.call("GET", "/healthz")[0] == 200
    except OSError:  # closed at once: no slot free yet
        return False


def test_with_a_request_in_flight_on_every_connection_new_ones_are_closed_at_once_without_spinning(
        api: FakeApiServer, start_extender: Start) -> None:
    extender = start_extender(limits=HttpLimits(request_timeout_s=3.0, max_connections=16))
    client = Client(extender.http.port)
    with slow_clients(extender.http.port, 16):
        # each has begun a request: none is idle, so none is closed to make room for a new one
        wait_for(lambda: extender.http.connections.open == 16 and extender.http.connections.idle == 0)
        cpu, wall = time.process_time(), time.monotonic()
        with slow_clients(extender.http.port, 40) as over:
            for sock in over:  # refused: closed long before the request timeout
                assert closed_by_server(sock)
        assert time.monotonic() - wall < 3.0
        # the slots free up when the request timeout closes the slow ones
        wait_for(lambda: answers(client))
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    assert cpu < 0.5 * wall, (cpu, wall)


def test_out_of_file_descriptors_the_accept_loop_pauses_instead_of_spinning(api: FakeApiServer,
                                                                             kubeconfig: Path) -> None:
    """With fewer file descriptors than --max-connections, the connections past the limit cannot be
    accepted: the listening socket stays readable, and an accept loop that retried at once would take a
    whole core until they go."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "labeller.cli", "--log-format", "json", "scheduler-extender", "--port", str(port),
         "--kubeconfig", str(kubeconfig), "--max-connections", "1000", "--request-timeout", "60s"],
        stderr=subprocess.PIPE, text=True, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    try:
        wait_for(lambda: answers(Client(port)))
        with ExitStack() as stack:
            for _ in range(120):  # past the 64 descriptors: the rest wait in the listen backlog
                stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S)).sendall(b"P")
            cpu, wall = cpu_seconds(process.pid), time.monotonic()
            stays_true(lambda: process.poll() is None, seconds=2.0)
            cpu, wall = cpu_seconds(process.pid) - cpu, time.monotonic() - wall
        # Pausing, it takes next to nothing (0.0 s measured); spinning, a core's share of a loaded machine.
        assert cpu < 0.1 * wall, (cpu, wall)
        wait_for(lambda: answers(Client(port)))  # once they are gone, it answers again
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=PATIENCE_S)
    warnings = [line for line in stderr.splitlines() if '"reason": "accept-failed"' in line]
    assert len(warnings) == 1, stderr[-2000:]  # said once, not once per try
    assert "Traceback" not in stderr


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_extender_raises_its_open_files_limit_for_its_connections(api: FakeApiServer, kubeconfig: Path) -> None:
    """A thousand held connections need as many descriptors: a soft limit of 256 (a shell's, an old
    runtime's) is raised as far as the hard limit allows, never past it."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "labeller.cli", "--log-format", "json", "scheduler-extender", "--port", str(port),
         "--kubeconfig", str(kubeconfig)],
        stderr=subprocess.DEVNULL, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096)))
    try:
        wait_for(lambda: answers(Client(port)))
        limits = Path(f"/proc/{process.pid}/limits").read_text()
        (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
        assert line.split()[3:5] == ["1152", "4096"]  # --max-connections 1024 and 128 to spare; hard unchanged
    finally:
        process.terminate()
        process.wait(PATIENCE_S)
