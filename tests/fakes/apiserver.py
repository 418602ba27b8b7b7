"""A fake Kubernetes API server over real HTTP, for driving the real daemon and the official client.

It keeps the semantics observed on a real kube-apiserver (``shared/reference/real-kubernetes-behaviour.md``)
for what gpu-labeller touches: Nodes (get, list and watch with field and label selectors and
pages, merge / strategic-merge / JSON / server-side-apply patches with per-field-manager label
ownership, resourceVersion and 409), Pods (create, get, list and watch across or within namespaces
with field and label selectors and pages, metadata merge patches with a resourceVersion
precondition, delete, the ``binding`` subresource), ConfigMaps, NodeFeature objects, Events, and
``resource.k8s.io/v1`` ResourceSlices (create, get, list and watch with field selectors on
``spec.nodeName`` and ``spec.driver``, update with a resourceVersion precondition, delete with a uid
precondition; the API's decoding (400 for a number outside int64) and validation of what a driver
writes, and what it drops of an alpha feature gate that is off: ``feature_gates``, device taints
and shared counters included) and ResourceClaims (create, get, and ``set_claim_allocation`` as the
scheduler writes ``status.allocation``).
Faults are injected on demand: RBAC 403, 5xx, slow answers and dropped connections. Every request
is logged and counted by verb.

One class per concern: ``Ownership`` (managedFields for labels), ``NodeStore`` (nodes, the one
resourceVersion counter and watch history), ``Selector`` (field and label selectors),
``ObjectStore`` (namespaced objects: ConfigMaps), ``PodStore`` (Pods and their binding),
``SliceStore`` (ResourceSlices, cluster-scoped) and ``ClaimStore`` (ResourceClaims),
``Faults``, ``RequestLog``, ``Handler`` (HTTP routing) and ``FakeApiServer`` (start/stop,
kubeconfig, test helpers).
"""

from __future__ import annotations

import base64
import bisect
import copy
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlparse

Obj = dict[str, Any]
NFD_GROUP_PATH = "/apis/nfd.k8s-sigs.io/v1alpha1"
RESOURCE_GROUP_PATH = "/apis/resource.k8s.io/v1"
DEFAULT_UPDATE_MANAGER = "kubectl-edit"


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": message, "reason": reason, "code": code}
    if details is not None:
        body["details"] = details
    return body


class ApiError(Exception):
    """An API answer other than success: becomes a Status body with this code."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.body = status_body(code, reason, message, details)
        self.code = code


# --------------------------------------------------------------------------- label ownership


Entry = tuple[str, str]  # a managedFields entry: (manager, operation "Apply" or "Update")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Ownership:
    """Server-side-apply managedFields, for ``metadata.labels`` only: key -> the entries that own it.

    As on a real server, an entry is a (manager, operation) pair, so one manager's Apply and Update
    entries own fields separately; an entry's ``time`` is when a write last changed what it owns;
    an entry that owns nothing disappears."""

    def __init__(self) -> None:
        self.owners: dict[str, set[Entry]] = {}
        self.times: dict[Entry, str] = {}

    def owned_by(self, entry: Entry) -> set[str]:
        return {key for key, entries in self.owners.items() if entry in entries}

    def apply(self, labels: dict[str, str], manager: str, desired: dict[str, str], force: bool, node: str) -> None:
        """Apply ``desired`` as ``manager``: set, take (force) or co-own keys; drop keys no longer applied."""
        me = (manager, "Apply")
        conflicts = [key for key, value in desired.items()
                     if key in labels and labels[key] != value and self.owners.get(key, set()) - {me}]
        if conflicts and not force:
            others = sorted({m for key in conflicts for (m, op) in self.owners[key] if (m, op) != me})
            raise ApiError(409, "Conflict", f'Apply failed with {len(conflicts)} conflict(s): conflict with '
                           f'"{others[0]}": .metadata.labels.{conflicts[0]}', {"name": node, "kind": "nodes"})
        before = {key: set(entries) for key, entries in self.owners.items()}
        for key, value in desired.items():
            entries = self.owners.setdefault(key, set())
            if labels.get(key) != value:
                entries.clear()  # a forced apply that changes the value takes the field
            entries.add(me)
            labels[key] = value
        for key in self.owned_by(me) - set(desired):
            entries = self.owners[key]
            entries.discard(me)
            if not entries:  # nobody else set it: the label goes
                del self.owners[key]
                labels.pop(key, None)
        self._stamp(before)

    def update(self, before_labels: dict[str, str], after: dict[str, str], manager: str) -> None:
        """A non-apply write: changed keys move to ``manager``'s Update entry; removed keys lose every owner."""
        before = {key: set(entries) for key, entries in self.owners.items()}
        for key in set(before_labels) | set(after):
            if key not in after:
                self.owners.pop(key, None)
            elif before_labels.get(key) != after[key]:
                self.owners[key] = {(manager, "Update")}
        self._stamp(before)

    def _stamp(self, before: dict[str, set[Entry]]) -> None:
        """Entries whose owned keys changed get the time of this write; entries that own nothing go."""
        entries = {e for owners in (*before.values(), *self.owners.values()) for e in owners}
        for entry in entries:
            if {k for k, o in before.items() if entry in o} != self.owned_by(entry):
                self.times[entry] = _now()
        live = {e for owners in self.owners.values() for e in owners}
        self.times = {e: t for e, t in self.times.items() if e in live}

    def managed_fields(self) -> list[Obj]:
        per_entry: dict[Entry, dict[str, Obj]] = {}
        for key, entries in sorted(self.owners.items()):
            for entry in entries:
                per_entry.setdefault(entry, {})[f"f:{key}"] = {}
        return [{"manager": manager, "operation": operation, "apiVersion": "v1",
                 "time": self.times.get((manager, operation), _now()),
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": fields}}}
                for (manager, operation), fields in sorted(per_entry.items())]


# --------------------------------------------------------------------------- objects and watch history


@dataclass
class WatchEvent:
    resource_version: int
    type: str
    obj: Obj
    resource: str = "nodes"
    old: Obj | None = None  # the object before a MODIFIED: a filtered watch sees it enter or leave

    def seen_through(self, match: Callable[[Obj], bool]) -> tuple[str, Obj] | None:
        """This event as a watch filtered by ``match`` sees it: as the real server does, an object that
        starts matching arrives ADDED and one that stops matching leaves DELETED."""
        now = match(self.obj)
        if self.type != "MODIFIED" or self.old is None:
            return (self.type, self.obj) if now else None
        before = match(self.old)
        if before and now:
            return "MODIFIED", self.obj
        if now:
            return "ADDED", self.obj
        return ("DELETED", self.obj) if before else None


Match = Callable[[Obj], bool]


def _everything(obj: Obj) -> bool:
    return True


def page(items: Iterator[tuple[str, Obj]], rv: str, limit: str | None,
         token: str | None) -> tuple[list[Obj], str, str | None]:
    """One page (limit/continue) of ``items``, (key, object) pairs in key order: copies of the page's
    objects, the list's resourceVersion, and the token of the next page."""
    after = ""
    if token:
        try:
            state = json.loads(base64.urlsafe_b64decode(token))
            after, rv = str(state["start"]), str(state["rv"])
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "BadRequest", "continue key is not valid") from None
    size = int(limit) if limit else 0
    chosen: list[tuple[str, Obj]] = []
    for key, obj in items:
        if key > after:
            chosen.append((key, obj))
            if size > 0 and len(chosen) > size:
                break
    more = size > 0 and len(chosen) > size
    chosen = chosen[:size] if more else chosen
    next_token = (base64.urlsafe_b64encode(json.dumps({"rv": rv, "start": chosen[-1][0]}).encode()).decode()
                  if more else None)
    return [copy.deepcopy(obj) for _, obj in chosen], rv, next_token


