"""Keeps this node's ResourceSlices equal to what the plugin publishes, writing only what differs.

``publish(devices_by_driver)`` says what each driver's pool holds from now on. A watch of the
ResourceSlices whose ``spec.nodeName`` is this node (``labeller.cluster.reflector``: list, then
watch) keeps a live view of them, and a worker thread compares it with what is wanted, per driver:

- equal (the same slice names, the same content, one generation across the pool): nothing is
  written. The content is compared as the API keeps it: a capacity quantity in another notation is
  the same quantity, and what the server made of our last write of a slice counts as ours;
- different: every wanted slice of the pool is written (created or updated, with the live
  resourceVersion) with the pool's generation bumped past any live one, and the pool's other slices
  on this node are deleted (a uid precondition: never one that someone created again meanwhile).

Generations only compare within the live pool (the scheduler takes the slices of its highest
generation), and the API keeps them in an int64. So the generation written is one past both the live
ones and the last one this process wrote, unless that would pass 2^63-1: then one past the live ones
(a pool someone deleted starts again from 1). A pool that cannot be bumped, because a live slice holds
2^63-1 or because the server refuses a write for good (400: it cannot decode it; 422: invalid), is
started again: its slices on this node are deleted (uid preconditions) and it is written from
generation 1, with one warning per such repair (``reason``: generation-exhausted, write-refused).
A transient failure (5xx, 429, no answer) is only retried.

Fields the server does not keep. An API server drops the fields of an alpha feature gate it does not
enable (``allowMultipleAllocations`` without ``DRAConsumableCapacity``, a device's ``taints`` without
``DRADeviceTaints``, ...) from what it stores, and answers the write with the slice as stored. After
each write of a pool the fields of our slices that the answers lack (``dropped``: paths such as
``devices[].allowMultipleAllocations``) go to ``on_dropped(driver, paths)``, once per write that lost
some: the one place where the plugin learns which gates the server has off, for every feature that
publishes gated fields (``labeller.draplugin.gates``). What the server kept counts as ours (no write
loop); the listener decides what to publish instead. A slice the server refuses for good naming
fields it carries (a release that takes counter sets only in slices of their own:
``only one of `sharedCounters` or `devices` is allowed``) goes to the same listener, with the
server's message: where those fields are a gate's that is now off, the pool is not started again but
retried, and by then published without them.

A taint's ``timeAdded`` is the server's stamp (``Device.taints``, the DRA plugin's health taints): a
taint published again (the same device, key, value and effect) keeps the stamp it has, and the stamp
alone is never a difference.

So stale slices of a driver for this node are replaced at start, an external delete (a kubelet that
starts deletes its node's slices) is repaired as soon as the watch says so, a driver published
before and not now has its slices removed, and slices of other drivers or nodes are never touched.
A failed write is retried after a jittered backoff (at most about 1 s apart during the first minute
of an outage); the reflector lists again after a broken watch, so the view is true again within
about a second of the API answering.
"""

from __future__ import annotations

import copy
import functools
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any, Protocol

import structlog

from labeller.cluster.permissions import PermissionLog
from labeller.quantity import parse as parse_quantity
from labeller.cluster.reflector import Reflector
from labeller.draplugin.metrics import DraMetrics
from labeller.resourceslices import DraDevice, resource_slices
from labeller.backoff import Backoff

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
SliceLayout = Callable[[str, Mapping[str, Sequence[DraDevice]], int], list[Obj]]
# (driver, the fields of its slices' specs the server did not keep, as ``dropped`` names them, and "";
# or those of a slice it refused naming them, and its message) -> whether they are a gate's that is off
FieldsDropped = Callable[[str, frozenset[str], str], bool]

INT64_MAX = 2**63 - 1  # the largest pool generation the API can hold
REFUSED = (400, 422)  # answers that say the same request will never be accepted


