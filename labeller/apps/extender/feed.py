"""Keeps the cache true: one cluster-layer Reflector each for pods (not finished), nodes and
kube-system ConfigMaps. A restart loses nothing: the first list rebuilds it all."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from labeller.cluster.kube import Kube
from labeller.cluster.permissions import PermissionLog
from labeller.cluster.reflector import Lister, Obj, Reflector, Watcher
from labeller.apps.extender.cache import ShareCache
from labeller.base.log import get_logger

log = get_logger("gpu_labeller.extender")

UNHEALTHY_NAMESPACE = "kube-system"
# Finished pods hold no GPU memory: leave them out of the list, and a pod that finishes leaves the
# watch as DELETED.
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class Source:
    """One kind of object the cache follows: how to list and watch it, and where it goes."""

    resource: str
    lister: Lister
    watcher: Watcher
    replace: Callable[[list[Obj], str], None]
    changed: Callable[[Obj], None]
    deleted: Callable[[Obj], None]

    def listed(self, items: list[Obj], resource_version: str) -> None:
        self.replace(items, resource_version)
        log.info("listed", reason="list", resource=self.resource, count=len(items))

    def event(self, kind: str, obj: Obj) -> None:
        (self.deleted if kind == "DELETED" else self.changed)(obj)


def sources(kube: Kube, cache: ShareCache) -> list[Source]:
    return [
        Source("pods", lambda: kube.list_pods(field_selector=UNFINISHED),
               lambda rv, timeout_s: kube.watch_pods(rv, field_selector=UNFINISHED, timeout_s=timeout_s),
               cache.replace_pods, cache.pod_changed, cache.pod_deleted),
        Source("nodes", kube.list_nodes, lambda rv, timeout_s: kube.watch_nodes(rv, timeout_s=timeout_s),
               lambda items, rv: cache.replace_nodes(items), cache.node_changed, cache.node_deleted),
        Source("configmaps", lambda: kube.list_config_maps(UNHEALTHY_NAMESPACE),
               lambda rv, timeout_s: kube.watch_config_maps(UNHEALTHY_NAMESPACE, rv, timeout_s=timeout_s),
               lambda items, rv: cache.replace_config_maps(items), cache.config_map_changed,
               lambda cm: cache.config_map_changed(cm, deleted=True)),
    ]


def load_once(kube: Kube, cache: ShareCache) -> None:
    """One list of each source (``inspect``): KubeError when one fails."""
    for source in sources(kube, cache):
        items, rv = source.lister()
        source.replace(items, rv)


class Feed:
    """One Reflector per source, each on its own thread, following it until ``stop`` is set."""

    def __init__(self, kube: Kube, cache: ShareCache, stop: threading.Event, watch_timeout_s: int = 300) -> None:
        self.sources = sources(kube, cache)
        permissions = PermissionLog()
        self.reflectors = [Reflector(source.resource, source.lister, source.watcher, replace=source.listed,
                                     changed=source.event, stop=stop, permissions=permissions,
                                     watch_timeout_s=watch_timeout_s)
                           for source in self.sources]

    @property
    def relists(self) -> int:
        """Lists so far, of every source, the first ones included."""
        return sum(reflector.lists for reflector in self.reflectors)

    def start(self) -> list[threading.Thread]:
        return [reflector.start(f"feed-{reflector.resource}") for reflector in self.reflectors]