class NodeStore:
    """Nodes (with label ownership), custom objects and events; a resourceVersion counter and a
    bounded watch history (``compact`` makes older resourceVersions answer 410)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.resource_version = 100
        self.nodes: dict[str, Obj] = {}
        self.ownership: dict[str, Ownership] = {}
        self.history: list[WatchEvent] = []
        self.oldest_rv = self.resource_version
        self.custom: dict[tuple[str, str, str], Obj] = {}  # (plural, namespace, name)
        self.events: list[Obj] = []
        self.closed = False

    # -- helpers that expect the lock held
    def _bump(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def _record(self, type_: str, name: str, obj: Obj | None = None, old: Obj | None = None) -> None:
        self.record("nodes", type_, self.view(name) if obj is None else obj, old)

    def record(self, resource: str, type_: str, obj: Obj, old: Obj | None = None) -> None:
        self.history.append(WatchEvent(self.resource_version, type_, obj, resource, old))
        if len(self.history) > 1000:
            self.history = self.history[-500:]
            self.oldest_rv = self.history[0].resource_version - 1
        self.lock.notify_all()

    def view(self, name: str) -> Obj:
        node = copy.deepcopy(self.nodes[name])
        node["metadata"]["managedFields"] = self.ownership[name].managed_fields()
        return node

    def get(self, name: str) -> Obj:
        if name not in self.nodes:
            raise ApiError(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
        return self.view(name)

    # -- public operations (take the lock)
    def create(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        with self.lock:
            self.nodes[name] = {"kind": "Node", "apiVersion": "v1",
                                "metadata": {"name": name, "uid": f"uid-{name}", "labels": dict(labels or {}),
                                             "resourceVersion": self._bump()},
                                "spec": {}, "status": {}}
            self.ownership[name] = Ownership()
            self.ownership[name].update({}, dict(labels or {}), "kubelet")
            self._record("ADDED", name)
            return self.view(name)

    def delete(self, name: str) -> None:
        with self.lock:
            node = self.view(name)
            node["metadata"]["resourceVersion"] = self._bump()
            del self.nodes[name], self.ownership[name]
            self._record("DELETED", name, node)

    def write_labels(self, name: str, change: Any, stale_rv: str | None = None) -> Obj:
        """Run ``change(labels, ownership)`` on a node's labels; bump its resourceVersion if anything changed."""
        with self.lock:
            node = self.nodes.get(name)
            if node is None:
                raise ApiError(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
            if stale_rv is not None and stale_rv != node["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object has '
                               "been modified; please apply your changes to the latest version and try again",
                               {"name": name, "kind": "nodes"})
            labels = node["metadata"]["labels"]
            ownership = self.ownership[name]
            before_labels, before_owners = dict(labels), copy.deepcopy(ownership.owners)
            old = self.view(name)
            change(labels, ownership)
            if labels != before_labels or ownership.owners != before_owners:
                node["metadata"]["resourceVersion"] = self._bump()
                self._record("MODIFIED", name, old=old)
            return self.view(name)

    def write_status(self, name: str, status: Obj) -> Obj:
        """Merge ``status`` (capacity, allocatable, ...) into a node's status, as its kubelet does."""
        with self.lock:
            node = self.nodes.get(name)
            if node is None:
                raise ApiError(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
            old = self.view(name)
            merge_patch(node["status"], status)
            node["metadata"]["resourceVersion"] = self._bump()
            self._record("MODIFIED", name, old=old)
            return self.view(name)

    def list_nodes(self, match: Match = _everything, limit: str | None = None,
                   token: str | None = None) -> tuple[list[Obj], str, str | None]:
        with self.lock:
            views = ((name, self.view(name)) for name in sorted(self.nodes))
            return page(((name, view) for name, view in views if match(view)), str(self.resource_version), limit, token)

    def events_since(self, rv: int, resource: str, match: Match, deadline: float) -> Iterator[tuple[str, Obj] | None]:
        """Yield ``resource``'s history after ``rv`` as a watch filtered by ``match`` sees it, waiting for
        more until ``deadline``; None = keep-alive tick."""
        if rv < self.oldest_rv:
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.oldest_rv})")
        while time.monotonic() < deadline:
            with self.lock:
                if self.closed:
                    return
                if not self.history or self.history[-1].resource_version <= rv:
                    self.lock.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                pending = self._after(rv, resource, match)
                if self.history:
                    rv = max(rv, self.history[-1].resource_version)
            yield from pending
            yield None

    def _after(self, rv: int, resource: str, match: Match) -> list[tuple[str, Obj]]:
        start = bisect.bisect_right(self.history, rv, key=lambda e: e.resource_version)
        seen = (e.seen_through(match) for e in self.history[start:] if e.resource == resource)
        return [event for event in seen if event is not None]

    def compact(self) -> None:
        """Forget the watch history: any watch resuming from an older resourceVersion gets 410 Gone."""
        with self.lock:
            self.history.clear()
            self.oldest_rv = self.resource_version

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()


# --------------------------------------------------------------------------- selectors


