"""The one list-then-watch loop: keeps a local view of a kind of object true.

A ``Reflector`` lists (its ``lister`` pages through the list), hands the items to ``replace``, then
watches from the list's resourceVersion and hands each event to ``changed``.

- A watch that ends is resumed from the last resourceVersion seen.
- One whose resourceVersion is too old (410 Gone) lists again.
- Any other failure, of the list or of the watch (a broken stream too), calls ``stale`` (the
  holder's view is no longer trusted) and lists again after a jittered backoff: a list makes the
  view true at once, where a resumed watch would say nothing until the next change. Retries come
  at most about 1 s apart during the first minute of an outage (so what the view drives is
  repaired within about a second of the API answering again), then further apart, up to 10 s.
  The backoff starts again only once a watch works, so it never loops tightly.
- A 403 goes to the ``PermissionLog``: one line, quiet until the request works again.
- An outage is one warning, then debug lines; its end is one info line with its duration.
- It stops when ``stop`` is set.

This module does not load the Kubernetes client: the adapter's errors are imported when it runs.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from labeller.cluster.permissions import PermissionLog
from labeller.base.backoff import Backoff
from labeller.base.log import get_logger

log = get_logger("gpu_labeller.cluster")

Obj = dict[str, Any]
Lister = Callable[[], tuple[list[Obj], str]]  # () -> (every item, the list's resourceVersion)
Watcher = Callable[[str, int], Iterable[tuple[str, Obj]]]  # (resourceVersion, timeout_s) -> (event type, object)
# A watch that ends this soon having brought nothing is waited on like a failure, never resumed at once.
SHORTEST_WATCH_S = 1.0


class Outage:
    """One outage of a list-and-watch, as the log tells it: a warning when it begins, debug lines while
    it lasts, one info line with its duration when a list works again."""

    def __init__(self, resource: str, context: dict[str, str]) -> None:
        self.resource, self.context = resource, context
        self.since: float | None = None  # when it began (monotonic); None: no outage

    def begin_quietly(self) -> None:
        """An outage that something else reported (a 403, to the permission log)."""
        self.since = self.since or time.monotonic()

    def failed(self, exc: Exception, retry_in_s: float) -> None:
        fields = {"reason": "api-error", "resource": self.resource, "error": str(exc),
                  "retry_in_s": round(retry_in_s, 2), **self.context}
        if self.since is None:
            self.since = time.monotonic()
            log.warning("watch failed, retrying", **fields)
        else:
            log.debug("watch failed again", **fields)

    def ended(self) -> None:
        if self.since is not None:
            log.info("watch works again", reason="api-recovered", resource=self.resource,
                     down_s=round(time.monotonic() - self.since, 1), **self.context)
            self.since = None


class Reflector:
    """See the module docstring. ``replace(items, resource_version)`` after each list;
    ``changed(event_type, obj)`` for each ADDED, MODIFIED or DELETED event (bookmarks only move the
    resourceVersion on); ``stale()`` when the view may no longer be true (a list or watch failed).
    ``context`` goes into every log line (``node=...``)."""

    def __init__(self, resource: str, lister: Lister, watcher: Watcher, *,
                 replace: Callable[[list[Obj], str], None], changed: Callable[[str, Obj], None],
                 stop: threading.Event, permissions: PermissionLog | None = None,
                 stale: Callable[[], None] = lambda: None, watch_timeout_s: int = 300,
                 context: Mapping[str, str] | None = None) -> None:
        self.resource, self.lister, self.watcher = resource, lister, watcher
        self.replace, self.changed, self.stale = replace, changed, stale
        self.stop = stop
        self.permissions = permissions if permissions is not None else PermissionLog()
        self.watch_timeout_s = watch_timeout_s
        self.lists = 0  # every list, the first included
        self.backoff = Backoff(base_s=0.2, cap_s=10.0, quick_cap_s=1.0, quick_for_s=60.0)
        self.outage = Outage(resource, dict(context or {}))

    @property
    def context(self) -> dict[str, str]:
        return self.outage.context

    def start(self, name: str | None = None) -> threading.Thread:
        """``run`` on a daemon thread of its own."""
        thread = threading.Thread(target=self.run, name=name or f"reflect-{self.resource}", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        """List and watch until ``stop`` is set."""
        from labeller.cluster.kube import Forbidden, Gone, KubeError

        while not self.stop.is_set():
            failure: KubeError | None = None
            try:
                self._list_then_watch()
                continue
            except Gone:
                log.info("watch expired, listing again", reason="gone", resource=self.resource, **self.context)
            except Forbidden as exc:
                self.stale()
                self.permissions.report(exc, **self.context)
                self.outage.begin_quietly()  # the permission log said it
            except KubeError as exc:
                self.stale()
                failure = exc
            delay = self.backoff.next()  # never a tight list-watch loop, even if 410 repeats
            if failure is not None:
                self.outage.failed(failure, delay)
            self.stop.wait(delay)

    def _list_then_watch(self) -> None:
        items, resource_version = self.lister()
        self.lists += 1
        self.permissions.granted("list", resource=self.resource)
        self.outage.ended()
        self.replace(items, resource_version)
        while not self.stop.is_set():
            began, events = time.monotonic(), 0
            timeout = int(self.watch_timeout_s * random.uniform(1.0, 1.2))
            for kind, obj in self.watcher(resource_version, timeout):
                if events == 0:  # the watch works: the next failure is a new one
                    self.permissions.granted("watch", resource=self.resource)
                    self.backoff.reset()
                events += 1
                resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.changed(kind, obj)
                if self.stop.is_set():
                    return
            if events or time.monotonic() - began >= SHORTEST_WATCH_S:
                self.permissions.granted("watch", resource=self.resource)
                self.backoff.reset()
            else:
                self.stop.wait(self.backoff.next())
