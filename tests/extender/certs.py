"""Certificates for the extender's TLS tests, made with the ``openssl`` command: a CA, a server
certificate for localhost/127.0.0.1, a client certificate the CA signed, and one signed by a stranger."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate another CA signed
    stranger_key: Path


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> None:
    _openssl(directory, "req", "-x509", *EC, "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN={name}")


def _signed(directory: Path, name: str, ca: str, extensions: str) -> None:
    _openssl(directory, "req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "stranger-ca")
    _signed(directory, "server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _signed(directory, "kube-scheduler", "ca", "extendedKeyUsage=clientAuth\n")
    _signed(directory, "stranger", "stranger-ca", "extendedKeyUsage=clientAuth\n")
    return Certs(directory / "ca.crt", directory / "server.crt", directory / "server.key",
                 directory / "kube-scheduler.crt", directory / "kube-scheduler.key",
                 directory / "stranger.crt", directory / "stranger.key")