def merge_patch(target: Obj, patch: Obj) -> None:
    """RFC 7386 JSON merge patch, in place: None removes a key, objects merge, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


_REQUIREMENT = re.compile(r"\s*(?P<key>!?[^\s!=,()]+)\s*(?:(?P<op>==|!=|=|\s+in\s+|\s+notin\s+)\s*"
                          r"(?P<value>\([^)]*\)|[^\s,()]*))?\s*(?:,|$)")


class Selector:
    """A field selector (``spec.nodeName=n,status.phase!=Failed``) and a label selector (``a=b``,
    ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x)``) over objects, with the real server's
    400 for a field it cannot select on."""

    def __init__(self, resource: str, fields: tuple[str, ...], field_selector: str | None,
                 label_selector: str | None) -> None:
        self.terms = [self._field_term(resource, fields, term) for term in (field_selector or "").split(",") if term]
        self.labels = self._label_terms(label_selector or "")

    @staticmethod
    def _field_term(resource: str, fields: tuple[str, ...], term: str) -> tuple[str, bool, str]:
        match = re.fullmatch(r"\s*([\w.]+)\s*(!=|==|=)\s*(.*?)\s*", term)
        if match is None:
            raise ApiError(400, "BadRequest", f'unable to parse requirement: invalid field selector "{term}"')
        path, op, value = match.groups()
        if path not in fields:
            raise ApiError(400, "BadRequest", f'"{path}" is not a known field selector: only "{", ".join(fields)}"'
                           f" for {resource}")
        return path, op != "!=", value

    @staticmethod
    def _label_terms(selector: str) -> list[tuple[str, str, set[str]]]:
        terms: list[tuple[str, str, set[str]]] = []
        position = 0
        while position < len(selector):
            match = _REQUIREMENT.match(selector, position)
            if match is None or match.end() == position:
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {selector!r}")
            key, op, value = match.group("key"), (match.group("op") or "").strip(), match.group("value") or ""
            values = {v.strip() for v in value.strip("()").split(",") if v.strip()}
            if key.startswith("!"):
                terms.append((key[1:], "!", set()))
            else:
                terms.append((key, {"": "exists", "=": "in", "==": "in", "!=": "notin"}.get(op, op), values))
            position = match.end()
        return terms

    @staticmethod
    def field_value(obj: Obj, path: str) -> str:
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return "" if value is None else str(value)

    def __call__(self, obj: Obj) -> bool:
        if any((self.field_value(obj, path) == value) != equal for path, equal, value in self.terms):
            return False
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for key, op, values in self.labels:
            present = key in labels
            if (op == "exists" and not present) or (op == "!" and present):
                return False
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and present and labels[key] in values:
                return False
        return True


NODE_FIELDS = ("metadata.name", "spec.unschedulable")
POD_FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "spec.schedulerName", "status.phase",
              "spec.serviceAccountName")
CONFIG_MAP_FIELDS = ("metadata.name", "metadata.namespace")
# What a real v1.34 server selects ResourceSlices on (pkg/apis/resource: ResourceSliceSelector*).
SLICE_FIELDS = ("metadata.name", "spec.nodeName", "spec.driver")


# --------------------------------------------------------------------------- namespaced objects


class ObjectStore:
    """Namespaced objects of one resource (ConfigMaps, and Pods through PodStore): create, get, list,
    watch, metadata merge patch, replace, delete. They share the node store's lock, resourceVersion
    counter and watch history, as every resource of a real cluster shares etcd's revision."""

    fields: tuple[str, ...] = CONFIG_MAP_FIELDS
    api_version = "v1"
    cluster_scoped = False  # keyed by ("", name); its objects have no namespace

    def __init__(self, store: NodeStore, resource: str, kind: str) -> None:
        self.store, self.resource, self.kind = store, resource, kind
        self.objects: dict[tuple[str, str], Obj] = {}

    def not_found(self, namespace: str, name: str) -> ApiError:
        return ApiError(404, "NotFound", f'{self.resource} "{name}" not found', {"name": name, "kind": self.resource})

    def _conflict(self, name: str) -> ApiError:
        return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {self.resource} "{name}": the object has '
                        "been modified; please apply your changes to the latest version and try again",
                        {"name": name, "kind": self.resource})

    def _existing(self, namespace: str, name: str) -> Obj:
        obj = self.objects.get((namespace, name))
        if obj is None:
            raise self.not_found(namespace, name)
        return obj

    def defaults(self, obj: Obj) -> None:
        """Fields the server fills in at create."""

    def decode(self, obj: Obj) -> None:
        """The server's decoding of a request body (a copy, changed in place) into its Go type, before
        anything else: ApiError 400 when a value does not fit its field."""

    def prepare(self, obj: Obj, old: Obj | None) -> None:
        """The server's ``PrepareForCreate`` / ``PrepareForUpdate`` (``old``: the stored object, None at
        create), before validation: fields of a disabled feature gate dropped, defaults stamped."""

    def validate(self, obj: Obj) -> None:
        """The server's validation of a created or replaced object: ApiError 422 when it is invalid."""

    def create(self, namespace: str, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        self.decode(obj)
        metadata = obj.setdefault("metadata", {})
        name = metadata.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{self.kind} is invalid: metadata.name: Required value: name is required")
        with self.store.lock:
            if (namespace, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{self.resource} "{name}" already exists',
                               {"name": name, "kind": self.resource})
            self.prepare(obj, None)
            self.validate(obj)
            obj.update({"kind": self.kind, "apiVersion": self.api_version})
            metadata.update({"uid": str(uuid.uuid4()), "creationTimestamp": _now(),
                             "resourceVersion": self.store._bump()})
            if not self.cluster_scoped:
                metadata["namespace"] = namespace
            self.defaults(obj)
            self.objects[(namespace, name)] = obj
            self.store.record(self.resource, "ADDED", copy.deepcopy(obj))
            return copy.deepcopy(obj)

    def get(self, namespace: str, name: str) -> Obj:
        with self.store.lock:
            return copy.deepcopy(self._existing(namespace, name))

    def list(self, namespace: str | None, match: Match = _everything, limit: str | None = None,
             token: str | None = None) -> tuple[list[Obj], str, str | None]:
        with self.store.lock:
            keyed = sorted(((f"{ns}/{name}", obj) for (ns, name), obj in self.objects.items()
                            if namespace in (None, ns)),
                           key=lambda pair: pair[0])
            return page(((key, obj) for key, obj in keyed if match(obj)),
                        str(self.store.resource_version), limit, token)

    def change(self, namespace: str, name: str, edit: Callable[[Obj], None], stale_rv: str | None = None) -> Obj:
        """Run ``edit`` on the object; a new resourceVersion and a MODIFIED event when anything changed."""
        with self.store.lock:
            obj = self._existing(namespace, name)
            if stale_rv is not None and stale_rv != obj["metadata"]["resourceVersion"]:
                raise self._conflict(name)
            old = copy.deepcopy(obj)
            edit(obj)
            if obj != old:
                obj["metadata"]["resourceVersion"] = self.store._bump()
                self.store.record(self.resource, "MODIFIED", copy.deepcopy(obj), old)
            return copy.deepcopy(obj)

    def patch_metadata(self, namespace: str, name: str, patch: Obj) -> Obj:
        """A merge patch; only metadata labels and annotations change (as on a real Pod, where the
        spec is immutable and the status has its own subresource). ``metadata.resourceVersion`` in the
        patch is a precondition: 409 when the object moved on."""
        metadata = dict(patch.get("metadata") or {})
        stale = metadata.pop("resourceVersion", None)
        writable = {key: metadata[key] for key in ("labels", "annotations") if key in metadata}
        return self.change(namespace, name, lambda obj: merge_patch(obj["metadata"], writable),
                           stale_rv=str(stale) if stale is not None else None)

    def replace(self, namespace: str, name: str, body: Obj) -> Obj:
        body = copy.deepcopy(body)
        self.decode(body)
        sent = (body.get("metadata") or {}).get("resourceVersion")

        def swap(obj: Obj) -> None:
            kept = {key: obj["metadata"][key] for key in ("namespace", "uid", "creationTimestamp", "resourceVersion")
                    if key in obj["metadata"]}
            replaced = copy.deepcopy(body)
            replaced.setdefault("metadata", {}).update(kept)
            replaced.update({"kind": self.kind, "apiVersion": self.api_version})
            self.prepare(replaced, obj)
            self.validate(replaced)
            obj.clear()
            obj.update(replaced)
        return self.change(namespace, name, swap, stale_rv=str(sent) if sent else None)

    def delete(self, namespace: str, name: str, uid: str | None = None) -> Obj:
        """Delete; with ``uid``, only that object (409, as the real server's precondition)."""
        with self.store.lock:
            obj = self._existing(namespace, name)
            if uid and uid != obj["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {self.resource} "{name}": '
                               f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                               f"{obj['metadata']['uid']}", {"name": name, "kind": self.resource})
            del self.objects[(namespace, name)]
            obj["metadata"]["resourceVersion"] = self.store._bump()
            self.store.record(self.resource, "DELETED", copy.deepcopy(obj))
            return copy.deepcopy(obj)


class PodStore(ObjectStore):
    """Pods: a Pending phase at create, and the ``binding`` subresource a scheduler creates."""

    fields = POD_FIELDS

    def __init__(self, store: NodeStore) -> None:
        super().__init__(store, "pods", "Pod")

    def defaults(self, obj: Obj) -> None:
        obj.setdefault("spec", {}).setdefault("schedulerName", "default-scheduler")
        obj.setdefault("status", {}).setdefault("phase", "Pending")

    def bind(self, namespace: str, name: str, binding: Obj) -> Obj:
        """As the real server: 404 for a missing pod, 409 when it is already bound or its uid differs."""
        target = str((binding.get("target") or {}).get("name") or "")
        uid = (binding.get("metadata") or {}).get("uid")

        def assign(pod: Obj) -> None:
            if uid and uid != pod["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": Precondition '
                               f"failed: UID in precondition: {uid}, UID in object meta: {pod['metadata']['uid']}")
            bound = pod["spec"].get("nodeName")
            if bound:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} '
                               f"is already assigned to node \"{bound}\"", {"name": name, "kind": "pods/binding"})
            pod["spec"]["nodeName"] = target
            conditions = pod["status"].setdefault("conditions", [])
            conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()})
        if not target:
            raise ApiError(422, "Invalid", "Binding is invalid: target.name: Required value")
        self.change(namespace, name, assign)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


# DNS label / subdomain, as the API validates device, driver and object names.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
ATTRIBUTE_TYPES = ("int", "bool", "string", "version")
MAX_DEVICES_PER_SLICE = 128
# pkg/apis/resource: ResourceSliceMaxAttributesAndCapacitiesPerDevice, DeviceMaxIDLength,
# DeviceMaxDomainLength, DeviceAttributeMaxValueLength
MAX_ATTRIBUTES_AND_CAPACITIES = 32
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
MAX_DOMAIN = 63
MAX_ATTRIBUTE_VALUE = 64
# pkg/apis/resource (1.34): ResourceSliceMaxSharedCounters (counters of all sets of a slice),
# ResourceSliceMaxCountersPerDevice, ResourceSliceMaxDeviceCountersPerSlice
MAX_SHARED_COUNTERS = 32
MAX_COUNTERS_PER_DEVICE = 32
MAX_DEVICE_COUNTERS_PER_SLICE = 1024
# Partitionable devices (v1.34, gate DRAPartitionableDevices): the spec's and each device's fields it adds.
DRA_PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
PARTITIONABLE_SPEC = ("sharedCounters", "perDeviceNodeSelection")
PARTITIONABLE_DEVICE = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")
QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?")
# Device taints (v1.34, gate DRADeviceTaints; observed on v1.34.2): at most 4 per device, the key a qualified
# name, the value a label value, the effect NoSchedule or NoExecute (required; None only from 1.35);
# timeAdded stamped at create and update when missing.
DRA_DEVICE_TAINTS = "DRADeviceTaints"
MAX_TAINTS_PER_DEVICE = 4
TAINT_EFFECTS = ("NoExecute", "NoSchedule")
NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


INT64 = range(-2**63, 2**63)


