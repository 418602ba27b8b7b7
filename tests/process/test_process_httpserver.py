"""The HTTP server's connection slots always admit a client that sends requests: connections that
never finish a TLS handshake, or never send a request, cannot keep a client with a certificate out;
a handshake has a deadline of its own; the connection closed to make room is never one with a
request in flight; and a connection without a request holds no thread."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from labeller.process.httpserver import Answer, HealthServer, HttpLimits, server_tls, start_http_server
from tests.builders import PATIENCE_S, wait_for
from tests.extender.certs import Certs, make_certs
from tests.extender.test_extender_requests import closed_by_server  # waits (the socket's timeout) for the close

LONG_S = 300.0  # deadlines a test must not wait out: far past PATIENCE_S


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def servers() -> Iterator[list[HealthServer]]:
    started: list[HealthServer] = []
    yield started
    for server in started:
        server.close()


@pytest.fixture
def connections() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def client_context(certs: Certs) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    return context


def idle_connection(stack: ExitStack, port: int, first: bytes = b"") -> socket.socket:
    """A TCP connection that sends ``first`` (nothing: not even a TLS hello) and then waits."""
    sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S))
    if first:
        sock.sendall(first)
    return sock


def still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""  # nothing is ever sent to these: data would be a surprise too
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.settimeout(PATIENCE_S)


def get(connection: http.client.HTTPConnection, path: str = "/healthz") -> tuple[int, bytes]:
    connection.request("GET", path)
    answer = connection.getresponse()
    return answer.status, answer.read()


def test_idle_connections_in_every_slot_do_not_keep_a_client_with_a_certificate_out(
        certs: Certs, servers: list[HealthServer], connections: ExitStack) -> None:
    limits = HttpLimits(max_connections=4, tls_handshake_timeout_s=LONG_S, request_timeout_s=LONG_S)
    tls = server_tls(str(certs.server_cert), str(certs.server_key), str(certs.ca))
    server = start_http_server(0, "127.0.0.1", limits=limits, tls=tls)
    servers.append(server)
    threads = set(threading.enumerate())
    idle = [idle_connection(connections, server.port) for _ in range(4)]  # no TLS hello: every slot taken
    wait_for(lambda: server.connections.open == 4)
    assert not set(threading.enumerate()) - threads  # waiting for a handshake costs no thread

    scheduler = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=PATIENCE_S,
                                            context=client_context(certs))
    assert get(scheduler) == (200, b"ok\n")  # on a keep-alive connection
    assert closed_by_server(idle[0])  # the one idle the longest made room
    assert all(still_open(sock) for sock in idle[1:])
    assert server.connections.open == 4

    # Between requests the scheduler's connection is idle too, but connections still in their handshake
    # (newcomers among them) are closed first: they have not shown a certificate.
    kept = scheduler.sock
    wait_for(lambda: server.connections.idle == 4)
    newer = [idle_connection(connections, server.port) for _ in range(4)]
    assert all(closed_by_server(sock) for sock in (*idle[1:], newer[0]))
    assert get(scheduler) == (200, b"ok\n") and scheduler.sock is kept
    assert all(still_open(sock) for sock in newer[1:])


def test_an_idle_keep_alive_connection_makes_room_once_it_has_waited_longest(
        servers: list[HealthServer], connections: ExitStack) -> None:
    server = start_http_server(0, "127.0.0.1", limits=HttpLimits(max_connections=2, request_timeout_s=LONG_S))
    servers.append(server)
    keep_alive = http.client.HTTPConnection("127.0.0.1", server.port, timeout=PATIENCE_S)
    assert get(keep_alive) == (200, b"ok\n")
    wait_for(lambda: server.connections.idle == 1)  # answered: it waits for its next request
    first = idle_connection(connections, server.port)  # the free slot
    wait_for(lambda: server.connections.open == 2)
    second = idle_connection(connections, server.port)
    assert closed_by_server(keep_alive.sock)
    assert still_open(first) and still_open(second)


def test_a_client_that_does_not_finish_its_handshake_is_closed_at_the_handshake_deadline(
        certs: Certs, servers: list[HealthServer], connections: ExitStack) -> None:
    # 1.5 s: a loaded machine finishes a real handshake within it (milliseconds on a quiet one)
    limits = HttpLimits(max_connections=16, tls_handshake_timeout_s=1.5, request_timeout_s=LONG_S)
    tls = server_tls(str(certs.server_cert), str(certs.server_key), str(certs.ca))
    server = start_http_server(0, "127.0.0.1", limits=limits, tls=tls)
    servers.append(server)
    scheduler = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=PATIENCE_S,
                                            context=client_context(certs))
    assert get(scheduler) == (200, b"ok\n")
    kept = scheduler.sock
    silent = idle_connection(connections, server.port)
    trickling = idle_connection(connections, server.port, b"\x16\x03\x01")  # the start of a ClientHello
    # The request timeout (300 s) would keep them past the test's patience (60 s).
    assert closed_by_server(silent) and closed_by_server(trickling)
    wait_for(lambda: server.connections.open == 1)
    # The deadline is the handshake's: a connection idle after its handshake stays open.
    assert get(scheduler) == (200, b"ok\n") and scheduler.sock is kept


class Gate:
    """An application whose ``/slow`` answers only once opened: a request held in flight."""

    def __init__(self) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()

    def __call__(self, method: str, path: str, body: bytes) -> Answer | None:
        if path != "/slow":
            return None
        self.entered.set()
        self.opened.wait(PATIENCE_S)
        return 200, b"done\n", "text/plain"


def test_a_connection_with_a_request_in_flight_is_never_the_one_closed(
        servers: list[HealthServer], connections: ExitStack) -> None:
    gate = Gate()
    limits = HttpLimits(max_connections=4, request_timeout_s=LONG_S)
    server = start_http_server(0, "127.0.0.1", app=gate, limits=limits)
    servers.append(server)
    slow = http.client.HTTPConnection("127.0.0.1", server.port, timeout=PATIENCE_S)
    answers: list[tuple[int, bytes]] = []
    asking = threading.Thread(target=lambda: answers.append(get(slow, "/slow")))
    asking.start()
    gate.entered.wait(PATIENCE_S)
    # A request begun (its first line sent, the rest to come) is in flight as well.
    partial = idle_connection(connections, server.port, b"GET /healthz HTTP/1.1\r\n")
    wait_for(lambda: server.connections.open == 2 and server.connections.idle == 0)
    idle = [idle_connection(connections, server.port) for _ in range(2)]
    wait_for(lambda: server.connections.open == 4)
    newer = [idle_connection(connections, server.port) for _ in range(3)]  # each makes room: the idle ones go
    for sock in (*idle, newer[0]):
        assert closed_by_server(sock)
    wait_for(lambda: server.connections.open == 4 and server.connections.idle == 2)
    partial.sendall(b"Host: x\r\nConnection: close\r\n\r\n")
    answer = b""
    while chunk := partial.recv(65536):
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ")
    gate.opened.set()
    asking.join(PATIENCE_S)
    assert answers == [(200, b"done\n")]
    assert all(still_open(sock) for sock in newer[1:])


def test_when_every_connection_has_a_request_in_flight_a_new_one_is_closed(
        servers: list[HealthServer], connections: ExitStack) -> None:
    server = start_http_server(0, "127.0.0.1", limits=HttpLimits(max_connections=2, request_timeout_s=LONG_S))
    servers.append(server)
    partial = [idle_connection(connections, server.port, b"GET /") for _ in range(2)]
    wait_for(lambda: server.connections.open == 2 and server.connections.idle == 0)
    assert closed_by_server(idle_connection(connections, server.port))
    for sock in partial:
        sock.sendall(b"healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_a_connection_without_a_request_holds_no_thread(servers: list[HealthServer], connections: ExitStack) -> None:
    server = start_http_server(0, "127.0.0.1", limits=HttpLimits(max_connections=64, request_timeout_s=LONG_S))
    servers.append(server)
    threads = set(threading.enumerate())  # new ones: an earlier test's may end meanwhile (an NVML event wait)
    for _ in range(50):
        idle_connection(connections, server.port)
    wait_for(lambda: server.connections.open == 50)
    assert not set(threading.enumerate()) - threads and server.connections.threads == 0
    keep_alive = http.client.HTTPConnection("127.0.0.1", server.port, timeout=PATIENCE_S)
    assert get(keep_alive) == (200, b"ok\n")
    assert server.connections.threads == 1
    wait_for(lambda: server.connections.idle == 51)  # answered, the keep-alive connection waits idle, threadless
    assert get(keep_alive) == (200, b"ok\n")
