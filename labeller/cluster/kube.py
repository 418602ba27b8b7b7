"""The only module that imports the official ``kubernetes`` client: a thin, typed adapter.

Every call returns plain dicts (bodies are read as JSON, never turned into client models) and every
failure becomes one of this module's small error types, so the rest of gpu-labeller neither
imports nor knows the client. Each request reports ``(verb, code)`` to an optional observer
(metrics); code 0 means no HTTP answer (timeout, refused or dropped connection).

Of the client, only its configuration (credentials, TLS, token refresh) and its REST layer (a
urllib3 pool, retries) are used, and only they are loaded: the ``kubernetes`` and
``kubernetes.config`` packages are registered without running their ``__init__`` (which load every
API group, the dynamic client, the watch, stream and leader-election helpers, the kubeconfig loader
with OAuth2 and ``requests``, and, through ``ApiClient``, pydantic: about 20 MiB of a process's
memory for nothing). The kubeconfig loader is loaded when a kubeconfig needs it
(``labeller.cluster.kubeconfig``), the in-cluster one always.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import json
import os
import re
import ssl
import sys
from collections.abc import Callable, Generator, Iterator, Mapping
from types import ModuleType
from typing import Any
from urllib.parse import quote

import urllib3
import yaml

from labeller.cluster.kubeconfig import static_credentials
from labeller.base.errors import ClusterError
from labeller.model.labels import FIELD_MANAGER


def _bare_package(name: str) -> None:
    """Register the package ``name`` without running its ``__init__``: its submodules load as usual.
    A package already imported (whole) stays as it is."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return  # not a package here: the imports below fail, or work, as they would have
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def _client_modules() -> tuple[ModuleType, ...]:
    _bare_package("kubernetes")
    _bare_package("kubernetes.config")
    return tuple(importlib.import_module(f"kubernetes.{name}") for name in (
        "client.configuration", "client.rest", "client.exceptions", "config.config_exception",
        "config.incluster_config"))


_configuration, _rest, _exceptions, _config_exception, _incluster = _client_modules()
ApiException: type[Exception] = _exceptions.ApiException
ConfigException: type[Exception] = _config_exception.ConfigException
USER_AGENT = "OpenAPI-Generator/{}/python".format(getattr(sys.modules["kubernetes.client"], "__version__", ""))

Obj = dict[str, Any]
Observer = Callable[[str, int], None]

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSON = "application/json"
NFD_GROUP, NFD_VERSION, NFD_PLURAL = "nfd.k8s-sigs.io", "v1alpha1", "nodefeatures"
RESOURCE_API = "/apis/resource.k8s.io/v1"  # Dynamic Resource Allocation, GA in Kubernetes 1.34
REQUEST_TIMEOUT = (3.0, 10.0)  # connect, read (seconds)
LIST_PAGE_SIZE = 500

_FORBIDDEN = re.compile(r'cannot (?P<verb>\w+) resource "(?P<resource>[^"]+)"')
_USER = re.compile(r'User "(?P<user>[^"]*)" cannot')
_SERVICE_ACCOUNT = "system:serviceaccount:"


class KubeError(ClusterError):
    """An API call failed. ``status`` is the HTTP code, 0 when there was no answer."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class Unavailable(KubeError):
    """No answer, a timeout, or a 5xx / 429: try again later."""


class Unreachable(Unavailable):
    """No answer at all: ``str()`` is the one line that names the server and what failed."""

    def __str__(self) -> str:
        return self.message


class Forbidden(KubeError):
    """403. RBAC refused ``verb`` on ``resource`` to ``identity``; or, when ``identity`` is None, something
    else refused the request (an admission policy, a create that patch cannot do): the message says what."""

    def __init__(self, status: int, reason: str, message: str, verb: str, resource: str) -> None:
        super().__init__(status, reason, message)
        match = _FORBIDDEN.search(message)
        self.verb = match.group("verb") if match else verb
        self.resource = match.group("resource") if match else resource
        self.identity = identity(message)


def identity(message: str) -> str | None:
    """Who RBAC refused, as an admin would grant it: "ServiceAccount <ns>/<name>" or "user <name>",
    from the API server's 403 message (``User "system:serviceaccount:ns:name" cannot ...``)."""
    match = _USER.search(message)
    if match is None:
        return None
    user = match.group("user")
    namespace, _, name = user.removeprefix(_SERVICE_ACCOUNT).partition(":")
    if user.startswith(_SERVICE_ACCOUNT) and name:
        return f"ServiceAccount {namespace}/{name}"
    return f"user {user}"


