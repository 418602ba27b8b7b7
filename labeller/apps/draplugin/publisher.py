"""Keeps this node's ResourceSlices equal to what the plugin publishes, writing only what differs.

``publish(devices_by_driver)`` says what each driver's pool holds from now on (``WantedSlices``). A
watch of the ResourceSlices whose ``spec.nodeName`` is this node keeps a live view of them
(``sliceview.LiveSlices``), and a worker thread compares the two, per driver:

- equal (the same slice names, the same content, one generation across the pool): nothing is
  written. The content is compared as the API keeps it (``slicecontent``): a capacity quantity in
  another notation is the same quantity, a taint's ``timeAdded`` (the server's stamp) alone is never
  a difference, and what the server made of our last write of a slice counts as ours;
- different: the pool is written at a generation the scheduler takes and its other slices on this
  node are deleted (``poolwriter.PoolWriter``: generations, the repair of a pool that cannot be
  bumped, and the fields the server does not keep, which tell which feature gates it has off).

So stale slices of a driver for this node are replaced at start, an external delete (a kubelet that
starts deletes its node's slices) is repaired as soon as the watch says so, a driver published
before and not now has its slices removed, and slices of other drivers or nodes are never touched.
A failed write is retried after a jittered backoff (at most about 1 s apart during the first minute
of an outage); the reflector lists again after a broken watch, so the view is true again within
about a second of the API answering.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from labeller.base.backoff import Backoff
from labeller.cluster.permissions import PermissionLog
from labeller.cluster.reflector import Reflector
from labeller.apps.draplugin.metrics import DraMetrics
from labeller.apps.draplugin.poolwriter import FieldsDropped, PoolWriter
from labeller.apps.draplugin.slicecontent import Obj, driver, name
from labeller.apps.draplugin.sliceview import LiveSlices, SliceApi
from labeller.model.resourceslices import DraDevice, resource_slices
from labeller.base.log import get_logger

__all__ = ["SliceApi", "SlicePublisher", "WantedSlices"]  # SliceApi: what the publisher is given

log = get_logger(__name__)

SliceLayout = Callable[[str, Mapping[str, Sequence[DraDevice]], int], list[Obj]]


class WantedSlices:
    """What each driver's pool should hold, and every driver published by this process until its
    slices are gone; thread-safe. ``version`` grows with every change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_driver: dict[str, list[Obj]] = {}  # driver -> its slices (generation not yet set)
        self._drivers: set[str] = set()
        self._version = 0

    def replace(self, by_driver: dict[str, list[Obj]]) -> bool:
        """Whether that changed anything."""
        with self._lock:
            if by_driver == self._by_driver:
                return False
            self._by_driver = by_driver
            self._drivers |= set(by_driver)
            self._version += 1
            return True

    def seen(self) -> tuple[int, dict[str, list[Obj]], set[str]]:
        """(``version``, each driver's slices, every driver whose pool is to be kept or emptied)."""
        with self._lock:
            return self._version, dict(self._by_driver), set(self._drivers)

    def emptied(self, of: str) -> None:
        """Driver ``of``'s pool is gone from this node: unless it is wanted again, forget it."""
        with self._lock:
            if of not in self._by_driver:
                self._drivers.discard(of)

    @property
    def version(self) -> int:
        with self._lock:
            return self._version


class SlicePublisher:
    """See the module docstring. ``start`` the watch and the worker; ``publish`` any number of times."""

    def __init__(self, api: SliceApi, node_name: str, metrics: DraMetrics, stop: threading.Event, *,
                 layout: SliceLayout = resource_slices, permissions: PermissionLog | None = None,
                 watch_timeout_s: int = 300, on_dropped: FieldsDropped | None = None) -> None:
        self.node_name, self.layout, self.stop = node_name, layout, stop
        self.permissions = permissions or PermissionLog()
        self._wake = threading.Event()
        self._wanted = WantedSlices()
        self._view = LiveSlices(api, node_name, stop, on_change=self._wake.set, permissions=self.permissions,
                                watch_timeout_s=watch_timeout_s)
        self._writer = PoolWriter(api, node_name, metrics, self._view, on_dropped)
        self._reconciled = (-1, -1)  # (wanted, live) versions the last reconcile caught up with
        self._worker: threading.Thread | None = None

    # --- inputs (any thread) -------------------------------------------------------------------

    def publish(self, devices_by_driver: Mapping[str, Sequence[DraDevice]]) -> None:
        """Each driver's pool holds exactly these devices from now on; a driver missing here that was
        published before has its slices deleted."""
        if self._wanted.replace({driver: self.layout(self.node_name, {driver: devices}, 0)
                             for driver, devices in devices_by_driver.items()}):
            self._wake.set()

    # --- state ------------------------------------------------------------------------------------

    @property
    def in_sync(self) -> bool:
        """The slices on the API are what was last published (as of the last change seen)."""
        wanted, live = self._reconciled
        return self._wanted.version == wanted and self._view.caught_up(live)

    def live(self) -> list[Obj]:
        """This node's slices as last seen."""
        return self._view.slices()

    @property
    def reflector(self) -> Reflector:
        """The watch of this node's slices."""
        return self._view.reflector

    # --- the worker ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._view.reflector.start("dra-slices-watch")
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
        seen = self._view.seen()
        if seen is None:
            return
        live_version, live = seen
        wanted_version, wanted, drivers = self._wanted.seen()
        for pool in sorted(drivers):
            mine = {name(s): s for s in live if driver(s) == pool}
            self._writer.reconcile(pool, wanted.get(pool, []), mine)
            if pool not in wanted and not mine:
                self._wanted.emptied(pool)
        self._reconciled = (wanted_version, live_version)
