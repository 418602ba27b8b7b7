"""A fake Kubernetes API server over real HTTP, for driving the real daemon and the official client.

It keeps the semantics observed on a real kube-apiserver (``shared/reference/real-kubernetes-behaviour.md``)
for what gpu-labeller touches: Nodes (get, list and watch with a field selector, merge /
strategic-merge / JSON / server-side-apply patches with per-field-manager label ownership,
resourceVersion and 409), NodeFeature objects, and Events. Faults are injected on demand: RBAC
403, 5xx, slow answers and dropped connections. Every request is logged and counted by verb.

One class per concern: ``Ownership`` (managedFields for labels), ``NodeStore`` (objects,
resourceVersions, watch history), ``Faults``, ``RequestLog``, ``Handler`` (HTTP routing) and
``FakeApiServer`` (start/stop, kubeconfig, test helpers).
"""

from __future__ import annotations

import bisect
import copy
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlparse

Obj = dict[str, Any]
NFD_GROUP_PATH = "/apis/nfd.k8s-sigs.io/v1alpha1"
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
        return [{"manager": manager, "operation": operation, "apiVersion": "v1", "time": self.times.get((manager, operation), _now()),
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": fields}}}
                for (manager, operation), fields in sorted(per_entry.items())]


# --------------------------------------------------------------------------- objects and watch history


@dataclass
class WatchEvent:
    resource_version: int
    type: str
    obj: Obj


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

    def _record(self, type_: str, name: str, obj: Obj | None = None) -> None:
        obj = self.view(name) if obj is None else obj
        self.history.append(WatchEvent(self.resource_version, type_, obj))
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
            change(labels, ownership)
            if labels != before_labels or ownership.owners != before_owners:
                node["metadata"]["resourceVersion"] = self._bump()
                self._record("MODIFIED", name)
            return self.view(name)

    def list_nodes(self, name: str | None) -> tuple[list[Obj], str]:
        with self.lock:
            names = [n for n in sorted(self.nodes) if name is None or n == name]
            return [self.view(n) for n in names], str(self.resource_version)

    def events_since(self, rv: int, name: str | None, deadline: float) -> Iterator[WatchEvent | None]:
        """Yield history after ``rv`` for ``name``, waiting for more until ``deadline``; None = keep-alive tick."""
        if rv < self.oldest_rv:
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.oldest_rv})")
        while time.monotonic() < deadline:
            with self.lock:
                if self.closed:
                    return
                if not self.history or self.history[-1].resource_version <= rv:
                    self.lock.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                pending = self._after(rv, name)
                if self.history:
                    rv = max(rv, self.history[-1].resource_version)
            yield from pending
            yield None

    def _after(self, rv: int, name: str | None) -> list[WatchEvent]:
        start = bisect.bisect_right(self.history, rv, key=lambda e: e.resource_version)
        return [e for e in self.history[start:] if name is None or e.obj["metadata"]["name"] == name]

    def compact(self) -> None:
        """Forget the watch history: any watch resuming from an older resourceVersion gets 410 Gone."""
        with self.lock:
            self.history.clear()
            self.oldest_rv = self.resource_version

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()


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
                named = name if verb not in ("list", "watch") else name_from_selector(query.get("fieldSelector"))
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
                request.code = 200
                self._watch(name_from_selector(query.get("fieldSelector")), query)
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
        elif "/" + "/".join(parts[:3]) == NFD_GROUP_PATH:
            parts = parts[3:]
        else:
            return "unknown", None, None
        namespace = None
        if parts and parts[0] == "namespaces" and len(parts) >= 3:
            namespace, parts = parts[1], parts[2:]
        resource = parts[0] if parts else "unknown"
        name = parts[1] if len(parts) > 1 else None
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
                items, rv = api.store.list_nodes(name_from_selector(query.get("fieldSelector")))
                return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items}
            if verb == "patch":
                assert name is not None
                return 200, self._patch_node(name, body, query)
        if resource == "nodefeatures" and namespace is not None:
            return api.custom_object(verb, "nodefeatures", namespace, name, body)
        if resource == "events" and verb == "create" and namespace is not None:
            with api.store.lock:
                api.store.events.append(body)
            return 201, body
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({method} {self.path})")

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

    def _watch(self, name: str | None, query: dict[str, str]) -> None:
        api = self.server.api
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
                items, rv_text = api.store.list_nodes(name)
                for item in items:
                    self._chunk({"type": "ADDED", "object": item})
            try:
                for event in api.store.events_since(int(rv_text), name, deadline):
                    if event is not None:
                        self._chunk({"type": event.type, "object": event.obj})
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
    group = "nfd.k8s-sigs.io" if resource == "nodefeatures" else ""
    subject = f'{resource} "{name}"' if name else resource
    scope = f'the namespace "{namespace}"' if namespace else "the cluster scope"
    return (f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group "{group}" '
            f"at {scope}")


def name_from_selector(selector: str | None) -> str | None:
    if not selector:
        return None
    match = re.fullmatch(r"metadata\.name=(.+)", selector)
    if match is None:
        raise ApiError(400, "BadRequest", f"the fake supports only metadata.name field selectors, not {selector!r}")
    return match.group(1)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024
    api: FakeApiServer


# --------------------------------------------------------------------------- the server


class FakeApiServer:
    """``with FakeApiServer() as api: api.create_node("gpu-node-1"); api.write_kubeconfig(path)``."""

    def __init__(self, max_watch_s: float = 300.0, user: str = "labeller") -> None:
        self.user = user  # who the 403 answers name: "labeller", "system:serviceaccount:<ns>:<name>", ...
        self.store = NodeStore()
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

    def open_watches_change(self, delta: int) -> None:
        with self._watches_lock:
            self.open_watches += delta
            self.max_open_watches = max(self.max_open_watches, self.open_watches)

    # -- test helpers: the cluster as other actors change it
    def create_node(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        return self.store.create(name, labels)

    def delete_node(self, name: str) -> None:
        self.store.delete(name)

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