class NotFound(KubeError):
    """404."""


class Conflict(KubeError):
    """409: stale resourceVersion, or an apply conflict."""


class Gone(KubeError):
    """410: the resourceVersion to resume a watch from is too old; list again."""


class InvalidName(KubeError):
    """A name that cannot be one segment of an API path ('', '.', '..', or holding '/'): no request was made."""


def _segment(name: str) -> str:
    """``name`` as one segment of an API path, every reserved character escaped; InvalidName for a
    name that would name another path (a caller's own checks come first: this is the last line)."""
    if name in ("", ".", "..") or "/" in name:
        raise InvalidName(0, "InvalidName", f"{name[:253]!r} cannot be an object's name in an API path")
    return quote(name, safe="")


def _network_error(exc: Exception, server: str) -> KubeError:
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
        return Unreachable(0, type(exc).__name__, f"cannot reach the API server at {server}: {_what_failed(exc)}")
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, ApiException):
        return Unavailable(0, type(exc).__name__, detail)
    return KubeError(0, type(exc).__name__, detail)


def _what_failed(exc: BaseException) -> str:
    """What went wrong under urllib3's wrappers (MaxRetryError, NewConnectionError), in a few words:
    "connection refused", "timed out", "host name not found", "TLS: <why>"."""
    chain: list[BaseException] = []
    cause: object = exc
    while isinstance(cause, BaseException) and cause not in chain:
        chain.append(cause)
        cause = getattr(cause, "reason", None) or cause.__cause__ or cause.__context__

    def first(*kinds: type[BaseException]) -> BaseException | None:
        return next((error for error in chain if isinstance(error, kinds)), None)

    if first(urllib3.exceptions.NameResolutionError) is not None:
        return "host name not found"
    if (tls := first(urllib3.exceptions.SSLError, ssl.SSLError)) is not None:
        return "TLS: " + _first_line(tls.args[-1] if tls.args else tls)
    refused = next((e for e in chain
                    if isinstance(e, OSError) and not isinstance(e, TimeoutError) and e.strerror), None)
    if isinstance(refused, OSError) and refused.strerror:  # connection refused, network unreachable, ...
        return refused.strerror[0].lower() + refused.strerror[1:]
    if first(urllib3.exceptions.TimeoutError, TimeoutError) is not None:
        return "timed out"
    return _first_line(chain[-1])


def _first_line(thing: object) -> str:
    return (str(thing).strip().splitlines() or [type(thing).__name__])[0]


def _status_error(status: int, data: bytes, verb: str, resource: str) -> KubeError:
    message = reason = f"HTTP {status}"
    try:
        body = json.loads(data or b"{}")
        message, reason = str(body.get("message", message)), str(body.get("reason", reason))
    except (TypeError, ValueError, AttributeError):
        pass
    if status == 403:
        return Forbidden(status, reason, message, verb, resource)
    kinds: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone}
    if status in kinds:
        return kinds[status](status, reason, message)
    if status >= 500 or status == 429:
        return Unavailable(status, reason, message)
    return KubeError(status, reason, message)


