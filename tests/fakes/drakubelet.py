"""A kubelet DRA manager stand-in over real gRPC on unix sockets, for driving the DRA plugin.

It does what the kubelet's plugin watcher and DRA manager do with a DRA plugin (as the real v1.34
kubelet's, which tests/e2e/e2e_dra.py drives):

- watches ``registry_dir`` for sockets (a new file, or a file replaced); on each it
  calls ``Registration.GetInfo``, accepts a plugin of type ``DRAPlugin`` whose name is a DNS
  subdomain, whose endpoint exists and whose ``supported_versions`` lists ``v1.DRAPlugin``, and
  calls ``NotifyRegistrationStatus`` with the outcome (a rejection carries the reason); a
  registration of the same driver replaces the earlier one. A socket that disappears deregisters
  its driver. Every step is an ``Event``;
- ``prepare(pod, claims)`` calls ``NodePrepareResources`` on the registered endpoint of each
  claim's driver (one call per driver) for the claims no other pod on the node prepared yet, as the
  kubelet's claim cache does: a claim shared by several pods is prepared for the first one and
  unprepared (``unprepare``) after the last one. ``call_prepare`` and ``call_unprepare`` call the
  plugin directly, bypassing that bookkeeping (a kubelet restarted without its state).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import grpc

from labeller.apps.draplugin.api import dra_pb2 as dra
from labeller.apps.draplugin.api import dra_pb2_grpc as dra_grpc
from labeller.apps.draplugin.api import registration_pb2 as reg
from labeller.apps.draplugin.api import registration_pb2_grpc as reg_grpc
from tests.builders import PATIENCE_S

DRA_V1 = "v1.DRAPlugin"
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
POLL_S = 0.02
CALL_TIMEOUT_S = 45.0  # the kubelet's defaultClientCallTimeout (pkg/kubelet/cm/dra/plugin)
RETRY_S = 1.0  # the kubelet's plugin reconciler's period


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    driver: str


@dataclass
class Event:
    at: float
    kind: str  # "registered", "rejected", "failed" (unreachable: tried again), "deregistered", "prepare", "unprepare"
    driver: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plugin:
    driver: str
    endpoint: str
    versions: list[str]
    socket: Path
    channel: grpc.Channel
    stub: Any


class FakeDraKubelet:
    def __init__(self, registry_dir: Path) -> None:
        self.registry_dir = registry_dir
        self.events: list[Event] = []
        self.plugins: dict[str, Plugin] = {}  # driver -> its registration
        self.pods_of: dict[str, set[str]] = {}  # claim UID -> the pods it is prepared for
        self.answers: dict[str, dra.NodePrepareResourceResponse] = {}  # claim UID -> the prepare answer
        self._seen: dict[Path, tuple[int, int]] = {}  # socket -> (inode, ctime): a new file, even on a reused inode
        self._retry_at: dict[Path, float] = {}  # socket -> when to try again after it could not be reached
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fake-drakubelet", daemon=True)

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for plugin in self.plugins.values():
            plugin.channel.close()

    # --- the plugin watcher ---------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                present = {Path(e.path): (e.inode(), e.stat().st_ctime_ns) for e in os.scandir(self.registry_dir)
                           if e.name.endswith(".sock")}
            except FileNotFoundError:
                present = {}
            for path in set(self._seen) - set(present):
                del self._seen[path]
                self._deregister(path)
            for path, identity in present.items():
                if self._retry_at.get(path, 0.0) > time.monotonic():
                    continue
                if self._seen.get(path) != identity:
                    if path in self._seen:  # replaced between two looks: gone, then back
                        self._deregister(path)
                    self._seen[path] = identity
                    self._register(path)

    def _register(self, path: Path) -> None:
        """GetInfo, take the plugin (as the kubelet's handler does), then tell it the outcome."""
        try:
            with grpc.insecure_channel(f"unix://{path}") as channel:
                stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                info = stub.GetInfo(reg.InfoRequest(), timeout=CALL_TIMEOUT_S)
                problem = self._problem(info)
                if problem is None:
                    self._take(info, path)
                stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=problem is None,
                                                                     error=problem or ""), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            # The kubelet's reconciler tries a plugin it could not reach again on its next pass (every
            # second): a socket can exist a moment before its server accepts.
            self._record("failed", path.name, error=f"{exc.code().name}: {exc.details()}")
            self._seen.pop(path, None)
            self._retry_at[path] = time.monotonic() + RETRY_S
            return
        if problem is not None:
            self._record("rejected", info.name, error=problem, socket=str(path))
            return
        self._record("registered", info.name, endpoint=info.endpoint, versions=list(info.supported_versions),
                     socket=str(path))

    def _take(self, info: reg.PluginInfo, path: Path) -> None:
        endpoint = grpc.insecure_channel(f"unix://{info.endpoint}")
        with self._lock:
            old = self.plugins.get(info.name)
            self.plugins[info.name] = Plugin(info.name, info.endpoint, list(info.supported_versions), path, endpoint,
                                             dra_grpc.DRAPluginStub(endpoint))  # type: ignore[no-untyped-call]
        if old is not None:
            old.channel.close()

    @staticmethod
    def _problem(info: reg.PluginInfo) -> str | None:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if not DNS_SUBDOMAIN.fullmatch(info.name):
            return f"driver name {info.name!r} is not a DNS subdomain"
        if DRA_V1 not in info.supported_versions:
            return f"none of the supported versions {list(info.supported_versions)} is {DRA_V1}"
        if not os.path.exists(info.endpoint):
            return f"endpoint {info.endpoint} does not exist"
        return None

    def _deregister(self, path: Path) -> None:
        with self._lock:
            gone = [p for p in self.plugins.values() if p.socket == path]
            for plugin in gone:
                del self.plugins[plugin.driver]
        for plugin in gone:
            plugin.channel.close()
            self._record("deregistered", plugin.driver, endpoint=plugin.endpoint)

    def _record(self, kind: str, driver: str, **detail: Any) -> None:
        with self._lock:
            self.events.append(Event(time.monotonic(), kind, driver, detail))
            self._lock.notify_all()

    # --- what tests look at ----------------------------------------------------------------------

    def seen(self, kind: str, driver: str | None = None, since: float = 0.0) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.kind == kind and driver in (None, e.driver) and e.at >= since]

    def registered(self, driver: str) -> Plugin | None:
        with self._lock:
            return self.plugins.get(driver)

    def wait_for(self, predicate: Callable[[], Any], timeout: float = PATIENCE_S) -> Any:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not (result := predicate()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return result
                self._lock.wait(min(remaining, 0.05))
            return result

    # --- the DRA manager ----------------------------------------------------------------------------

    def _stub(self, driver: str) -> Any:
        plugin = self.registered(driver)
        if plugin is None:
            raise LookupError(f"DRA driver {driver} is not registered")
        return plugin.stub

    def call_prepare(self, driver: str, claims: list[Claim]) -> dict[str, dra.NodePrepareResourceResponse]:
        """NodePrepareResources for these claims of one driver, as is: the answer by claim UID."""
        request = dra.NodePrepareResourcesRequest(claims=[dra.Claim(namespace=c.namespace, name=c.name, uid=c.uid)
                                                          for c in claims])
        response = self._stub(driver).NodePrepareResources(request, timeout=CALL_TIMEOUT_S)
        self._record("prepare", driver, claims=[c.uid for c in claims])
        return dict(response.claims)

    def call_unprepare(self, driver: str, claims: list[Claim]) -> dict[str, dra.NodeUnprepareResourceResponse]:
        request = dra.NodeUnprepareResourcesRequest(claims=[dra.Claim(namespace=c.namespace, name=c.name, uid=c.uid)
                                                            for c in claims])
        response = self._stub(driver).NodeUnprepareResources(request, timeout=CALL_TIMEOUT_S)
        self._record("unprepare", driver, claims=[c.uid for c in claims])
        return dict(response.claims)

    def prepare(self, pod: str, claims: list[Claim]) -> dict[str, dra.NodePrepareResourceResponse]:
        """The kubelet's PrepareResources for a pod: the plugin is called only for claims no pod has
        prepared yet; the answer of every claim of the pod, by UID (a failed claim is tried again
        next time)."""
        fresh: dict[str, list[Claim]] = {}
        with self._lock:
            for claim in claims:
                if claim.uid not in self.answers:
                    fresh.setdefault(claim.driver, []).append(claim)
        failed: dict[str, dra.NodePrepareResourceResponse] = {}
        for driver, of_driver in fresh.items():
            answers = self.call_prepare(driver, of_driver)
            missing = [c.uid for c in of_driver if c.uid not in answers]
            if missing:
                raise AssertionError(f"{driver}: NodePrepareResources answered nothing for {missing}")
            with self._lock:
                for uid, answer in answers.items():
                    if answer.error:
                        failed[uid] = answer
                    else:
                        self.answers[uid] = answer
        with self._lock:
            if not failed:  # the pod starts: it uses every one of its claims
                for claim in claims:
                    self.pods_of.setdefault(claim.uid, set()).add(pod)
            return {c.uid: failed[c.uid] if c.uid in failed else self.answers[c.uid] for c in claims}

    def unprepare(self, pod: str, claims: list[Claim]) -> dict[str, dra.NodeUnprepareResourceResponse]:
        """The kubelet's UnprepareResources for a pod gone: the plugin is called for the claims no
        other pod still uses."""
        last: dict[str, list[Claim]] = {}
        with self._lock:
            for claim in claims:
                pods = self.pods_of.get(claim.uid, set())
                pods.discard(pod)
                if not pods:
                    self.pods_of.pop(claim.uid, None)
                    last.setdefault(claim.driver, []).append(claim)
        answers: dict[str, dra.NodeUnprepareResourceResponse] = {}
        for driver, of_driver in last.items():
            answers.update(self.call_unprepare(driver, of_driver))
            with self._lock:
                for claim in of_driver:
                    if not answers[claim.uid].error:
                        self.answers.pop(claim.uid, None)
        return answers
