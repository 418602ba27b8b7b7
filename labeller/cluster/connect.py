"""Credentials to the API, found by every command the way kubectl finds them, or one line saying why
there are none.

The rule (``find_kubeconfig``): ``--kubeconfig FILE`` (it must exist); else the files ``KUBECONFIG``
lists (separated by ``:``; a missing one is skipped), merged as kubectl merges them: the first file to
set a cluster, user or context by its name wins, and ``current-context`` comes from the first file
that sets one; else ``~/.kube/config`` when it exists; else (and when the files hold nothing) the
pod's service account. A relative path inside a file (a certificate, a token file, an exec plugin)
is read from that file's directory, as kubectl reads it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labeller.cluster.kube import Kube, KubeError, Observer, REQUEST_TIMEOUT, Unreachable
from labeller.model.documents import DocumentError, read_document
from labeller.base.errors import ClusterError, InputError

KUBECTL_CONFIG = os.path.join("~", ".kube", "config")
NAMED_LISTS = ("clusters", "users", "contexts")
# The paths a kubeconfig entry holds that kubectl reads relative to the file (client-go's
# GetClusterFileReferences and GetAuthInfoFileReferences)
_CLUSTER_PATHS = ("certificate-authority",)
_USER_PATHS = ("client-certificate", "client-key", "tokenFile")


class NoCredentials(InputError):
    """The kubeconfig cannot be used, or there is none and no in-cluster service account."""


@dataclass(frozen=True)
class Kubeconfig:
    """The credentials a command uses: the merged kubeconfig of ``files`` (None: the in-cluster
    service account) and, for an error, where it looked."""

    files: tuple[Path, ...] = ()
    document: dict[str, Any] | None = None
    looked: str = field(default="", compare=False)

    @property
    def where(self) -> str:
        """The files, as an error names them: ``a`` or ``a:b``."""
        return os.pathsep.join(str(path) for path in self.files)


def find_kubeconfig(flag: str | None, environ: Mapping[str, str] | None = None) -> Kubeconfig:
    """The kubeconfig a command uses (see the module's docstring); NoCredentials naming the file when
    one cannot be read or is not a kubeconfig."""
    environ = os.environ if environ is None else environ
    if flag:
        path = Path(os.path.expanduser(flag))
        return _merged((path,), f"--kubeconfig {flag}", explicit=True)
    listed = environ.get("KUBECONFIG", "")
    if listed:
        names = dict.fromkeys(name for name in listed.split(os.pathsep) if name)  # kubectl drops repeats
        paths = tuple(Path(os.path.expanduser(name)) for name in names)
        existing = tuple(path for path in paths if os.path.lexists(path))
        return _merged(existing, f"the files KUBECONFIG lists ({listed}) set nothing" if existing
                       else f"KUBECONFIG={listed} names no file that exists")
    default = Path(os.path.expanduser(KUBECTL_CONFIG))
    if os.path.lexists(default):
        return _merged((default,), f"{KUBECTL_CONFIG} sets nothing")
    return Kubeconfig(looked=f"no --kubeconfig, no KUBECONFIG, no {KUBECTL_CONFIG}")


def _merged(paths: tuple[Path, ...], looked: str, explicit: bool = False) -> Kubeconfig:
    """The kubeconfig files ``paths`` merged as kubectl merges them; no document when they set nothing."""
    merged: dict[str, Any] = {name: [] for name in NAMED_LISTS}
    seen: dict[str, set[str]] = {name: set() for name in NAMED_LISTS}
    for path in paths:
        document = _read(path, explicit)
        for name in NAMED_LISTS:
            for entry in _entries(document, name, path):
                if entry["name"] not in seen[name]:
                    seen[name].add(entry["name"])
                    merged[name].append(_resolved(entry, name, path.parent))
        if not merged.get("current-context") and document.get("current-context"):
            merged["current-context"] = document["current-context"]
    if not any(merged[name] for name in NAMED_LISTS) and not merged.get("current-context"):
        return Kubeconfig(paths, None, looked)  # nothing set: the in-cluster service account, as kubectl
    return Kubeconfig(paths, merged, looked)


def _read(path: Path, explicit: bool) -> dict[str, Any]:
    try:
        document = read_document(path, "kubeconfig")
    except DocumentError as exc:
        raise NoCredentials(str(exc)) from None
    if document is None:
        if explicit:
            raise NoCredentials(f"{path}: not a kubeconfig: the file is empty")
        return {}  # kubectl skips an empty file in KUBECONFIG
    if not isinstance(document, dict):
        raise NoCredentials(f"{path}: not a kubeconfig: a {type(document).__name__}, not a mapping")
    return document


def _entries(document: Mapping[str, Any], name: str, path: Path) -> list[dict[str, Any]]:
    entries = document.get(name) or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                                for e in entries):
        raise NoCredentials(f"{path}: not a kubeconfig: {name} must be a list of entries with a name")
    return entries


def _resolved(entry: dict[str, Any], kind: str, directory: Path) -> dict[str, Any]:
    """``entry`` with the relative paths kubectl resolves made absolute against ``directory``."""
    entry = copy.deepcopy(entry)
    inner = entry.get({"clusters": "cluster", "users": "user"}.get(kind, ""))
    if not isinstance(inner, dict):
        return entry
    for key in _CLUSTER_PATHS if kind == "clusters" else _USER_PATHS:
        value = inner.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            inner[key] = str(directory / value)
    command = (inner.get("exec") or {}).get("command") if isinstance(inner.get("exec"), dict) else None
    if kind == "users" and isinstance(command, str) and os.sep in command and not os.path.isabs(command):
        inner["exec"]["command"] = str(directory / command)  # a command with no slash is looked up on PATH
    return entry


def connect(kubeconfig: str | None, *, alternative: str = "", observer: Observer | None = None,
            pool_size: int = 4, request_timeout: tuple[float, float] = REQUEST_TIMEOUT) -> Kube:
    """A client with the credentials ``find_kubeconfig`` finds (``kubeconfig``: the --kubeconfig
    given); NoCredentials when there are none. ``alternative`` is what else the user could do (a
    flag that needs no credentials)."""
    found = find_kubeconfig(kubeconfig)
    try:
        return Kube(found.document, observer=observer, pool_size=pool_size, request_timeout=request_timeout,
                    where=found.where)
    except KubeError as exc:
        if found.document is not None:
            raise NoCredentials(exc.message) from None  # names the files and what is wrong with them
        suggestion = "give --kubeconfig FILE (env KUBECONFIG)" + (f", or {alternative}" if alternative else "")
        raise NoCredentials(f"no Kubernetes credentials: no kubeconfig ({found.looked}) and no in-cluster service "
                            f"account ({exc.message.rstrip('.')}); {suggestion}") from None


@contextmanager
def calls(kubeconfig: str | None, doing: str) -> Iterator[Kube]:
    """A client for a one-shot command's calls, closed after them. A call that fails is the one line
    ``cannot <doing>: <why>`` (a ClusterError); a server that does not answer keeps its own line."""
    kube = connect(kubeconfig)
    try:
        yield kube
    except Unreachable:
        raise
    except KubeError as exc:
        raise ClusterError(f"cannot {doing}: {exc}") from None
    finally:
        kube.close()