def load_configuration(kubeconfig: str | Mapping[str, Any] | None, where: str = "") -> Any:
    """The client's ``Configuration``: credentials from ``kubeconfig`` (a kubeconfig file, or a
    kubeconfig already read and merged from the files ``where`` names: labeller.cluster.connect),
    else the pod's service account.

    Any problem is a KubeError whose message is one line: a malformed kubeconfig makes the client
    raise anything from ConfigException to TypeError or UnicodeDecodeError."""
    configuration = _configuration.Configuration()
    where = where or (kubeconfig if isinstance(kubeconfig, str) else "")
    static = static_credentials(kubeconfig) if isinstance(kubeconfig, Mapping) else None
    try:
        if static is not None:
            for name, value in vars(static).items():
                if name != "token" and value is not None:
                    setattr(configuration, name, value)
            if static.token is not None:
                configuration.api_key["BearerToken"] = static.token
        elif isinstance(kubeconfig, Mapping):
            _kubeconfig_loader().load_kube_config_from_dict(dict(kubeconfig), client_configuration=configuration,
                                                            persist_config=False)
        elif kubeconfig:
            # KUBECONFIG may list several files; when none exists the client only says "No configuration found".
            if not any(os.path.exists(os.path.expanduser(path)) for path in kubeconfig.split(os.pathsep) if path):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), kubeconfig)
            _kubeconfig_loader().load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            _incluster.load_incluster_config(client_configuration=configuration)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        problem = _config_problem(exc)
        raise KubeError(0, "ConfigError", f"{where}: {problem}" if where else problem) from None
    # One quick retry of a connect error (a stale pooled connection); the daemon owns real retries.
    configuration.retries = urllib3.Retry(total=1, connect=1, read=0, redirect=0, status=0, other=0)
    return configuration


def _kubeconfig_loader() -> Any:
    """The client's kubeconfig loader, for a kubeconfig ``static_credentials`` does not read (it
    loads OAuth2, ``requests`` and pydantic)."""
    return importlib.import_module("kubernetes.config.kube_config")


def _config_problem(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not a kubeconfig: not UTF-8 text"
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        return "not a kubeconfig: not valid YAML" + (f" at line {mark.line + 1}" if mark is not None else "")
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot read kubeconfig: {exc.strerror}"
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, ConfigException):
        return first_line
    return f"malformed kubeconfig ({type(exc).__name__}: {first_line})"