def unmarshal_error(kind: str, value: Any, go_field: str, go_type: str = "int64") -> ApiError:
    """What a real server answers for a body whose ``value`` does not fit a field (``go_field`` as
    encoding/json names it: the Go struct, then the JSON path); seen on v1.34.2:
    ``json: cannot unmarshal number 9223372036854775808 into Go struct field
    ResourcePool.spec.pool.generation of type int64``."""
    if isinstance(value, bool):
        what = "bool"
    elif isinstance(value, (int, float)):
        what = f"number {json.dumps(value)}"
    else:
        what = "string" if isinstance(value, str) else "array" if isinstance(value, list) else "object"
    return ApiError(400, "BadRequest", f'{kind} in version "v1" cannot be handled as a {kind}: json: cannot '
                    f"unmarshal {what} into Go struct field {go_field} of type {go_type}")


def invalid(kind: str, name: str, problems: list[str]) -> ApiError:
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {"; ".join(problems)}',
                    {"name": name, "kind": kind, "causes": [{"message": p} for p in problems]})


def quantity_value(text: Any) -> Fraction:
    """A valid quantity's value (``QUANTITY``), as ``resource.Quantity`` holds it."""
    match = re.fullmatch(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?", str(text))
    assert match is not None, text
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    if suffix.endswith("i"):
        return number * Fraction(1024) ** ("KMGTPE".index(suffix[0]) + 1)
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * Fraction(10) ** {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15,
                                     "E": 18}[suffix]


BAD_QUANTITY = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
MAX_VALID_VALUES = 10  # pkg/apis/resource: CapacityRequestPolicyDiscreteMaxOptions


def _request_policies(device: Obj) -> list[tuple[str, Obj]]:
    return [(key, value["requestPolicy"]) for key, value in (device.get("capacity") or {}).items()
            if isinstance(value, dict) and value.get("requestPolicy") is not None]


def uses_consumable_capacity(spec: Obj) -> bool:
    """``draConsumableCapacityFeatureInUse``: a device says allowMultipleAllocations, or has a request policy."""
    return any(device.get("allowMultipleAllocations") is not None or _request_policies(device)
               for device in spec.get("devices") or [])


def drop_consumable_capacity(spec: Obj) -> None:
    for device in spec.get("devices") or []:
        device.pop("allowMultipleAllocations", None)
        for value in (device.get("capacity") or {}).values():
            if isinstance(value, dict):
                value.pop("requestPolicy", None)


def uses_device_taints(spec: Obj) -> bool:
    """``draDeviceTaintsInUse``: a device has a taint."""
    return any(isinstance(device, dict) and device.get("taints") for device in spec.get("devices") or [])


def drop_device_taints(spec: Obj) -> None:
    for device in spec.get("devices") or []:
        if isinstance(device, dict):
            device.pop("taints", None)


def uses_partitionable_devices(spec: Obj) -> bool:
    """``draPartitionableDevicesFeatureInUse``: shared counters or per-device node selection, in the
    spec or a device."""
    return (bool(spec.get("sharedCounters")) or spec.get("perDeviceNodeSelection") is not None
            or any(isinstance(device, dict) and (bool(device.get("consumesCounters")) or any(
                device.get(key) is not None for key in ("nodeName", "nodeSelector", "allNodes")))
                for device in spec.get("devices") or []))


def drop_partitionable_devices(spec: Obj) -> None:
    for key in PARTITIONABLE_SPEC:
        spec.pop(key, None)
    for device in spec.get("devices") or []:
        for key in PARTITIONABLE_DEVICE if isinstance(device, dict) else ():
            device.pop(key, None)


# What a v1.34 server does with the ResourceSlice fields of an alpha feature gate that is off
# (pkg/registry/resource/resourceslice/strategy.go, dropDisabledFields): drops them from a create, and
# from an update unless the stored slice already uses them (then they are kept). The answer to the write
# is the slice without them: that is how a driver can tell. Gate -> (whether a spec uses it, drop it).
GATED_SLICE_FIELDS: dict[str, tuple[Callable[[Obj], bool], Callable[[Obj], None]]] = {
    "DRAConsumableCapacity": (uses_consumable_capacity, drop_consumable_capacity),
    DRA_DEVICE_TAINTS: (uses_device_taints, drop_device_taints),
    DRA_PARTITIONABLE_DEVICES: (uses_partitionable_devices, drop_partitionable_devices),
}


class SliceStore(ObjectStore):
    """ResourceSlices (``resource.k8s.io/v1``, cluster-scoped), decoded and validated as the real server
    does for what a driver writes: int64 fields in range, names, the pool, one node field, at most 128
    devices, DNS-label device names unique in the slice, at most 32 attributes and capacities per device
    named by qualified names (``productName``, ``resource.kubernetes.io/pcieRoot``), attribute values of
    exactly one type (versions semver; strings and versions at most 64 characters), capacities quantities.
    The fields of the alpha feature gates (``GATED_SLICE_FIELDS``) are kept and validated only with the
    gate in ``gates`` (``FakeApiServer(feature_gates=...)``), with the real server's rules and messages:
    ``allowMultipleAllocations`` and a capacity's ``requestPolicy`` (``DRAConsumableCapacity``), device
    taints as v1.34.2 takes them (``DRADeviceTaints``; ``prepare`` stamps their ``timeAdded``), a
    slice's ``sharedCounters`` and its devices' ``consumesCounters`` as 1.34 validates them
    (``DRAPartitionableDevices``, ``_counter_problems``)."""

    fields = SLICE_FIELDS
    api_version = "resource.k8s.io/v1"
    cluster_scoped = True

    def __init__(self, store: NodeStore, gates: set[str] | None = None) -> None:
        super().__init__(store, "resourceslices", "ResourceSlice")
        self.gates = gates if gates is not None else set()

    def prepare(self, obj: Obj, old: Obj | None) -> None:
        """As v1.34's strategy: the fields of a gate that is off dropped, unless the old slice uses them (a
        field in use is kept on update); a taint without timeAdded gets now."""
        spec, old_spec = obj.get("spec") or {}, (old or {}).get("spec") or {}
        for gate, (in_use, drop) in GATED_SLICE_FIELDS.items():
            if gate not in self.gates and not in_use(old_spec):
                drop(spec)
        for device in spec.get("devices") or []:
            for taint in (device.get("taints") or []) if isinstance(device, dict) else []:
                if isinstance(taint, dict) and not taint.get("timeAdded"):
                    taint["timeAdded"] = _now()

    def decode(self, obj: Obj) -> None:
        """Its int64 fields hold integers in range (null becomes 0, Go's zero value); anything else is
        the real server's 400 (so a generation past 2^63-1 cannot be written). Without
        DRAPartitionableDevices, its fields are dropped (the strategy's dropDisabledFields)."""
        spec = obj.get("spec") or {}
        pool = spec.get("pool") or {}
        fields = [(pool, key, f"ResourcePool.spec.pool.{key}") for key in ("generation", "resourceSliceCount")]
        fields += [(value, "int", "DeviceAttribute.spec.devices.attributes.int")
                   for device in spec.get("devices") or [] for value in (device.get("attributes") or {}).values()
                   if isinstance(value, dict)]
        for holder, key, go_field in fields:
            if key not in holder:
                continue
            value = holder[key]
            if value is None:
                holder[key] = 0
            elif type(value) is not int or value not in INT64:
                raise unmarshal_error(self.kind, value, go_field)
        for device in spec.get("devices") or []:
            allow = device.get("allowMultipleAllocations")
            if allow is not None and type(allow) is not bool:
                raise unmarshal_error(self.kind, allow, "Device.spec.devices.allowMultipleAllocations", "bool")
            for _, policy in _request_policies(device):
                valid_range = policy.get("validRange") or {}
                values = [policy.get("default"), *(policy.get("validValues") or []),
                          *(valid_range.get(k) for k in ("min", "max", "step"))]
                if any(v is not None and not QUANTITY.fullmatch(str(v)) for v in values):
                    raise ApiError(400, "BadRequest", f'{self.kind} in version "v1" cannot be handled as a '
                                   f"{self.kind}: {BAD_QUANTITY}")

    def validate(self, obj: Obj) -> None:
        name = str(obj.get("metadata", {}).get("name") or "")
        spec = obj.get("spec") or {}
        problems: list[str] = []
        if not DNS_SUBDOMAIN.fullmatch(name):
            problems.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain")
        if not DNS_SUBDOMAIN.fullmatch(str(spec.get("driver") or "")):
            problems.append("spec.driver: Invalid value: a DNS subdomain is required")
        pool = spec.get("pool") or {}
        if not pool.get("name"):
            problems.append("spec.pool.name: Required value")
        generation = pool.get("generation", 0)
        if generation < 0:
            problems.append(f"spec.pool.generation: Invalid value: {generation}: must be greater than or equal to zero")
        if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
            problems.append("spec.pool.resourceSliceCount: Invalid value: must be greater than zero")
        if sum(1 for key in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(key)) != 1:
            problems.append("spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                            "`perDeviceNodeSelection` is required")
        devices = spec.get("devices") or []
        if len(devices) > MAX_DEVICES_PER_SLICE:
            problems.append(f"spec.devices: Too many: {len(devices)}: must have at most {MAX_DEVICES_PER_SLICE} items")
        seen: set[str] = set()
        for i, device in enumerate(devices):
            problems += self._device_problems(f"spec.devices[{i}]", device, seen)
        problems += self._counter_problems(spec)
        if problems:
            raise invalid("ResourceSlice", name, problems)

    @staticmethod
    def _counter_problems(spec: Obj) -> list[str]:
        """1.34's rules for shared counters: set names DNS labels, unique, each with counters named by
        DNS labels whose values are quantities, at most 32 counters in all the sets; a device draws on
        sets of its own slice, once each, on counters the set has, at most 32 counters per device and
        1024 in the slice's devices."""
        problems: list[str] = []
        sets: dict[str, set[str]] = {}
        for i, counter_set in enumerate(spec.get("sharedCounters") or []):
            where = f"spec.sharedCounters[{i}]"
            set_name = str(counter_set.get("name") or "")
            if not set_name:
                problems.append(f"{where}.name: Required value")
            elif not DNS_LABEL.fullmatch(set_name):
                problems.append(f"{where}.name: Invalid value: {set_name!r}: a lowercase RFC 1123 label")
            elif set_name in sets:
                problems.append(f"{where}.name: Duplicate value: {set_name!r}")
            counters = counter_set.get("counters") or {}
            if not counters:
                problems.append(f"{where}.counters: Required value")
            problems += SliceStore._counters(f"{where}.counters", counters)
            sets.setdefault(set_name, set()).update(counters)
        total = sum(len(counter_set.get("counters") or {}) for counter_set in spec.get("sharedCounters") or [])
        if total > MAX_SHARED_COUNTERS:
            problems.append(f"spec.sharedCounters: Invalid value: {total}: the total number of shared counters must "
                            f"not exceed {MAX_SHARED_COUNTERS}")
        in_devices = 0
        for i, device in enumerate(spec.get("devices") or []):
            uses = device.get("consumesCounters") or []
            used: set[str] = set()
            for j, use in enumerate(uses):
                where = f"spec.devices[{i}].consumesCounters[{j}]"
                set_name = str(use.get("counterSet") or "")
                counters = use.get("counters") or {}
                if not set_name:
                    problems.append(f"{where}.counterSet: Required value")
                elif set_name in used:
                    problems.append(f"{where}.counterSet: Duplicate value: {set_name!r}")
                used.add(set_name)
                if not counters:
                    problems.append(f"{where}.counters: Required value")
                problems += SliceStore._counters(f"{where}.counters", counters)
                if set_name not in sets:
                    problems.append(f"{where}.counterSet: Invalid value: {set_name!r}: must reference a counterSet "
                                    "defined in the ResourceSlice sharedCounters")
                else:
                    problems += [f"{where}.counters: Invalid value: {counter!r}: must reference a counter defined in "
                                 "the ResourceSlice sharedCounters"
                                 for counter in counters if counter not in sets[set_name]]
            count = sum(len(use.get("counters") or {}) for use in uses)
            if count > MAX_COUNTERS_PER_DEVICE:
                problems.append(f"spec.devices[{i}]: Invalid value: {count}: the total number of counters must not "
                                f"exceed {MAX_COUNTERS_PER_DEVICE}")
            in_devices += count
        if in_devices > MAX_DEVICE_COUNTERS_PER_SLICE:
            problems.append(f"spec.devices: Invalid value: {in_devices}: the total number of counters in devices must "
                            f"not exceed {MAX_DEVICE_COUNTERS_PER_SLICE}")
        return problems

    @staticmethod
    def _counters(where: str, counters: Obj) -> list[str]:
        problems = []
        for key, value in counters.items():
            if not DNS_LABEL.fullmatch(str(key)):
                problems.append(f"{where}[{key}]: Invalid value: {key!r}: a lowercase RFC 1123 label")
            if not QUANTITY.fullmatch(str((value or {}).get("value") or "")):
                problems.append(f"{where}[{key}].value: Invalid value: {value!r}: a quantity")
        return problems

    @staticmethod
    def _device_problems(where: str, device: Obj, seen: set[str]) -> list[str]:
        problems = []
        device_name = str(device.get("name") or "")
        if not DNS_LABEL.fullmatch(device_name):
            problems.append(f"{where}.name: Invalid value: {device_name!r}: a lowercase RFC 1123 label")
        elif device_name in seen:
            problems.append(f"{where}.name: Duplicate value: {device_name!r}")
        seen.add(device_name)
        attributes, capacity = device.get("attributes") or {}, device.get("capacity") or {}
        if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
            problems.append(f"{where}: Invalid value: {len(attributes) + len(capacity)}: the total number of "
                            f"attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}")
        for key in (*attributes, *capacity):
            domain, slash, identifier = str(key).rpartition("/")
            if not C_IDENTIFIER.fullmatch(identifier) or (slash and (
                    len(domain) > MAX_DOMAIN or not DNS_SUBDOMAIN.fullmatch(domain))):
                problems.append(f"{where}: Invalid value: {key!r}: a C identifier of at most 32 characters, "
                                "optionally after a DNS subdomain and a slash")
        for key, value in attributes.items():
            given = [t for t in ATTRIBUTE_TYPES if t in (value or {})]
            if len(given) != 1:
                problems.append(f"{where}.attributes[{key}]: Invalid value: exactly one value must be specified")
            elif given[0] == "version" and not SEMVER.fullmatch(str(value["version"])):
                problems.append(f"{where}.attributes[{key}].version: Invalid value: {value['version']!r}: "
                                "must be a semantic version")
            elif given[0] in ("string", "version") and len(str(value[given[0]])) > MAX_ATTRIBUTE_VALUE:
                problems.append(f"{where}.attributes[{key}].{given[0]}: Too long: may not be more than "
                                f"{MAX_ATTRIBUTE_VALUE} bytes")
        for key, value in capacity.items():
            if not QUANTITY.fullmatch(str((value or {}).get("value") or "")):
                problems.append(f"{where}.capacity[{key}].value: Invalid value: {value!r}: a quantity")
        allowed = device.get("allowMultipleAllocations") is True
        for key, policy in _request_policies(device):
            path = f"{where}.capacity[{key}].requestPolicy"
            if not allowed:
                problems.append(f"{path}: Forbidden: allowMultipleAllocations must be true")
            elif QUANTITY.fullmatch(str(capacity[key].get("value") or "")):
                problems += request_policy_problems(path, str(capacity[key]["value"]), policy)
        return problems + SliceStore._taint_problems(f"{where}.taints", device.get("taints") or [])

    @staticmethod
    def _taint_problems(where: str, taints: list[Any]) -> list[str]:
        """v1.34.2's messages for bad device taints."""
        problems = []
        if len(taints) > MAX_TAINTS_PER_DEVICE:
            problems.append(f"{where}: Too many: {len(taints)}: must have at most {MAX_TAINTS_PER_DEVICE} items")
        for i, taint in enumerate(taints):
            at = f"{where}[{i}]"
            taint = taint if isinstance(taint, dict) else {}
            key, value, effect = str(taint.get("key") or ""), str(taint.get("value") or ""), taint.get("effect")
            prefix, slash, name = key.rpartition("/")
            if not NAME_PART.fullmatch(name) or len(name) > 63 or (slash and (
                    len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix))):
                problems.append(f"{at}.key: Invalid value: {key!r}: name part must consist of alphanumeric characters, "
                                "'-', '_' or '.', and must start and end with an alphanumeric character, optionally "
                                "after a DNS subdomain prefix and '/'")
            if not LABEL_VALUE.fullmatch(value) or len(value) > 63:
                problems.append(f"{at}.value: Invalid value: {value!r}: a valid label must be an empty string or "
                                "consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                                "alphanumeric character")
            if not effect:
                problems.append(f"{at}.effect: Required value")
            elif effect not in TAINT_EFFECTS:
                problems.append(f"{at}.effect: Unsupported value: {json.dumps(effect)}: supported values: "
                                + ", ".join(json.dumps(e) for e in TAINT_EFFECTS))
        return problems


def request_policy_problems(path: str, capacity_text: str, policy: Obj) -> list[str]:
    """``validateRequestPolicy`` of pkg/apis/resource/validation, with its messages (seen on v1.34.2)."""
    capacity = quantity_value(capacity_text)
    values, valid_range, default = policy.get("validValues") or [], policy.get("validRange"), policy.get("default")
    if values and valid_range is not None:
        return [f'{path}: Forbidden: exactly one policy can be specified, cannot specify "validValues" and '
                '"validRange" at the same time']
    if (values or valid_range is not None) and default is None:
        return [f"{path}.default: Required value: required when {'validValues' if values else 'validRange'} is "
                "defined"]
    problems: list[str] = []
    if values:
        parsed = [quantity_value(v) for v in values]
        if len(values) > MAX_VALID_VALUES:
            return [f"{path}.validValues: Too many: {len(values)}: must have at most {MAX_VALID_VALUES} items"]
        problems += [f'{path}.validValues[{i + 1}]: Invalid value: "{values[i + 1]}": values must be sorted in '
                     "ascending order" for i in range(len(parsed) - 1) if parsed[i] > parsed[i + 1]]
        seen: set[Fraction] = set()
        for i, value in enumerate(parsed):
            if value in seen:
                problems.append(f'{path}.validValues[{i}]: Duplicate value: "{values[i]}"')
            seen.add(value)
            if value > capacity:
                problems.append(f'{path}.validValues[{i}]: Invalid value: "{values[i]}": option is larger than '
                                f"capacity value: {capacity_text}")
        if quantity_value(default) not in parsed:
            problems.append(f'{path}.validValues: Invalid value: "{default}": default value is not valid according '
                            "to the requestPolicy")
    elif valid_range is not None:
        where = f"{path}.validRange"
        if valid_range.get("min") is None:
            return [f"{where}.min: Required value: required when validRange is defined"]
        low, dflt = quantity_value(valid_range["min"]), quantity_value(default)
        if low > capacity:
            problems.append(f'{where}.min: Invalid value: "{valid_range["min"]}": min is larger than capacity value: '
                            f"{capacity_text}")
        if dflt < low:
            problems.append(f'{where}.min: Invalid value: "{default}": default is less than min: {valid_range["min"]}')
        high = valid_range.get("max")
        if high is not None:
            top = quantity_value(high)
            if low > top:
                problems.append(f'{where}.max: Invalid value: "{valid_range["min"]}": min is larger than max: {high}')
            if top > capacity:
                problems.append(f'{where}.max: Invalid value: "{high}": max is larger than capacity value: '
                                f"{capacity_text}")
            if dflt > top:
                problems.append(f'{where}.max: Invalid value: "{default}": default is more than max: {high}')
        step = valid_range.get("step")
        if step is not None:
            size = quantity_value(step)
            if low + size > capacity:
                problems.append(f'{where}.step: Invalid value: "{step}": one step is larger than capacity value: '
                                f"{capacity_text}")
            for value, text in ((dflt, default), *(((top, high),) if high is not None else ())):
                if size and (value - low) % size:
                    problems.append(f'{where}.step: Invalid value: "{text}": value is not a multiple of a given step '
                                    f"({step}) from ({valid_range['min']})")
    return problems


class ClaimStore(ObjectStore):
    """ResourceClaims (``resource.k8s.io/v1``): what the scheduler and the resourceclaim controller
    leave in them is written by tests (``FakeApiServer.create_resource_claim``)."""

    fields = CONFIG_MAP_FIELDS
    api_version = "resource.k8s.io/v1"

    def __init__(self, store: NodeStore) -> None:
        super().__init__(store, "resourceclaims", "ResourceClaim")


# --------------------------------------------------------------------------- faults and request log


@dataclass
class Fault:
    """What to do to matching requests: answer ``status``, wait ``delay_s``, or drop the connection."""

    verb: str | None = None  # None matches every verb
    resource: str | None = None
    status: int | None = None
    delay_s: float = 0.0
    drop: bool = False
    times: int | None = None  # None: until cleared
    message: str | None = None  # the Status message with ``status`` (default: "injected fault <status>")

    def matches(self, verb: str, resource: str) -> bool:
        return self.verb in (None, verb) and self.resource in (None, resource) and self.times != 0


class Faults:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: list[Fault] = []
        self.forbidden: set[tuple[str, str]] = set()

    def add(self, fault: Fault) -> Fault:
        with self.lock:
            self.active.append(fault)
        return fault

    def clear(self) -> None:
        with self.lock:
            self.active.clear()
            self.forbidden.clear()

    def take(self, verb: str, resource: str) -> Fault | None:
        with self.lock:
            for fault in self.active:
                if fault.matches(verb, resource):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None


@dataclass
class Request:
    at: float
    method: str
    verb: str
    resource: str
    path: str
    code: int = 0
    content_type: str = ""
    body: Any = None
    query: dict[str, str] = field(default_factory=dict)


class RequestLog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Request] = []

    def add(self, request: Request) -> None:
        with self.lock:
            self.requests.append(request)

    def count(self, verb: str | None = None, resource: str | None = "nodes", since: float = 0.0) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.at >= since and verb in (None, r.verb)
                       and resource in (None, r.resource))

    def by_verb(self, since: float = 0.0) -> Counter[str]:
        with self.lock:
            return Counter(r.verb for r in self.requests if r.at >= since)

    def writes(self, since: float = 0.0) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.at >= since and r.verb in ("patch", "create", "update")
                    and r.resource == "nodes"]