class SliceApi(Protocol):
    """The ResourceSlice calls of the cluster adapter (``labeller.cluster.kube.Kube``)."""

    def list_resource_slices(self, node_name: str | None = None,
                             driver: str | None = None) -> tuple[list[Obj], str]: ...

    def watch_resource_slices(self, resource_version: str, node_name: str | None = None, driver: str | None = None,
                              timeout_s: int = 300) -> Iterable[tuple[str, Obj]]: ...

    def create_resource_slice(self, body: Obj) -> Obj: ...

    def update_resource_slice(self, name: str, body: Obj) -> Obj: ...

    def delete_resource_slice(self, name: str, uid: str | None = None) -> None: ...


def quantity(text: str) -> Fraction | str:
    """A Kubernetes quantity's value ("80Gi" and "85899345920" are the same); the text itself when
    it is not one."""
    value = parse_quantity(text)
    return text if value is None else value


def _canonical(value: Any) -> Any:
    """``value`` without what the API leaves out (empty, false and null fields)."""
    if isinstance(value, dict):
        return {k: c for k, v in value.items() if (c := _canonical(v)) not in (None, False, {}, [], "")}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _quantities(holder: Obj, *keys: str) -> None:
    """``holder``'s quantities at ``keys`` (a list of them too) as values, in place."""
    for key in keys:
        value = holder.get(key)
        if isinstance(value, str):
            holder[key] = quantity(value)
        elif isinstance(value, list):
            holder[key] = [quantity(v) if isinstance(v, str) else v for v in value]


def _counted(counters: Any) -> None:
    """Each counter's ``value`` of a ``counters`` map (a counter set's, a device's use of one) as a value."""
    for counter in (counters or {}).values() if isinstance(counters, dict) else ():
        if isinstance(counter, dict):
            _quantities(counter, "value")


def content(spec: Obj) -> Any:
    """What a slice says, for comparing: its spec without the pool's generation and the taints' stamps,
    quantities (capacities, request policies, counters) as values."""
    spec = copy.deepcopy(spec)
    (spec.get("pool") or {}).pop("generation", None)
    for counter_set in spec.get("sharedCounters") or []:
        if isinstance(counter_set, dict):
            _counted(counter_set.get("counters"))
    for device in spec.get("devices") or []:
        for capacity in (device.get("capacity") or {}).values():
            if not isinstance(capacity, dict):
                continue
            _quantities(capacity, "value")
            policy = capacity.get("requestPolicy")
            if isinstance(policy, dict):
                _quantities(policy, "default", "validValues")
                if isinstance(policy.get("validRange"), dict):
                    _quantities(policy["validRange"], "min", "max", "step")
        for taint in device.get("taints") or []:
            if isinstance(taint, dict):
                taint.pop("timeAdded", None)
        for use in device.get("consumesCounters") or []:
            if isinstance(use, dict):
                _counted(use.get("counters"))
    return _canonical(spec)


def dropped(written: Any, kept: Any, path: str = "") -> set[str]:
    """The fields of ``written`` that ``kept`` lacks (both as ``content`` gives them): their paths, keys
    joined by dots and a list's items as ``[]`` (``devices[].allowMultipleAllocations``,
    ``devices[].capacity.memory.requestPolicy``); a field missing whole is named, not what it held.
    A value the server changed is not dropped."""
    found: set[str] = set()
    if isinstance(written, dict) and isinstance(kept, dict):
        for key, value in written.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in kept:
                found.add(where)
            else:
                found |= dropped(value, kept[key], where)
    elif isinstance(written, list) and isinstance(kept, list):
        for ours, theirs in zip(written, kept):
            found |= dropped(ours, theirs, f"{path}[]")
    return found


def _paths(value: Any, path: str = "") -> Iterator[str]:
    """The path of every field in ``value`` (as ``dropped`` names them), each list item's as ``[]``."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            yield where
            yield from _paths(item, where)
    elif isinstance(value, list):
        for item in value:
            yield from _paths(item, f"{path}[]")


def named_fields(spec: Obj, message: str) -> frozenset[str]:
    """The fields of ``spec`` whose name (a path's last key) ``message`` holds as a word."""
    words = set(re.findall(r"[A-Za-z0-9_-]+", message))
    return frozenset(p for p in _paths(content(spec)) if p.rpartition(".")[2].removesuffix("[]") in words)


def _stamps(slices: Iterable[Obj]) -> dict[tuple[str, str, str, str], str]:
    """(device, key, value, effect) -> timeAdded of every taint in these slices."""
    return {(str(device.get("name")), str(taint.get("key")), str(taint.get("value") or ""), str(taint.get("effect"))):
            taint["timeAdded"]
            for s in slices for device in (s.get("spec") or {}).get("devices") or []
            for taint in device.get("taints") or [] if isinstance(taint, dict) and taint.get("timeAdded")}


def _rv(obj: Obj) -> int:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "0")
    return int(text) if text.isdigit() else 0


