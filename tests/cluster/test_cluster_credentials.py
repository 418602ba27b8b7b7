"""A kubeconfig's static credentials are read as the ``kubernetes`` client's own loader reads them,
without loading that loader (OAuth2, ``requests``, pydantic: about 15 MiB a node process would carry
for nothing); anything else goes to the client's loader. Each kubeconfig here is read both ways and
must give the client the same configuration."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labeller.cluster.kube import load_configuration
from labeller.cluster.kubeconfig import static_credentials
from tests.fakes.apiserver import FakeApiServer

CA, CERT, KEY = b"-----BEGIN CERTIFICATE-----\nca\n", b"-----BEGIN CERTIFICATE-----\nme\n", b"-----BEGIN KEY-----\nk\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def document(cluster: dict[str, Any], user: dict[str, Any] | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "here",
            "clusters": [{"name": "c", "cluster": cluster}, {"name": "other", "cluster": {"server": "https://x:1"}}],
            "users": [{"name": "u", "user": user}] if user is not None else [],
            "contexts": [{"name": "here", "context": {"cluster": "c", **({"user": "u"} if user is not None else {})}}]}


def files(tmp_path: Path) -> dict[str, str]:
    paths = {}
    for name, data in (("ca.crt", CA), ("me.crt", CERT), ("me.key", KEY)):
        (tmp_path / name).write_bytes(data)
        paths[name] = str(tmp_path / name)
    return paths


STATIC = {
    "a token over http (the fake API server's)": lambda p: document({"server": "http://127.0.0.1:8080/"},
                                                                   {"token": "fake-token"}),
    "kubeadm's: certificates as data": lambda p: document(
        {"server": "https://10.0.0.1:6443", "certificate-authority-data": b64(CA)},
        {"client-certificate-data": b64(CERT), "client-key-data": b64(KEY)}),
    "certificates as files": lambda p: document(
        {"server": "https://api:6443", "certificate-authority": p["ca.crt"]},
        {"client-certificate": p["me.crt"], "client-key": p["me.key"]}),
    "insecure, a server name, a proxy and a token": lambda p: document(
        {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True, "tls-server-name": "kubernetes",
         "proxy-url": "http://proxy:3128"}, {"token": "t0k3n"}),
    "no user at all": lambda p: document({"server": "https://api:6443", "certificate-authority-data": b64(CA)}, None),
}


def _content(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def seen_by_the_client(configuration: Any) -> dict[str, Any]:
    """What the client does with a configuration: where it connects, how it checks and proves who it is."""
    return {"host": configuration.host, "verify_ssl": configuration.verify_ssl,
            "tls_server_name": configuration.tls_server_name, "proxy": configuration.proxy,
            "auth": configuration.auth_settings(), "ca": _content(configuration.ssl_ca_cert),
            "cert": _content(configuration.cert_file), "key": _content(configuration.key_file)}


@pytest.mark.parametrize("kind", sorted(STATIC))
def test_static_credentials_give_the_client_what_its_own_loader_gives(kind: str, tmp_path: Path) -> None:
    from kubernetes.client.configuration import Configuration
    from kubernetes.config import kube_config

    kubeconfig = STATIC[kind](files(tmp_path))
    assert static_credentials(kubeconfig) is not None
    by_the_loader = Configuration()
    kube_config.load_kube_config_from_dict(kubeconfig, client_configuration=by_the_loader, persist_config=False)
    assert seen_by_the_client(load_configuration(kubeconfig)) == seen_by_the_client(by_the_loader)


NOT_STATIC = {
    "an exec plugin": ({"server": "https://api"}, {"exec": {"command": "kubelogin", "apiVersion": "v1"}}),
    "an auth provider": ({"server": "https://api"}, {"auth-provider": {"name": "oidc", "config": {}}}),
    "a user name and password": ({"server": "https://api"}, {"username": "admin", "password": "secret"}),
    "a token file": ({"server": "https://api"}, {"tokenFile": "/var/run/token"}),
    "a key it does not know": ({"server": "https://api", "certificate-authority-data": b64(CA), "new-key": "x"}, {}),
    "a CA file that is not there": ({"server": "https://api", "certificate-authority": "/nonexistent/ca.crt"}, {}),
    "CA data that is not base64": ({"server": "https://api", "certificate-authority-data": "not base64!"}, {}),
    "a server that is not a string": ({"server": 6443}, {}),
}


@pytest.mark.parametrize("kind", sorted(NOT_STATIC))
def test_anything_else_is_left_to_the_clients_loader(kind: str) -> None:
    cluster, user = NOT_STATIC[kind]
    assert static_credentials(document(cluster, user)) is None


def test_a_kubeconfig_the_client_cannot_use_is_still_one_line_from_it() -> None:
    """Left to the client's loader, which says what is wrong, as before."""
    from labeller.cluster.kube import KubeError

    broken = document({"server": "https://api", "certificate-authority": "/nonexistent/ca.crt"}, {})
    with pytest.raises(KubeError, match="File does not exist: /nonexistent/ca.crt"):
        load_configuration(broken)


def test_a_node_process_never_loads_what_it_does_not_use(api: FakeApiServer, tmp_path: Path) -> None:
    """Connected with static credentials and talking to the API, a process has loaded neither the
    client's generated API, its kubeconfig loader, pydantic nor requests."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.create_node("n1")
    script = ("import json, sys\n"
              "from labeller.cluster.connect import connect\n"
              f"kube = connect({str(kubeconfig)!r})\n"
              "name = kube.get_node('n1')['metadata']['name']\n"
              "print(json.dumps([name, sorted(m for m in sys.modules if m.split('.')[0] in "
              "('pydantic', 'requests', 'oauthlib', 'requests_oauthlib', 'dateutil') or m.startswith("
              "('kubernetes.client.api', 'kubernetes.client.models', 'kubernetes.config.kube_config', "
              "'kubernetes.dynamic', 'kubernetes.watch', 'kubernetes.stream')))]))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["n1", []]
