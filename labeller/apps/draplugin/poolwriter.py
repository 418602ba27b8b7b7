"""Writes one driver's pool of ResourceSlices on this node, at a generation the scheduler takes.

Every wanted slice of the pool is written (created or updated, with the live resourceVersion) with the
pool's generation bumped past any live one, and the pool's other slices on this node are deleted (a
uid precondition: never one that someone created again meanwhile). A taint published again (the same
device, key, value and effect) keeps the ``timeAdded`` stamp the server gave it.

Generations only compare within the live pool (the scheduler takes the slices of its highest
generation), and the API keeps them in an int64. So the generation written is one past both the live
ones and the last one this process wrote, unless that would pass 2^63-1: then one past the live ones
(a pool someone deleted starts again from 1). A pool that cannot be bumped, because a live slice holds
2^63-1 or because the server refuses a write for good (400: it cannot decode it; 422: invalid), is
started again: its slices on this node are deleted (uid preconditions) and it is written from
generation 1, with one warning per such repair (``reason``: generation-exhausted, write-refused).
A transient failure (5xx, 429, no answer) is only raised, for the publisher to retry.

Fields the server does not keep. After each write of a pool the fields of our slices that the answers
lack (``slicecontent.dropped``) go to ``on_dropped(driver, paths, "")``, once per write that lost some:
the one place where the plugin learns which gates the server has off (``labeller.apps.draplugin.gates``). A
slice the server refuses for good naming fields it carries (a release that takes counter sets only in
slices of their own: ``only one of `sharedCounters` or `devices` is allowed``) goes to the same
listener, with the server's message: where those fields are a gate's that is now off, the pool is not
started again but retried, and by then published without them.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from labeller.apps.draplugin.metrics import DraMetrics
from labeller.apps.draplugin.slicecontent import Obj, TaintKey, generation, name, named_fields, stamps
from labeller.apps.draplugin.sliceview import LiveSlices, SliceApi
from labeller.base.log import get_logger

log = get_logger(__name__)

# (driver, the fields of its slices' specs the server did not keep, as ``dropped`` names them, and "";
# or those of a slice it refused naming them, and its message) -> whether they are a gate's that is off
FieldsDropped = Callable[[str, frozenset[str], str], bool]

INT64_MAX = 2**63 - 1  # the largest pool generation the API can hold
REFUSED = (400, 422)  # answers that say the same request will never be accepted
T = TypeVar("T")


class PoolWriter:
    """See the module docstring. Used by one thread (the publisher's worker)."""

    def __init__(self, api: SliceApi, node_name: str, metrics: DraMetrics, view: LiveSlices,
                 on_dropped: FieldsDropped | None = None) -> None:
        self.api, self.node_name, self.metrics, self.view = api, node_name, metrics, view
        self.on_dropped = on_dropped
        self._generations: dict[str, int] = {}  # driver -> the pool generation this process last wrote
        self._repairing: dict[str, str] = {}  # driver -> why its pool is being started again, until written
        self._started_again: set[str] = set()  # drivers whose pool was deleted for that, until written
        self._refused_fields: set[str] = set()  # drivers whose slices were refused for a gate's fields, until written

    def reconcile(self, driver: str, wanted: list[Obj], live: dict[str, Obj]) -> None:
        """Make ``driver``'s pool on this node ``wanted`` (its slices, generation not yet set) where
        ``live`` (its slices as seen, by name) differs: the same slice names, the same content, one
        generation across the pool is equal. Raises the adapter's ``KubeError`` for a retry."""
        from labeller.cluster.kube import KubeError

        if self._in_sync(wanted, live):
            self._written(driver)
            return
        top = max((generation(s) for s in live.values()), default=0)
        if top >= INT64_MAX:
            live = self._start_again(driver, "generation-exhausted", generation=top)
        try:
            self._write_pool(driver, wanted, live)
        except KubeError as exc:
            if (exc.status not in REFUSED or not live or driver in self._started_again
                    or driver in self._refused_fields):
                # transient, refused with no old slice in the way (what we write is wrong), or refused for a
                # gate's fields (published again without them): retried
                raise
            self._write_pool(driver, wanted, self._start_again(driver, "write-refused", error=str(exc)))

    def _in_sync(self, wanted: list[Obj], live: dict[str, Obj]) -> bool:
        if {name(s) for s in wanted} != set(live) or len({generation(s) for s in live.values()}) > 1:
            return False
        return all(self.view.matches(s, live[name(s)]) for s in wanted)

    # --- repairs ----------------------------------------------------------------------------------

    def _start_again(self, driver: str, reason: str, **why: Any) -> dict[str, Obj]:
        """Delete every slice of ``driver``'s pool on this node and forget its generation, so that it is
        written again from 1; the pool as now seen (nothing). Says why once per repair, not per retry."""
        if self._repairing.get(driver) != reason:
            log.warning("ResourceSlice pool cannot be bumped: deleting its slices and publishing it again "
                        "from generation 1", reason=reason, driver=driver, node=self.node_name, **why)
            self._repairing[driver] = reason
        self._delete(self.view.pool(driver))
        self._generations[driver] = 0
        self._started_again.add(driver)
        return {}

    def _written(self, driver: str) -> None:
        """The pool is as published: a repair under way is over."""
        self._repairing.pop(driver, None)
        self._started_again.discard(driver)
        self._refused_fields.discard(driver)

    def _next_generation(self, driver: str, live: dict[str, Obj]) -> int:
        top = max((generation(s) for s in live.values()), default=0)
        bumped = max(top, self._generations.get(driver, 0)) + 1
        # past the int64: only ever what this process wrote before and is gone: it no longer counts
        return top + 1 if bumped > INT64_MAX else bumped

    # --- writes -----------------------------------------------------------------------------------

    def _write_pool(self, driver: str, wanted: list[Obj], live: dict[str, Obj]) -> None:
        """Write ``wanted`` at a generation past every live one, and delete the pool's other slices."""
        at = self._next_generation(driver, live)
        lost: set[str] = set()
        stamped = stamps(live.values())
        for slice_ in wanted:
            body = _body(slice_, at, stamped)
            lost |= self.view.remember(body, self._put(driver, body, live.get(name(body))))
        self._generations[driver] = at  # only once written: a refused write takes no generation
        names = {name(s) for s in wanted}
        stale = {key: s for key, s in live.items() if key not in names}
        self._delete(stale)
        self._written(driver)
        log.info("ResourceSlices published", driver=driver, node=self.node_name, generation=at,
                 slices=len(wanted), devices=sum(len(s["spec"]["devices"]) for s in wanted), removed=len(stale))
        if lost and self.on_dropped is not None:
            self.on_dropped(driver, frozenset(lost), "")

    def _put(self, driver: str, body: Obj, existing: Obj | None) -> Obj:
        """Create ``body``, or update ``existing`` (its resourceVersion) to it; the server's answer."""
        from labeller.cluster.kube import KubeError

        try:
            if existing is None:
                return self._write("create", functools.partial(self.api.create_resource_slice, body))
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            return self._write("update", functools.partial(self.api.update_resource_slice, name(body), body))
        except KubeError as exc:
            if exc.status in REFUSED and self._gate_refused(driver, body["spec"], exc.message):
                self._refused_fields.add(driver)
            raise

    def _gate_refused(self, driver: str, spec: Obj, message: str) -> bool:
        """A slice refused for good: its fields the server's message names go to ``on_dropped``; whether
        they are a gate's that is off (then the pool is published again without them, not started again)."""
        named = named_fields(spec, message)
        return bool(named) and self.on_dropped is not None and self.on_dropped(driver, named, message)

    def _delete(self, slices: Mapping[str, Obj]) -> None:
        """Delete these slices, each only while it is the one seen (a uid precondition)."""
        from labeller.cluster.kube import NotFound

        for key in sorted(slices):
            try:
                self._write("delete", functools.partial(self.api.delete_resource_slice, key,
                                                        slices[key]["metadata"].get("uid")))
            except NotFound:
                pass
            self.view.forget(key)

    def _write(self, verb: str, call: Callable[[], T]) -> T:
        try:
            answer = call()
        except Exception:
            self.metrics.slice_writes.labels(verb=verb, outcome="failed").inc()
            raise
        self.metrics.slice_writes.labels(verb=verb, outcome="ok").inc()
        return answer


def _body(wanted: Obj, at: int, stamped: Mapping[TaintKey, str]) -> Obj:
    """A wanted slice to write at generation ``at``, each taint published before with its stamp."""
    body = copy.deepcopy(wanted)
    body["spec"]["pool"]["generation"] = at
    for device in body["spec"].get("devices") or []:
        for taint in device.get("taints") or []:
            stamp = stamped.get((device["name"], taint["key"], taint.get("value", ""), taint["effect"]))
            if stamp is not None and "timeAdded" not in taint:
                taint["timeAdded"] = stamp
    return body
