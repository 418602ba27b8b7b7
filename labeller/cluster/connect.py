"""Credentials to the API: a kubeconfig, else the pod's service account, or one line saying why not."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from labeller.cluster.kube import Kube, KubeError, Observer, Unreachable
from labeller.documents import DocumentError, read_limited
from labeller.errors import ClusterError, InputError


class NoCredentials(InputError):
    """The kubeconfig cannot be used, or there is none and no in-cluster service account."""


def connect(kubeconfig: str | None, *, alternative: str = "", observer: Observer | None = None,
            pool_size: int | None = None) -> Kube:
    """A client with the kubeconfig's credentials, else the pod's; NoCredentials when there are none.
    ``alternative`` is what else the user could do (a flag that needs no credentials)."""
    if kubeconfig:
        _check_kubeconfig_files(kubeconfig)
    try:
        if pool_size is None:
            return Kube(kubeconfig, observer=observer)
        return Kube(kubeconfig, observer=observer, pool_size=pool_size)
    except KubeError as exc:
        if kubeconfig:
            raise NoCredentials(exc.message) from None  # names the file and what is wrong with it
        suggestion = "give --kubeconfig FILE (env KUBECONFIG)" + (f", or {alternative}" if alternative else "")
        raise NoCredentials(f"no Kubernetes credentials: no kubeconfig given and no in-cluster service account "
                            f"({exc.message.rstrip('.')}); {suggestion}") from None


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


def _check_kubeconfig_files(kubeconfig: str) -> None:
    """Each file KUBECONFIG lists that exists must be a regular file of at most 1 MiB: the client would
    wait forever on a FIFO and read a device without end. Missing ones are the client's to report."""
    for name in kubeconfig.split(os.pathsep):
        path = Path(os.path.expanduser(name)) if name else None
        if path is None or not os.path.lexists(path):
            continue
        try:
            read_limited(path, "kubeconfig")
        except DocumentError as exc:
            raise NoCredentials(str(exc)) from None