# --------------------------------------------------------------------------- HTTP


def _json_pointer_key(path: str) -> str:
    prefix = "/metadata/labels/"
    if not path.startswith(prefix):
        raise ApiError(422, "Invalid", f"the fake only patches labels, not {path}")
    return path[len(prefix):].replace("~1", "/").replace("~0", "~")


def _json_patch(labels: dict[str, str], ops: list[Obj]) -> None:
    trial = dict(labels)
    for op in ops:
        key = _json_pointer_key(op["path"])
        if op["op"] in ("add", "replace"):
            if op["op"] == "replace" and key not in trial:
                raise ApiError(422, "Invalid", f"replace operation does not apply: doc is missing key: {op['path']}")
            trial[key] = op["value"]
        elif op["op"] == "remove":
            if key not in trial:
                raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                               f"remove operation does not apply: doc is missing path: {op['path']}")
            del trial[key]
        elif op["op"] == "test" and trial.get(key) != op.get("value"):
            raise ApiError(422, "Invalid", f"testing value {op['path']} failed")
    labels.clear()
    labels.update(trial)


def _merge_labels(labels: dict[str, str], patch: Obj) -> None:
    for key, value in (patch.get("metadata", {}).get("labels") or {}).items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as Go's net/http (the real API server): otherwise the body, written after the
    # headers, waits for the client's delayed ACK and every request on a kept-alive connection takes 40 ms.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    # -- routing
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        resource, name, namespace = self._parse_path(url.path)
        verb = self._verb(method, name, query)
        request = Request(time.monotonic(), method, verb, resource, url.path, query=query,
                          content_type=self.headers.get("Content-Type", ""))
        body = self._read_body()
        request.body = body
        api = self.server.api
        api.log.add(request)
        try:
            if (verb, resource) in api.faults.forbidden:
                named = name if verb not in ("list", "watch") else name_in_selector(query.get("fieldSelector"))
                raise ApiError(403, "Forbidden", forbidden_message(api.user, verb, resource, named, namespace))
            fault = api.faults.take(verb, resource)
            if fault is not None:
                if fault.delay_s:
                    time.sleep(fault.delay_s)
                if fault.drop:
                    request.code = -1
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fault.status is not None:
                    raise ApiError(fault.status, "InternalError" if fault.status >= 500 else "Injected",
                                   fault.message or f"injected fault {fault.status}")
            if verb == "watch":
                match = api.selector(resource, query)  # a bad selector is a 400 before the stream starts
                request.code = 200
                self._watch(resource, namespace, match, query)
                return
            code, answer = self._route(method, verb, resource, namespace, name, body, query)
        except ApiError as err:
            code, answer = err.code, err.body
        except (KeyError, ValueError, TypeError) as err:
            code, answer = 400, status_body(400, "BadRequest", f"bad request: {err}")
        request.code = code
        self._send_json(code, answer)

    @staticmethod
    def _parse_path(path: str) -> tuple[str, str | None, str | None]:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "v1"]:
            parts = parts[2:]
        elif "/" + "/".join(parts[:3]) in (NFD_GROUP_PATH, RESOURCE_GROUP_PATH):
            parts = parts[3:]
        else:
            return "unknown", None, None
        namespace = None
        if parts and parts[0] == "namespaces" and len(parts) >= 3:
            namespace, parts = parts[1], parts[2:]
        resource = parts[0] if parts else "unknown"
        name = parts[1] if len(parts) > 1 else None
        if len(parts) > 2:  # a subresource: pods/<name>/binding
            resource = f"{resource}/{parts[2]}"
        return resource, name, namespace

    @staticmethod
    def _verb(method: str, name: str | None, query: dict[str, str]) -> str:
        if method == "GET":
            if query.get("watch") in ("true", "1"):
                return "watch"
            return "get" if name else "list"
        return {"PATCH": "patch", "POST": "create", "PUT": "update", "DELETE": "delete"}[method]

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            import yaml

            return yaml.safe_load(raw)

    def _send_json(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            self.close_connection = True

    def _route(self, method: str, verb: str, resource: str, namespace: str | None, name: str | None,
               body: Any, query: dict[str, str]) -> tuple[int, Obj]:
        api = self.server.api
        if resource == "nodes":
            if verb == "get":
                assert name is not None
                with api.store.lock:
                    return 200, api.store.get(name)
            if verb == "list":
                nodes = api.store.list_nodes(api.selector(resource, query), query.get("limit"), query.get("continue"))
                return 200, self._list("NodeList", *nodes)
            if verb == "patch":
                assert name is not None
                return 200, self._patch_node(name, body, query)
        if resource == "pods/binding" and verb == "create" and namespace is not None and name is not None:
            return 201, api.pods.bind(namespace, name, body or {})
        objects = api.namespaced.get(resource)
        if objects is not None:
            return self._namespaced(objects, verb, namespace, name, body, query)
        if resource == "nodefeatures" and namespace is not None:
            return api.custom_object(verb, "nodefeatures", namespace, name, body)
        if resource == "events" and verb == "create" and namespace is not None:
            with api.store.lock:
                api.store.events.append(body)
            return 201, body
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({method} {self.path})")

    @staticmethod
    def _list(kind: str, items: list[Obj], rv: str, token: str | None) -> Obj:
        metadata: Obj = {"resourceVersion": rv}
        if token:
            metadata["continue"] = token
        return {"kind": kind, "apiVersion": "v1", "metadata": metadata, "items": items}

    def _namespaced(self, objects: ObjectStore, verb: str, namespace: str | None, name: str | None, body: Any,
                    query: dict[str, str]) -> tuple[int, Obj]:
        if verb == "list":
            match = self.server.api.selector(objects.resource, query)
            return 200, self._list(f"{objects.kind}List", *objects.list(namespace, match, query.get("limit"),
                                                                        query.get("continue")))
        if objects.cluster_scoped:
            namespace = ""
        if namespace is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({self.path})")
        if verb == "create":
            return 201, objects.create(namespace, body or {})
        if name is None:
            raise ApiError(405, "MethodNotAllowed", f"{verb} needs a name")
        if verb == "get":
            return 200, objects.get(namespace, name)
        if verb == "delete":
            uid = ((body or {}).get("preconditions") or {}).get("uid")
            return 200, objects.delete(namespace, name, uid)
        if verb == "update":
            return 200, objects.replace(namespace, name, body or {})
        if verb == "patch":
            content_type = self.headers.get("Content-Type", "").split(";")[0].strip()
            if content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                raise ApiError(415, "UnsupportedMediaType", f"the fake patches {objects.resource} only with merge "
                               f"patches, not {content_type}")
            return 200, objects.patch_metadata(namespace, name, body or {})
        raise ApiError(405, "MethodNotAllowed", f"{verb} {objects.resource} is not supported by the fake")

    def _patch_node(self, name: str, body: Any, query: dict[str, str]) -> Obj:
        store = self.server.api.store
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip()
        manager = query.get("fieldManager", DEFAULT_UPDATE_MANAGER)
        if content_type == "application/apply-patch+yaml":
            if "fieldManager" not in query:
                raise ApiError(400, "BadRequest", "PATCH /api/v1/nodes: fieldManager is required for apply requests")
            desired = dict((body.get("metadata") or {}).get("labels") or {})
            force = query.get("force") == "true"
            return store.write_labels(name, lambda labels, own: own.apply(labels, manager, desired, force, name))
        if content_type == "application/json-patch+json":
            def change(labels: dict[str, str], own: Ownership) -> None:
                before = dict(labels)
                _json_patch(labels, body)
                own.update(before, labels, manager)
            return store.write_labels(name, change)
        if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            stale = (body.get("metadata") or {}).get("resourceVersion")

            def merge(labels: dict[str, str], own: Ownership) -> None:
                before = dict(labels)
                _merge_labels(labels, body)
                own.update(before, labels, manager)
            return store.write_labels(name, merge, stale_rv=stale)
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")

    def _watch(self, resource: str, namespace: str | None, match: Match, query: dict[str, str]) -> None:
        api = self.server.api
        objects = api.namespaced.get(resource)
        if objects is not None and namespace is not None:
            selected, namespace_match = match, namespace

            def match(obj: Obj) -> bool:
                return bool(obj["metadata"].get("namespace") == namespace_match and selected(obj))
        timeout = float(query.get("timeoutSeconds") or 300)
        deadline = time.monotonic() + min(timeout, api.max_watch_s)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        rv_text = query.get("resourceVersion") or "0"
        api.open_watches_change(+1)
        try:
            if rv_text == "0":
                items, rv_text, _ = (api.store.list_nodes(match) if objects is None else objects.list(None, match))
                for item in items:
                    self._chunk({"type": "ADDED", "object": item})
            try:
                for event in api.store.events_since(int(rv_text), resource, match, deadline):
                    if event is not None:
                        self._chunk({"type": event[0], "object": event[1]})
                    elif api.drop_watches.is_set():
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
            except ApiError as err:
                self._chunk({"type": "ERROR", "object": err.body})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            api.open_watches_change(-1)

    def _chunk(self, event: Obj) -> None:
        data = (json.dumps(event) + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def forbidden_message(user: str, verb: str, resource: str, name: str | None, namespace: str | None) -> str:
    """The real API server's RBAC refusal (real-kubernetes-behaviour.md). A list or watch names the
    object of its metadata.name field selector, as a real v1.24 server does, and no object without one."""
    group = {"nodefeatures": "nfd.k8s-sigs.io", "resourceslices": "resource.k8s.io",
             "resourceclaims": "resource.k8s.io"}.get(resource, "")
    subject = f'{resource} "{name}"' if name else resource
    scope = f'the namespace "{namespace}"' if namespace else "the cluster scope"
    return (f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group "{group}" '
            f"at {scope}")


def name_in_selector(selector: str | None) -> str | None:
    """The name a field selector's ``metadata.name=`` term names, if any."""
    match = re.search(r"(?:^|,)\s*metadata\.name\s*==?\s*([^,]+)", selector or "")
    return match.group(1).strip() if match else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024
    api: FakeApiServer


# --------------------------------------------------------------------------- the server


class FakeApiServer:
    """``with FakeApiServer() as api: api.create_node("gpu-node-1"); api.write_kubeconfig(path)``."""

    def __init__(self, max_watch_s: float = 300.0, user: str = "labeller", feature_gates: Iterable[str] = ()) -> None:
        self.user = user  # who the 403 answers name: "labeller", "system:serviceaccount:<ns>:<name>", ...
        # The alpha feature gates turned on, as kube-apiserver's --feature-gates (1.34's defaults: none
        # of GATED_SLICE_FIELDS); a test may change the set while the server runs.
        self.feature_gates: set[str] = set(feature_gates)
        self.store = NodeStore()
        self.pods = PodStore(self.store)
        self.config_maps = ObjectStore(self.store, "configmaps", "ConfigMap")
        self.resource_slices = SliceStore(self.store, self.feature_gates)
        self.resource_claims = ClaimStore(self.store)
        self.namespaced: dict[str, ObjectStore] = {"pods": self.pods, "configmaps": self.config_maps,
                                                   "resourceslices": self.resource_slices,
                                                   "resourceclaims": self.resource_claims}
        self.faults = Faults()
        self.log = RequestLog()
        self.max_watch_s = max_watch_s
        self.drop_watches = threading.Event()
        self._watches_lock = threading.Lock()
        self.open_watches = 0
        self.max_open_watches = 0
        self._http = _Server(("127.0.0.1", 0), Handler)
        self._http.api = self
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-apiserver", daemon=True)

    # -- lifecycle
    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.store.close()
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "labeller", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "labeller"}}],
        }))
        return path

    def selector(self, resource: str, query: dict[str, str]) -> Selector:
        objects = self.namespaced.get(resource)
        fields = NODE_FIELDS if objects is None else objects.fields
        return Selector(resource, fields, query.get("fieldSelector"), query.get("labelSelector"))

    def open_watches_change(self, delta: int) -> None:
        with self._watches_lock:
            self.open_watches += delta
            self.max_open_watches = max(self.max_open_watches, self.open_watches)

    # -- test helpers: the cluster as other actors change it
    def create_node(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        return self.store.create(name, labels)

    def delete_node(self, name: str) -> None:
        self.store.delete(name)

    def set_node_status(self, name: str, capacity: dict[str, str] | None = None,
                        allocatable: dict[str, str] | None = None) -> Obj:
        """What a kubelet reports: capacity and allocatable (allocatable defaults to capacity)."""
        status: Obj = {}
        if capacity is not None:
            status["capacity"] = dict(capacity)
        if allocatable is not None or capacity is not None:
            status["allocatable"] = dict(allocatable if allocatable is not None else capacity or {})
        return self.store.write_status(name, status)

    def create_pod(self, name: str, namespace: str = "default", *, node: str | None = None,
                   containers: dict[str, dict[str, str]] | None = None, labels: dict[str, str] | None = None,
                   annotations: dict[str, str] | None = None, phase: str = "Pending") -> Obj:
        """A pod with one container per ``containers`` entry (name -> resource limits), unbound unless
        ``node`` is given."""
        spec: Obj = {"containers": [{"name": cname, "image": "busybox", "resources": {"limits": dict(limits)}}
                                    for cname, limits in (containers or {"main": {}}).items()]}
        if node:
            spec["nodeName"] = node
        metadata: Obj = {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})}
        return self.pods.create(namespace, {"metadata": metadata, "spec": spec, "status": {"phase": phase}})

    def pod(self, name: str, namespace: str = "default") -> Obj:
        return self.pods.get(namespace, name)

    def set_pod_phase(self, name: str, phase: str, namespace: str = "default") -> Obj:
        """What the kubelet writes through the status subresource."""
        return self.pods.change(namespace, name, lambda pod: pod["status"].update({"phase": phase}))

    def set_pod_annotations(self, name: str, annotations: dict[str, str | None], namespace: str = "default") -> Obj:
        return self.pods.patch_metadata(namespace, name, {"metadata": {"annotations": annotations}})

    def start_deleting_pod(self, name: str, namespace: str = "default") -> Obj:
        """A graceful delete under way: the pod stays, with a deletionTimestamp."""
        return self.pods.change(namespace, name, lambda pod: pod["metadata"].update({"deletionTimestamp": _now()}))

    def delete_pod(self, name: str, namespace: str = "default") -> Obj:
        return self.pods.delete(namespace, name)

    def set_config_map(self, name: str, data: dict[str, str], namespace: str = "kube-system") -> Obj:
        """Create the ConfigMap, or replace its data."""
        with self.store.lock:
            exists = (namespace, name) in self.config_maps.objects
        if exists:
            return self.config_maps.change(namespace, name, lambda obj: obj.update({"data": dict(data)}))
        return self.config_maps.create(namespace, {"metadata": {"name": name}, "data": dict(data)})

    def slices(self, node: str | None = None, driver: str | None = None) -> list[Obj]:
        """The ResourceSlices (of ``node`` and ``driver`` when given), by name."""
        items, _, _ = self.resource_slices.list(None)
        return [s for s in items if node in (None, s["spec"].get("nodeName")) and driver in (None, s["spec"]["driver"])]

    def create_slice(self, name: str, node: str, driver: str, devices: list[Obj], generation: int = 1,
                     pool: str | None = None) -> Obj:
        """A ResourceSlice as another writer (a previous plugin, another driver) leaves it."""
        return self.resource_slices.create("", {"metadata": {"name": name}, "spec": {
            "driver": driver, "nodeName": node, "devices": devices,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1}}})

    def delete_slice(self, name: str) -> Obj:
        return self.resource_slices.delete("", name)

    def create_resource_claim(self, name: str, namespace: str = "default", *,
                              results: list[Obj] | None = None, config: list[Obj] | None = None) -> Obj:
        """A ResourceClaim; with ``results`` (each {"request", "driver", "pool", "device"}), allocated
        as the scheduler leaves it, with ``config`` (each {"source", "requests", "opaque"}) beside them."""
        claim = self.resource_claims.create(namespace, {"metadata": {"name": name}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}, "status": {}})
        return self.set_claim_allocation(name, results, namespace, config) if results is not None else claim

    def set_claim_allocation(self, name: str, results: list[Obj] | None, namespace: str = "default",
                             config: list[Obj] | None = None) -> Obj:
        """What the scheduler writes into ``status.allocation`` (None: deallocated): the results, and
        the configs of the DeviceClasses and the claim (``config``: each entry's ``source`` says which)."""
        def allocate(claim: Obj) -> None:
            if results is None:
                claim["status"].pop("allocation", None)
            else:
                devices: Obj = {"results": [dict(r) for r in results]}
                if config:
                    devices["config"] = [dict(c) for c in config]
                claim["status"]["allocation"] = {"devices": devices}
        return self.resource_claims.change(namespace, name, allocate)

    def labels(self, name: str) -> dict[str, str]:
        with self.store.lock:
            return dict(self.store.get(name)["metadata"]["labels"])

    def managers_of(self, name: str, key: str) -> set[Entry]:
        """The managedFields entries, (manager, operation), that own label ``key``."""
        with self.store.lock:
            return set(self.store.ownership[name].owners.get(key, set()))

    def set_labels(self, name: str, labels: dict[str, str | None], manager: str = "kubectl-label") -> Obj:
        """What ``kubectl label --overwrite`` does: a merge patch as another field manager (None removes)."""
        def change(current: dict[str, str], own: Ownership) -> None:
            before = dict(current)
            _merge_labels(current, {"metadata": {"labels": labels}})
            own.update(before, current, manager)
        return self.store.write_labels(name, change)

    def apply_as(self, name: str, manager: str, labels: dict[str, str], force: bool = True) -> Obj:
        return self.store.write_labels(name, lambda current, own: own.apply(current, manager, labels, force, name))

    def forbid(self, verb: str, resource: str = "nodes") -> None:
        with self.faults.lock:
            self.faults.forbidden.add((verb, resource))

    def allow(self, verb: str, resource: str = "nodes") -> None:
        with self.faults.lock:
            self.faults.forbidden.discard((verb, resource))

    def custom_object(self, verb: str, plural: str, namespace: str, name: str | None, body: Any) -> tuple[int, Obj]:
        with self.store.lock:
            key = (plural, namespace, name or (body or {}).get("metadata", {}).get("name", ""))
            existing = self.store.custom.get(key)
            if verb == "get":
                if existing is None:
                    raise ApiError(404, "NotFound", f'{plural}.nfd.k8s-sigs.io "{key[2]}" not found')
                return 200, existing
            if verb == "create":
                if existing is not None:
                    raise ApiError(409, "AlreadyExists", f'{plural}.nfd.k8s-sigs.io "{key[2]}" already exists')
                body["metadata"]["resourceVersion"] = self.store._bump()
                self.store.custom[key] = body
                return 201, body
            if verb == "update":
                if existing is None:
                    raise ApiError(404, "NotFound", f'{plural}.nfd.k8s-sigs.io "{key[2]}" not found')
                sent_rv = body.get("metadata", {}).get("resourceVersion")
                if sent_rv and sent_rv != existing["metadata"]["resourceVersion"]:
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {plural}.nfd.k8s-sigs.io '
                                   f'"{key[2]}": the object has been modified; please apply your changes to the '
                                   "latest version and try again")
                body["metadata"]["resourceVersion"] = self.store._bump()
                self.store.custom[key] = body
                return 200, body
        raise ApiError(405, "MethodNotAllowed", f"{verb} {plural} is not supported by the fake")

    def node_feature(self, namespace: str, name: str) -> Obj | None:
        with self.store.lock:
            return self.store.custom.get(("nodefeatures", namespace, name))

    def events(self) -> list[Obj]:
        with self.store.lock:
            return list(self.store.events)