class Kube:
    """Nodes, Pods (for memory sharing), ConfigMaps, NodeFeature objects, Events, and ResourceSlices
    and ResourceClaims (the DRA plugin): what gpu-labeller needs, nothing more.

    Requests go through the client's generic ``ApiClient`` (credentials, TLS, token refresh) rather
    than the generated ``CoreV1Api``, whose pydantic-validated methods cost about 20 MiB of memory.
    """

    def __init__(self, kubeconfig: str | Mapping[str, Any] | None = None, observer: Observer | None = None,
                 pool_size: int = 4, request_timeout: tuple[float, float] = REQUEST_TIMEOUT, where: str = "") -> None:
        configuration = load_configuration(kubeconfig, where)
        configuration.connection_pool_maxsize = pool_size
        self._configuration = configuration
        self._rest: Any = _rest.RESTClientObject(configuration)
        self.server = str(configuration.host)
        self._observe = observer or (lambda verb, code: None)
        self._timeout = request_timeout

    def close(self) -> None:
        self._rest.pool_manager.clear()

    def _send(self, method: str, path: str, query: Mapping[str, str] | None = None, body: Any = None,
              content_type: str | None = None, timeout: tuple[float, float] | None = None) -> Any:
        """One request through the client's REST layer, with its credentials (a token refreshed as its
        configuration says); the urllib3 response, not read yet."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if content_type:
            headers["Content-Type"] = content_type
        for auth in self._configuration.auth_settings().values():
            if auth["value"]:
                headers[auth["key"]] = auth["value"]
        url = self.server + path
        if query:
            url += "?" + "&".join(f"{key}={quote(str(value))}" for key, value in query.items())
        return self._rest.request(method, url, headers=headers, body=body,
                                  _request_timeout=timeout or self._timeout).response

    def _request(self, verb: str, resource: str, method: str, path: str, query: Mapping[str, str] | None = None,
                 body: Any = None, content_type: str | None = None) -> Obj:
        """One API call; the JSON answer as a dict, or a KubeError."""
        try:
            response = self._send(method, path, query, body, content_type)
            data = response.data
            response.release_conn()
        except Exception as exc:  # noqa: BLE001 - urllib3 errors, timeouts, client errors: all become KubeError
            self._observe(verb, 0)
            raise _network_error(exc, self.server) from None
        self._observe(verb, int(response.status))
        if not 200 <= response.status < 300:
            raise _status_error(int(response.status), data, verb, resource)
        answer: Obj = json.loads(data or b"{}")
        return answer

    # -- nodes
    def get_node(self, name: str) -> Obj:
        return self._request("get", "nodes", "GET", f"/api/v1/nodes/{_segment(name)}")

    def list_node(self, name: str) -> tuple[Obj | None, str]:
        """This node (or None when it does not exist) and the list's resourceVersion, to watch from."""
        listing = self._request("list", "nodes", "GET", "/api/v1/nodes", {"fieldSelector": f"metadata.name={name}"})
        items = listing.get("items") or []
        return (items[0] if items else None), str(listing.get("metadata", {}).get("resourceVersion", ""))

    def watch_node(self, name: str, resource_version: str,
                   timeout_s: int = 300) -> Generator[tuple[str, Obj], None, None]:
        """(event type, object) for this one node from ``resource_version`` on; ends after ``timeout_s``.

        Raises Gone when the resourceVersion is too old (list again), Unavailable when the stream breaks.
        Bookmarks arrive as ("BOOKMARK", obj) carrying only a resourceVersion.
        """
        return self._watch("nodes", "/api/v1/nodes", resource_version, timeout_s,
                           {"fieldSelector": f"metadata.name={name}"})

    def _watch(self, resource: str, path: str, resource_version: str, timeout_s: int,
               selectors: Mapping[str, str | None] | None = None) -> Generator[tuple[str, Obj], None, None]:
        """A watch of ``path`` from ``resource_version``: see ``watch_node``."""
        query = {key: value for key, value in (selectors or {}).items() if value}
        query.update({"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                      "timeoutSeconds": str(timeout_s)})
        try:
            response = self._send("GET", path, query, timeout=(self._timeout[0], timeout_s + 30))
        except Exception as exc:  # noqa: BLE001 - as in _request
            self._observe("watch", 0)
            raise _network_error(exc, self.server) from None
        self._observe("watch", int(response.status))
        try:
            if response.status != 200:
                raise _status_error(int(response.status), response.data, "watch", resource)
            yield from _watch_events(response)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(0, type(exc).__name__, "watch stream broke") from None
        finally:
            response.release_conn()

    def _list(self, resource: str, path: str, selectors: Mapping[str, str | None] | None = None,
              page_size: int = LIST_PAGE_SIZE) -> tuple[list[Obj], str]:
        """Every object of a list, fetched in pages (limit/continue), and the list's resourceVersion."""
        query = {key: value for key, value in (selectors or {}).items() if value}
        query["limit"] = str(page_size)
        items: list[Obj] = []
        while True:
            listing = self._request("list", resource, "GET", path, query)
            items.extend(listing.get("items") or [])
            metadata = listing.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                return items, str(metadata.get("resourceVersion", ""))
            query["continue"] = str(token)

    def apply_node_labels(self, name: str, labels: Mapping[str, str]) -> Obj:
        """Server-side apply of exactly these labels under our field manager, forced."""
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}}
        return self._request("patch", "nodes", "PATCH", f"/api/v1/nodes/{_segment(name)}",
                             {"fieldManager": FIELD_MANAGER, "force": "true"}, body, APPLY)

    def remove_node_labels(self, name: str, keys: list[str], resource_version: str | None = None) -> Obj:
        """Merge patch with null values: removes labels whoever wrote them. With ``resource_version``,
        a Node changed since then answers 409 (Conflict) and nothing is removed."""
        metadata: Obj = {"labels": {key: None for key in keys}}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        body = {"metadata": metadata}
        return self._request("patch", "nodes", "PATCH", f"/api/v1/nodes/{_segment(name)}",
                             {"fieldManager": FIELD_MANAGER}, body, MERGE)

    def list_node_names(self) -> list[str]:
        listing = self._request("list", "nodes", "GET", "/api/v1/nodes")
        return [str(item["metadata"]["name"]) for item in listing.get("items") or []]

    def list_nodes(self, label_selector: str | None = None) -> tuple[list[Obj], str]:
        """Every Node (paginated) and the list's resourceVersion, to watch from."""
        return self._list("nodes", "/api/v1/nodes", {"labelSelector": label_selector})

    def watch_nodes(self, resource_version: str, timeout_s: int = 300) -> Generator[tuple[str, Obj], None, None]:
        """Every Node's events from ``resource_version`` on: see ``watch_node``."""
        return self._watch("nodes", "/api/v1/nodes", resource_version, timeout_s)

    # -- pods
    @staticmethod
    def _pod_path(namespace: str, name: str = "", subresource: str = "") -> str:
        path = f"/api/v1/namespaces/{_segment(namespace)}/pods"
        path = f"{path}/{_segment(name)}" if name else path
        return f"{path}/{subresource}" if subresource else path

    def list_pods(self, field_selector: str | None = None, label_selector: str | None = None) -> tuple[list[Obj], str]:
        """Pods of all namespaces (paginated) and the list's resourceVersion, to watch from."""
        return self._list("pods", "/api/v1/pods", {"fieldSelector": field_selector, "labelSelector": label_selector})

    def watch_pods(self, resource_version: str, field_selector: str | None = None,
                   timeout_s: int = 300) -> Generator[tuple[str, Obj], None, None]:
        """Pods of all namespaces from ``resource_version`` on: see ``watch_node``."""
        return self._watch("pods", "/api/v1/pods", resource_version, timeout_s, {"fieldSelector": field_selector})

    def get_pod(self, namespace: str, name: str) -> Obj:
        return self._request("get", "pods", "GET", self._pod_path(namespace, name))

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None],
                              resource_version: str | None = None) -> Obj:
        """Merge patch of annotations (None removes one). With ``resource_version``, a Pod changed since
        then answers 409 (Conflict) and nothing is written."""
        metadata: Obj = {"annotations": dict(annotations)}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return self._request("patch", "pods", "PATCH", self._pod_path(namespace, name),
                             {"fieldManager": FIELD_MANAGER}, {"metadata": metadata}, MERGE)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> Obj:
        """Create the pod's Binding to ``node`` (what a scheduler does); the uid guards against a pod
        deleted and created again under the same name (409)."""
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        return self._request("create", "pods/binding", "POST", self._pod_path(namespace, name, "binding"),
                             None, body, JSON)

    # -- config maps
    def get_config_map(self, namespace: str, name: str) -> Obj | None:
        try:
            return self._request("get", "configmaps", "GET",
                                 f"/api/v1/namespaces/{_segment(namespace)}/configmaps/{_segment(name)}")
        except NotFound:
            return None

    def list_config_maps(self, namespace: str) -> tuple[list[Obj], str]:
        return self._list("configmaps", f"/api/v1/namespaces/{_segment(namespace)}/configmaps")

    def watch_config_maps(self, namespace: str, resource_version: str,
                          timeout_s: int = 300) -> Generator[tuple[str, Obj], None, None]:
        return self._watch("configmaps", f"/api/v1/namespaces/{_segment(namespace)}/configmaps",
                           resource_version, timeout_s)

    # -- NodeFeature (nfd.k8s-sigs.io/v1alpha1)
    @staticmethod
    def _nfd_path(namespace: str, name: str = "") -> str:
        path = f"/apis/{NFD_GROUP}/{NFD_VERSION}/namespaces/{_segment(namespace)}/{NFD_PLURAL}"
        return f"{path}/{_segment(name)}" if name else path

    def get_node_feature(self, namespace: str, name: str) -> Obj | None:
        try:
            return self._request("get", NFD_PLURAL, "GET", self._nfd_path(namespace, name))
        except NotFound:
            return None

    def create_node_feature(self, namespace: str, body: Obj) -> Obj:
        return self._request("create", NFD_PLURAL, "POST", self._nfd_path(namespace),
                             {"fieldManager": FIELD_MANAGER}, body, JSON)

    def replace_node_feature(self, namespace: str, name: str, body: Obj) -> Obj:
        return self._request("update", NFD_PLURAL, "PUT", self._nfd_path(namespace, name),
                             {"fieldManager": FIELD_MANAGER}, body, JSON)

    # -- events
    def create_event(self, namespace: str, body: Obj) -> Obj:
        return self._request("create", "events", "POST", f"/api/v1/namespaces/{_segment(namespace)}/events",
                             None, body, JSON)

    # -- ResourceSlices and ResourceClaims (resource.k8s.io/v1)
    @staticmethod
    def _slice_selector(node_name: str | None, driver: str | None) -> dict[str, str | None]:
        terms = [f"spec.nodeName={node_name}"] if node_name else []
        terms += [f"spec.driver={driver}"] if driver else []
        return {"fieldSelector": ",".join(terms) or None}

    def list_resource_slices(self, node_name: str | None = None, driver: str | None = None) -> tuple[list[Obj], str]:
        """The ResourceSlices of one node and/or one driver (paginated), and the list's resourceVersion."""
        return self._list("resourceslices", f"{RESOURCE_API}/resourceslices", self._slice_selector(node_name, driver))

    def watch_resource_slices(self, resource_version: str, node_name: str | None = None, driver: str | None = None,
                              timeout_s: int = 300) -> Generator[tuple[str, Obj], None, None]:
        """The same ResourceSlices' events from ``resource_version`` on: see ``watch_node``."""
        return self._watch("resourceslices", f"{RESOURCE_API}/resourceslices", resource_version, timeout_s,
                           self._slice_selector(node_name, driver))

    def create_resource_slice(self, body: Obj) -> Obj:
        return self._request("create", "resourceslices", "POST", f"{RESOURCE_API}/resourceslices",
                             {"fieldManager": FIELD_MANAGER}, body, JSON)

    def update_resource_slice(self, name: str, body: Obj) -> Obj:
        """Replace the slice; with ``metadata.resourceVersion`` in ``body``, a slice changed since then
        answers 409 (Conflict) and nothing is written."""
        return self._request("update", "resourceslices", "PUT", f"{RESOURCE_API}/resourceslices/{_segment(name)}",
                             {"fieldManager": FIELD_MANAGER}, body, JSON)

    def delete_resource_slice(self, name: str, uid: str | None = None) -> None:
        """Delete the slice; with ``uid``, only that object (409 when the name now holds another one)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}} if uid else None
        self._request("delete", "resourceslices", "DELETE", f"{RESOURCE_API}/resourceslices/{_segment(name)}",
                      None, body, JSON if body else None)

    def get_resource_claim(self, namespace: str, name: str) -> Obj:
        return self._request("get", "resourceclaims", "GET",
                             f"{RESOURCE_API}/namespaces/{_segment(namespace)}/resourceclaims/{_segment(name)}")


def _watch_events(response: Any) -> Iterator[tuple[str, Obj]]:
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield _decode_event(line)
    if buffer.strip():
        yield _decode_event(buffer)


def _decode_event(line: bytes) -> tuple[str, Obj]:
    event = json.loads(line)
    kind, obj = str(event.get("type", "")), event.get("object") or {}
    if kind == "ERROR":
        code = int(obj.get("code", 0))
        error_type: type[KubeError] = Gone if code == 410 else Unavailable
        raise error_type(code, str(obj.get("reason", "")), str(obj.get("message", "")))
    return kind, obj
