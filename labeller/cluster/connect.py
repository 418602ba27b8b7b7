"""Credentials to the API: a kubeconfig, else the pod's service account, or one line saying why not."""

from __future__ import annotations

from labeller.cluster.kube import Kube, KubeError, Observer
from labeller.errors import InputError


class NoCredentials(InputError):
    """The kubeconfig cannot be used, or there is none and no in-cluster service account."""


def connect(kubeconfig: str | None, *, alternative: str = "", observer: Observer | None = None,
            pool_size: int | None = None) -> Kube:
    """A client with the kubeconfig's credentials, else the pod's; NoCredentials when there are none.
    ``alternative`` is what else the user could do (a flag that needs no credentials)."""
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
