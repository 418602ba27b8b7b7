"""The extender over mutual TLS: only a client holding a certificate the client CA signed (the
kube-scheduler) gets an answer, on every path; without TLS it listens on loopback only and says it
is unauthenticated; the plain metrics port serves health and metrics, never the extender's API."""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from labeller.process.httpserver import server_tls
from tests.builders import PATIENCE_S, wait_for
from tests.core.cli import error_line, gpu_labeller
from tests.extender.certs import Certs, make_certs
from tests.extender.conftest import Start, mem_pod, share_node
from tests.extender.test_extender_cli import free_port
from tests.extender.test_extender_requests import closed_by_server
from tests.fakes.apiserver import FakeApiServer
from tests.processes import LoggedProcess


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def client_context(certs: Certs, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def https(port: int, path: str, context: ssl.SSLContext, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=data,
                                     method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=PATIENCE_S, context=context) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def refused(port: int, path: str, context: ssl.SSLContext) -> bool:
    """The connection fails before any answer (the handshake, or the server closing it right after)."""
    try:
        https(port, path, context, {"Pod": {}, "NodeNames": []} if path.endswith("filter") else None)
    except (ssl.SSLError, ConnectionError, urllib.error.URLError):
        return True
    return False


def test_only_a_client_with_a_certificate_the_ca_signed_is_answered(api: FakeApiServer, start_extender: Start,
                                                                    certs: Certs) -> None:
    extender = start_extender(tls=server_tls(str(certs.server_cert), str(certs.server_key), str(certs.ca)))
    share_node(api, "n1")
    wait_for(lambda: extender.cache.counts[0] == 1)
    port, pod = extender.http.port, mem_pod(api, "p", 4)
    scheduler = client_context(certs, certs.client_cert, certs.client_key)
    status, body = https(port, "/gpushare-scheduler/filter", scheduler, {"Pod": pod, "NodeNames": ["n1"]})
    assert status == 200 and json.loads(body)["NodeNames"] == ["n1"]
    assert https(port, "/gpushare-scheduler/inspect", scheduler)[0] == 200
    assert https(port, "/metrics", scheduler)[0] == 200
    anonymous, stranger = client_context(certs), client_context(certs, certs.stranger_cert, certs.stranger_key)
    for path in ("/gpushare-scheduler/filter", "/gpushare-scheduler/bind", "/gpushare-scheduler/inspect", "/metrics",
                 "/healthz"):
        assert refused(port, path, anonymous), path
        assert refused(port, path, stranger), path
    plain = urllib.request.Request(f"http://127.0.0.1:{port}/gpushare-scheduler/inspect")
    with pytest.raises((ConnectionError, urllib.error.URLError)):
        urllib.request.urlopen(plain, timeout=PATIENCE_S)
    # Refused clients leave the server as it was: the scheduler is still answered.
    assert https(port, "/gpushare-scheduler/filter", scheduler, {"Pod": pod, "NodeNames": ["n1"]})[0] == 200


def test_the_cli_serves_mutual_tls_with_plain_health_and_metrics_beside(api: FakeApiServer, kubeconfig: Path,
                                                                       certs: Certs) -> None:
    share_node(api, "n1")
    port, metrics_port = free_port(), free_port()
    with LoggedProcess("scheduler-extender", "--port", str(port), "--metrics-port", str(metrics_port),
                       "--kubeconfig", str(kubeconfig), "--tls-cert-file", str(certs.server_cert),
                       "--tls-key-file", str(certs.server_key), "--client-ca-file", str(certs.ca),
                       "--tls-handshake-timeout", "1s", "--request-timeout", "300s") as process:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=PATIENCE_S) as answer:
                    return answer.status == 200
            except OSError:
                return False

        wait_for(ready)
        with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as silent:
            assert closed_by_server(silent)  # at the 1 s handshake deadline, long before the request timeout
        scheduler = client_context(certs, certs.client_cert, certs.client_key)
        assert https(port, "/gpushare-scheduler/inspect", scheduler)[0] == 200
        assert refused(port, "/gpushare-scheduler/inspect", client_context(certs))
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=PATIENCE_S) as answer:
            assert b"gpu_labeller_extender_requests_total" in answer.read()
        with pytest.raises(urllib.error.HTTPError) as not_here:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/gpushare-scheduler/inspect", timeout=PATIENCE_S)
        assert not_here.value.code == 404
        assert process.stop() == 0
    assert process.count("started", reason="start") == 1 and process.count("serving without authentication") == 0
    assert "Traceback" not in process.log


def test_without_tls_it_listens_on_loopback_and_warns(api: FakeApiServer, kubeconfig: Path) -> None:
    port = free_port()
    with LoggedProcess("scheduler-extender", "--port", str(port), "--kubeconfig", str(kubeconfig)) as process:
        warning = process.event("serving without authentication: whoever reaches the port can bind pods; give "
                                   "--tls-cert-file, --tls-key-file and --client-ca-file")
        assert warning["bind"] == "127.0.0.1" and warning["level"] == "warning"
        assert process.stop() == 0


def test_tls_flags_go_together_and_unusable_files_are_one_line(certs: Certs, tmp_path: Path) -> None:
    partial = gpu_labeller("scheduler-extender", "--tls-cert-file", str(certs.server_cert))
    assert partial.returncode == 2
    assert error_line(partial) == ("Error: --tls-cert-file, --tls-key-file and --client-ca-file go together: "
                                   "give all three or none")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    bad = gpu_labeller("scheduler-extender", "--tls-cert-file", str(certs.server_cert), "--tls-key-file",
                       str(certs.server_key), "--client-ca-file", str(garbage))
    assert bad.returncode == 2 and error_line(bad).startswith(f"Error: --client-ca-file {garbage}: cannot be used: ")
