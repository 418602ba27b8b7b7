"""Keeps the cache true: for pods, nodes and kube-system ConfigMaps, list, then watch from the list's
resourceVersion; a watch that ends is resumed, one whose resourceVersion is too old (410 Gone) lists
again, and API errors retry with backoff. A restart loses nothing: the first list rebuilds it all."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from labeller.extender.cache import ShareCache
from labeller.kube import Gone, Kube, KubeError
from labeller.runtime import Backoff

log = structlog.get_logger("gpu_labeller.extender")

Obj = dict[str, Any]
UNHEALTHY_NAMESPACE = "kube-system"
# Finished pods hold no GPU memory: leave them out of the list, and a pod that finishes leaves the
# watch as DELETED.
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class Source:
    resource: str
    lister: Callable[[], tuple[list[Obj], str]]
    watcher: Callable[[str], Iterator[tuple[str, Obj]]]
    replace: Callable[[list[Obj], str], None]
    changed: Callable[[Obj], None]
    deleted: Callable[[Obj], None]


def sources(kube: Kube, cache: ShareCache, watch_timeout_s: int = 300) -> list[Source]:
    return [
        Source("pods", lambda: kube.list_pods(field_selector=UNFINISHED),
               lambda rv: kube.watch_pods(rv, field_selector=UNFINISHED, timeout_s=watch_timeout_s),
               cache.replace_pods, cache.pod_changed, cache.pod_deleted),
        Source("nodes", kube.list_nodes, lambda rv: kube.watch_nodes(rv, timeout_s=watch_timeout_s),
               lambda items, rv: cache.replace_nodes(items), cache.node_changed, cache.node_deleted),
        Source("configmaps", lambda: kube.list_config_maps(UNHEALTHY_NAMESPACE),
               lambda rv: kube.watch_config_maps(UNHEALTHY_NAMESPACE, rv, timeout_s=watch_timeout_s),
               lambda items, rv: cache.replace_config_maps(items), cache.config_map_changed,
               lambda cm: cache.config_map_changed(cm, deleted=True)),
    ]


def load_once(kube: Kube, cache: ShareCache) -> None:
    """One list of each source (``inspect``): KubeError when one fails."""
    for source in sources(kube, cache):
        items, rv = source.lister()
        source.replace(items, rv)


class Feed:
    """One thread per source, following it until ``stop`` is set."""

    def __init__(self, kube: Kube, cache: ShareCache, stop: threading.Event, watch_timeout_s: int = 300) -> None:
        self.sources = sources(kube, cache, watch_timeout_s)
        self.stop = stop
        self.relists = 0

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.follow, args=(source,), name=f"feed-{source.resource}", daemon=True)
                   for source in self.sources]
        for thread in threads:
            thread.start()
        return threads

    def follow(self, source: Source) -> None:
        backoff = Backoff(base_s=0.2, cap_s=30.0)
        rv: str | None = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    items, rv = source.lister()
                    source.replace(items, rv)
                    self.relists += 1
                    log.info("listed", reason="list", resource=source.resource, count=len(items))
                for kind, obj in source.watcher(rv):
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind in ("ADDED", "MODIFIED"):
                        source.changed(obj)
                    elif kind == "DELETED":
                        source.deleted(obj)
                    if self.stop.is_set():
                        return
                backoff.reset()
            except Gone:
                log.info("watch expired, listing again", reason="gone", resource=source.resource)
                rv = None
            except KubeError as exc:
                delay = backoff.next()
                log.warning("cannot follow the cluster, retrying", reason="api-error", resource=source.resource,
                            error=str(exc), retry_in_s=round(delay, 2))
                self.stop.wait(delay)