def _generation(obj: Obj) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


class SlicePublisher:
    """See the module docstring. ``start`` the watch and the worker; ``publish`` any number of times."""

    def __init__(self, api: SliceApi, node_name: str, metrics: DraMetrics, stop: threading.Event, *,
                 layout: SliceLayout = resource_slices, permissions: PermissionLog | None = None,
                 watch_timeout_s: int = 300, on_dropped: FieldsDropped | None = None) -> None:
        self.api, self.node_name, self.metrics, self.stop = api, node_name, metrics, stop
        self.layout = layout
        self.on_dropped = on_dropped
        self.permissions = permissions or PermissionLog()
        self.reflector = Reflector("resourceslices", lambda: api.list_resource_slices(node_name=node_name),
                                   lambda rv, timeout: api.watch_resource_slices(rv, node_name=node_name,
                                                                                 timeout_s=timeout),
                                   replace=self._replace, changed=self._changed, stop=stop,
                                   permissions=self.permissions, watch_timeout_s=watch_timeout_s,
                                   context={"node": node_name})
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._wanted: dict[str, list[Obj]] = {}  # driver -> its slices (generation not yet set)
        self._drivers: set[str] = set()  # every driver published by this process, until its slices are gone
        self._live: dict[str, Obj] = {}  # slice name -> the slice on this node, as last seen
        self._listed = False
        # resourceVersions that say a slice absent from ``_live`` is gone: its deletion, the last list
        self._deleted_at: dict[str, int] = {}
        self._listed_at = 0
        self._echo: dict[str, tuple[Any, Any]] = {}  # slice name -> (content written, content the server kept)
        self._generations: dict[str, int] = {}  # driver -> the pool generation this process last wrote
        self._repairing: dict[str, str] = {}  # driver -> why its pool is being started again, until written
        self._started_again: set[str] = set()  # drivers whose pool was deleted for that, until written
        self._refused_fields: set[str] = set()  # drivers whose slices were refused for a gate's fields, until written
        self._changes = 0  # grows with every publish and every change seen; reconciling catches up with it
        self._reconciled = -1
        self._worker: threading.Thread | None = None

    # --- inputs (any thread) -------------------------------------------------------------------

    def publish(self, devices_by_driver: Mapping[str, Sequence[DraDevice]]) -> None:
        """Each driver's pool holds exactly these devices from now on; a driver missing here that was
        published before has its slices deleted."""
        wanted = {driver: self.layout(self.node_name, {driver: devices}, 0)
                  for driver, devices in devices_by_driver.items()}
        with self._lock:
            if wanted == self._wanted:
                return
            self._wanted = wanted
            self._drivers |= set(wanted)
            self._changes += 1
        self._wake.set()

    def _replace(self, items: list[Obj], resource_version: str) -> None:
        with self._lock:
            self._live = {_name(obj): obj for obj in items}
            self._listed = True
            self._listed_at = int(resource_version) if resource_version.isdigit() else 0
            self._deleted_at.clear()
            self._changes += 1
        self._wake.set()

    def _changed(self, kind: str, obj: Obj) -> None:
        name = _name(obj)
        with self._lock:
            current = self._live.get(name)
            if kind == "DELETED":
                self._deleted_at[name] = max(self._deleted_at.get(name, 0), _rv(obj))
                if current is not None and _rv(obj) >= _rv(current):
                    del self._live[name]
            elif current is None or _rv(obj) > _rv(current):
                self._live[name] = obj
            else:
                return  # older than what a write of ours answered
            self._changes += 1
        self._wake.set()

    # --- state ------------------------------------------------------------------------------------

    @property
    def in_sync(self) -> bool:
        """The slices on the API are what was last published (as of the last change seen)."""
        with self._lock:
            return self._listed and self._reconciled == self._changes

    def live(self) -> list[Obj]:
        """This node's slices as last seen."""
        with self._lock:
            return list(self._live.values())

    # --- the worker ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.reflector.start("dra-slices-watch")
        self._worker = threading.Thread(target=self._run, name="dra-slices-publish", daemon=True)
        self._worker.start()

    def join(self, timeout: float = 5.0) -> None:
        """Wait for the worker to finish its write, once ``stop`` is set. (The watch thread ends with
        its stream; nothing waits for it.)"""
        self._wake.set()
        if self._worker is not None:
            self._worker.join(timeout)

    def _run(self) -> None:
        from labeller.cluster.kube import Forbidden, KubeError

        backoff = Backoff(base_s=0.2, cap_s=10.0, quick_cap_s=1.0, quick_for_s=60.0)
        failing_since: float | None = None
        while not self.stop.is_set():
            self._wake.wait()
            self._wake.clear()  # before reading the state: a change that comes later wakes the next wait
            if self.stop.is_set():
                return
            try:
                self._reconcile()
            except KubeError as exc:
                if isinstance(exc, Forbidden):
                    self.permissions.report(exc, node=self.node_name)
                elif failing_since is None:
                    log.warning("ResourceSlices not written; retrying", reason="api-error", error=str(exc))
                failing_since = failing_since or time.monotonic()
                self.stop.wait(backoff.next())
                self._wake.set()
                continue
            if failing_since is not None:
                log.info("ResourceSlices written again", reason="api-recovered",
                         down_s=round(time.monotonic() - failing_since, 1))
                self.permissions.granted("create", "update", "delete", resource="resourceslices")
                failing_since = None
            backoff.reset()

    def _reconcile(self) -> None:
        with self._lock:
            if not self._listed:
                return
            changes, wanted, drivers, live = (self._changes, dict(self._wanted), set(self._drivers),
                                              list(self._live.values()))
        for driver in sorted(drivers):
            mine = {_name(s): s for s in live if (s.get("spec") or {}).get("driver") == driver}
            self._reconcile_pool(driver, wanted.get(driver, []), mine)
            if driver not in wanted and not mine:
                with self._lock:
                    self._drivers.discard(driver)
        with self._lock:
            self._reconciled = max(self._reconciled, changes)

    def _matches(self, wanted: Obj, live: Obj) -> bool:
        written, kept = content(wanted["spec"]), content(live.get("spec") or {})
        return written == kept or self._echo.get(_name(wanted)) == (written, kept)

    def _in_sync(self, wanted: list[Obj], live: dict[str, Obj]) -> bool:
        if {_name(s) for s in wanted} != set(live) or len({_generation(s) for s in live.values()}) > 1:
            return False
        return all(self._matches(s, live[_name(s)]) for s in wanted)

    def _reconcile_pool(self, driver: str, wanted: list[Obj], live: dict[str, Obj]) -> None:
        from labeller.cluster.kube import KubeError

        if self._in_sync(wanted, live):
            self._written(driver)
            return
        top = max((_generation(s) for s in live.values()), default=0)
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

    def _start_again(self, driver: str, reason: str, **why: Any) -> dict[str, Obj]:
        """Delete every slice of ``driver``'s pool on this node and forget its generation, so that it is
        written again from 1; the pool as now seen (nothing). Says why once per repair, not per retry."""
        if self._repairing.get(driver) != reason:
            log.warning("ResourceSlice pool cannot be bumped: deleting its slices and publishing it again "
                        "from generation 1", reason=reason, driver=driver, node=self.node_name, **why)
            self._repairing[driver] = reason
        with self._lock:
            pool = {name: s for name, s in self._live.items() if (s.get("spec") or {}).get("driver") == driver}
        self._delete(pool)
        self._generations[driver] = 0
        self._started_again.add(driver)
        return {}

    def _written(self, driver: str) -> None:
        """The pool is as published: a repair under way is over."""
        self._repairing.pop(driver, None)
        self._started_again.discard(driver)
        self._refused_fields.discard(driver)

    def _write_pool(self, driver: str, wanted: list[Obj], live: dict[str, Obj]) -> None:
        """Write ``wanted`` at a generation past every live one, and delete the pool's other slices."""
        from labeller.cluster.kube import KubeError

        top = max((_generation(s) for s in live.values()), default=0)
        generation = max(top, self._generations.get(driver, 0)) + 1
        if generation > INT64_MAX:  # only ever what this process wrote before and is gone: it no longer counts
            generation = top + 1
        lost: set[str] = set()
        stamps = _stamps(live.values())
        for slice_ in wanted:
            body = copy.deepcopy(slice_)
            body["spec"]["pool"]["generation"] = generation
            for device in body["spec"].get("devices") or []:
                for taint in device.get("taints") or []:
                    stamp = stamps.get((device["name"], taint["key"], taint.get("value", ""), taint["effect"]))
                    if stamp is not None and "timeAdded" not in taint:
                        taint["timeAdded"] = stamp
            existing = live.get(_name(body))
            try:
                if existing is None:
                    answer = self._write("create", functools.partial(self.api.create_resource_slice, body))
                else:
                    body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                    answer = self._write("update", functools.partial(self.api.update_resource_slice, _name(body),
                                                                     body))
            except KubeError as exc:
                if exc.status in REFUSED and self._gate_refused(driver, body["spec"], exc.message):
                    self._refused_fields.add(driver)
                raise
            lost |= self._remember(body, answer)
        self._generations[driver] = generation  # only once written: a refused write takes no generation
        names = {_name(s) for s in wanted}
        stale = {name: s for name, s in live.items() if name not in names}
        self._delete(stale)
        self._written(driver)
        log.info("ResourceSlices published", driver=driver, node=self.node_name, generation=generation,
                 slices=len(wanted), devices=sum(len(s["spec"]["devices"]) for s in wanted), removed=len(stale))
        if lost and self.on_dropped is not None:
            self.on_dropped(driver, frozenset(lost), "")

    def _gate_refused(self, driver: str, spec: Obj, message: str) -> bool:
        """A slice refused for good: its fields the server's message names go to ``on_dropped``; whether
        they are a gate's that is off (then the pool is published again without them, not started again)."""
        named = named_fields(spec, message)
        return bool(named) and self.on_dropped is not None and self.on_dropped(driver, named, message)

    def _delete(self, slices: dict[str, Obj]) -> None:
        """Delete these slices, each only while it is the one seen (a uid precondition)."""
        from labeller.cluster.kube import NotFound

        for name in sorted(slices):
            try:
                self._write("delete", functools.partial(self.api.delete_resource_slice, name,
                                                        slices[name]["metadata"].get("uid")))
            except NotFound:
                pass
            with self._lock:
                self._live.pop(name, None)
                self._echo.pop(name, None)

    def _write(self, verb: str, call: Callable[[], Any]) -> Any:
        try:
            answer = call()
        except Exception:
            self.metrics.slice_writes.labels(verb=verb, outcome="failed").inc()
            raise
        self.metrics.slice_writes.labels(verb=verb, outcome="ok").inc()
        return answer

    def _remember(self, written: Obj, answer: Obj) -> set[str]:
        """The server's answer to a write is the newest view of that slice, unless the watch already
        told of something newer: a later change, or its deletion (someone deleted it as soon as it was
        written, and the watch was quicker than the answer). What it kept of the write is what counts
        as ours from now on; the fields it did not keep are returned (``dropped``)."""
        name = _name(written)
        ours, kept = content(written["spec"]), content(answer.get("spec") or {})
        with self._lock:
            current = self._live.get(name)
            newest = _rv(current) if current is not None else max(self._deleted_at.get(name, 0), self._listed_at)
            if _rv(answer) > newest:
                self._live[name] = answer
            self._echo[name] = (ours, kept)
        return dropped(ours, kept)
