"""A kubeconfig's static credentials, read as the ``kubernetes`` client's own loader reads them, without
loading that loader.

The client's loader (``kubernetes.config.kube_config``) brings OAuth2 and ``requests`` for OIDC
refreshes and, through the generated ``ApiClient``, pydantic: about 15 MiB that a node process
carries for nothing when its kubeconfig holds a server, its CA and a client certificate or a token,
as kubeadm's, kind's and a ServiceAccount's do. ``static_credentials`` reads exactly those, with the
loader's rules (the current context's cluster and user, ``https`` servers alone take certificates,
``*-data`` is base64 and preferred to the file); anything else (an exec plugin, an auth provider, a
user name and password, a token file, a key it does not know, or a document that is not as
expected) is None, and the client's loader reads it, errors included.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CLUSTER_KEYS = frozenset({"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                          "tls-server-name", "proxy-url", "extensions"})
USER_KEYS = frozenset({"token", "client-certificate", "client-certificate-data", "client-key", "client-key-data",
                       "extensions"})


@dataclass(frozen=True)
class StaticCredentials:
    """What the client's ``Configuration`` is given (its attribute names)."""

    host: str
    ssl_ca_cert: str | None = None  # a file
    cert_file: str | None = None
    key_file: str | None = None
    verify_ssl: bool | None = None  # None: the client's default (verify)
    tls_server_name: str | None = None
    proxy: str | None = None
    token: str | None = None  # the Authorization header's value ("Bearer ...")


def _named(document: Mapping[str, Any], kind: str, name: object) -> Mapping[str, Any] | None:
    """The one entry of ``kind`` called ``name``; None when there is not exactly one."""
    entries = document.get(kind)
    if not isinstance(entries, list) or not isinstance(name, str):
        return None
    found = [e for e in entries if isinstance(e, Mapping) and e.get("name") == name]
    return found[0] if len(found) == 1 else None


def _strings(entry: Mapping[str, Any], known: frozenset[str]) -> bool:
    """Every key known, every value (but a flag's and extensions) a string."""
    return set(entry) <= known and all(isinstance(v, str) for k, v in entry.items()
                                       if k not in ("insecure-skip-tls-verify", "extensions"))


_files: dict[bytes, str] = {}  # content -> the temporary file holding it (as the client's loader keeps them)


def _remove_files() -> None:
    for name in _files.values():
        with contextlib.suppress(OSError):
            os.remove(name)
    _files.clear()


class _NotStatic(Exception):
    """What the kubeconfig says needs the client's loader (to use it, or to say what is wrong)."""


def _file_of(entry: Mapping[str, Any], key: str) -> str | None:
    """``key``'s file: ``key-data`` decoded into a private temporary file (removed at exit), else
    the path ``key`` names; None when neither is given."""
    if f"{key}-data" in entry:
        try:
            content = base64.b64decode(entry[f"{key}-data"], validate=True)
        except (binascii.Error, ValueError):
            raise _NotStatic from None
        if content not in _files:
            if not _files:
                atexit.register(_remove_files)
            fd, name = tempfile.mkstemp(prefix="gpu-labeller-kubeconfig-")  # mode 0600
            with os.fdopen(fd, "wb") as file:
                file.write(content)
            _files[content] = name
        return _files[content]
    if key in entry:
        path = os.path.normpath(str(entry[key]))
        if not os.path.isfile(path):
            raise _NotStatic
        return path
    return None


def static_credentials(document: Mapping[str, Any]) -> StaticCredentials | None:
    """See the module docstring."""
    context_entry = _named(document, "contexts", document.get("current-context"))
    context = context_entry.get("context") if context_entry is not None else None
    if not isinstance(context, Mapping):
        return None
    cluster_entry = _named(document, "clusters", context.get("cluster"))
    cluster = cluster_entry.get("cluster") if cluster_entry is not None else None
    if not isinstance(cluster, Mapping) or not isinstance(cluster.get("server"), str) \
            or not _strings(cluster, CLUSTER_KEYS):
        return None
    user: Mapping[str, Any] = {}
    if context.get("user") and document.get("users"):
        user_entry = _named(document, "users", context["user"])
        if user_entry is not None:
            found = user_entry.get("user")
            if not isinstance(found, Mapping) or not _strings(found, USER_KEYS):
                return None
            user = found
    insecure = cluster.get("insecure-skip-tls-verify")
    if insecure is not None and not isinstance(insecure, bool):
        return None
    host = cluster["server"].rstrip("/")
    files: tuple[str | None, ...] = (None, None, None)
    if host.startswith("https"):
        try:
            files = (_file_of(cluster, "certificate-authority"), _file_of(user, "client-certificate"),
                     _file_of(user, "client-key"))
        except _NotStatic:
            return None
    token = user.get("token")
    return StaticCredentials(host=host, ssl_ca_cert=files[0], cert_file=files[1], key_file=files[2],
                             verify_ssl=None if insecure is None else not insecure,
                             tls_server_name=cluster.get("tls-server-name"), proxy=cluster.get("proxy-url"),
                             token=f"Bearer {token}" if token else None)
