"""This node's ResourceSlices as the API server last told of them: a watch of the slices whose
``spec.nodeName`` is this node (``labeller.cluster.reflector``: list, then watch), and the answers to
the publisher's own writes.

An answer to a write is the newest view of its slice unless the watch already told of something
newer (a later change, or its deletion: someone deleted it as soon as it was written, and the watch
was quicker than the answer). What the server kept of our last write of a slice counts as ours: a
slice that says what the server made of it matches what was written (``matches``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from labeller.cluster.permissions import PermissionLog
from labeller.cluster.reflector import Reflector
from labeller.apps.draplugin.slicecontent import Obj, content, dropped, driver, name, resource_version


class SliceApi(Protocol):
    """The ResourceSlice calls of the cluster adapter (``labeller.cluster.kube.Kube``)."""

    def list_resource_slices(self, node_name: str | None = None,
                             driver: str | None = None) -> tuple[list[Obj], str]: ...

    def watch_resource_slices(self, resource_version: str, node_name: str | None = None, driver: str | None = None,
                              timeout_s: int = 300) -> Iterable[tuple[str, Obj]]: ...

    def create_resource_slice(self, body: Obj) -> Obj: ...

    def update_resource_slice(self, name: str, body: Obj) -> Obj: ...

    def delete_resource_slice(self, name: str, uid: str | None = None) -> None: ...


class LiveSlices:
    """See the module docstring. ``on_change()`` after each change the watch tells of; ``version``
    grows with each of them (not with what the writer's own answers change)."""

    def __init__(self, api: SliceApi, node_name: str, stop: threading.Event, *, on_change: Callable[[], None],
                 permissions: PermissionLog, watch_timeout_s: int = 300) -> None:
        self.on_change = on_change
        self.reflector = Reflector("resourceslices", lambda: api.list_resource_slices(node_name=node_name),
                                   lambda rv, timeout: api.watch_resource_slices(rv, node_name=node_name,
                                                                                 timeout_s=timeout),
                                   replace=self._replace, changed=self._changed, stop=stop,
                                   permissions=permissions, watch_timeout_s=watch_timeout_s,
                                   context={"node": node_name})
        self._lock = threading.Lock()
        self._slices: dict[str, Obj] = {}  # slice name -> the slice on this node, as last seen
        self._listed = False
        # resourceVersions that say a slice absent from ``_slices`` is gone: its deletion, the last list
        self._deleted_at: dict[str, int] = {}
        self._listed_at = 0
        self._echo: dict[str, tuple[Any, Any]] = {}  # slice name -> (content written, content the server kept)
        self._version = 0

    # --- the watch ------------------------------------------------------------------------------

    def _replace(self, items: list[Obj], listed_at: str) -> None:
        with self._lock:
            self._slices = {name(obj): obj for obj in items}
            self._listed = True
            self._listed_at = int(listed_at) if listed_at.isdigit() else 0
            self._deleted_at.clear()
            self._version += 1
        self.on_change()

    def _changed(self, kind: str, obj: Obj) -> None:
        key = name(obj)
        with self._lock:
            current = self._slices.get(key)
            if kind == "DELETED":
                self._deleted_at[key] = max(self._deleted_at.get(key, 0), resource_version(obj))
                if current is not None and resource_version(obj) >= resource_version(current):
                    del self._slices[key]
            elif current is None or resource_version(obj) > resource_version(current):
                self._slices[key] = obj
            else:
                return  # older than what a write of ours answered
            self._version += 1
        self.on_change()

    # --- reading ----------------------------------------------------------------------------------

    def seen(self) -> tuple[int, list[Obj]] | None:
        """(``version``, every slice) as of now; None until the first list."""
        with self._lock:
            return (self._version, list(self._slices.values())) if self._listed else None

    def caught_up(self, version: int) -> bool:
        """Listed, and nothing changed since ``version``."""
        with self._lock:
            return self._listed and self._version == version

    def slices(self) -> list[Obj]:
        with self._lock:
            return list(self._slices.values())

    def pool(self, of: str) -> dict[str, Obj]:
        """The slices of driver ``of``'s pool on this node, by name."""
        with self._lock:
            return {key: s for key, s in self._slices.items() if driver(s) == of}

    def matches(self, wanted: Obj, live: Obj) -> bool:
        """``live`` says what ``wanted`` says, or what the server made of our last write of it."""
        written, kept = content(wanted["spec"]), content(live.get("spec") or {})
        return written == kept or self._echo.get(name(wanted)) == (written, kept)

    # --- the writer's answers ---------------------------------------------------------------------

    def remember(self, written: Obj, answer: Obj) -> set[str]:
        """The server's ``answer`` to a write of ``written`` (see the module docstring); the fields it
        did not keep (``slicecontent.dropped``)."""
        key = name(written)
        ours, kept = content(written["spec"]), content(answer.get("spec") or {})
        with self._lock:
            current = self._slices.get(key)
            newest = (resource_version(current) if current is not None
                      else max(self._deleted_at.get(key, 0), self._listed_at))
            if resource_version(answer) > newest:
                self._slices[key] = answer
            self._echo[key] = (ours, kept)
        return dropped(ours, kept)

    def forget(self, key: str) -> None:
        """The slice named ``key`` was deleted."""
        with self._lock:
            self._slices.pop(key, None)
            self._echo.pop(key, None)
