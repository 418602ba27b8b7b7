"""The kube-scheduler extender protocol over HTTP, at gpushare's paths.

``POST /gpushare-scheduler/filter`` and ``/prioritize`` take ExtenderArgs (``Pod``, and ``NodeNames``
when the scheduler's extender config says ``nodeCacheCapable: true``, else ``Nodes``) and answer an
ExtenderFilterResult (``NodeNames`` or ``Nodes``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error``) or a HostPriorityList; ``POST /gpushare-scheduler/bind`` takes ExtenderBindingArgs and
answers an ExtenderBindingResult. ``GET /gpushare-scheduler/inspect[/<node>]`` is what
``kubectl inspect gpushare`` reads. Pods that ask no ``aliyun.com/gpu-mem`` pass through untouched.
"""

from __future__ import annotations

import json
import time
from typing import Any

from labeller.model import gpushare
from labeller.apps.extender.binder import Binder, BindError
from labeller.apps.extender.cache import ShareCache
from labeller.apps.extender.metrics import Metrics
from labeller.process.httpserver import Answer
from labeller.base.log import get_logger

log = get_logger("gpu_labeller.extender")

Obj = dict[str, Any]
PREFIX = "/gpushare-scheduler"
JSON_TYPE = "application/json"
# Reasons no preemption can cure: the scheduler should not evict pods for them.
UNRESOLVABLE = ("must fit on a single GPU", "does not share GPU memory")


class BadRequest(ValueError):
    pass


class Extender:
    def __init__(self, cache: ShareCache, binder: Binder, metrics: Metrics) -> None:
        self.cache, self.binder, self.metrics = cache, binder, metrics

    def __call__(self, method: str, path: str, body: bytes) -> Answer | None:
        """The HTTP application (see labeller.process.httpserver.App)."""
        if not path.startswith(PREFIX + "/"):
            return None
        verb, _, rest = path[len(PREFIX) + 1:].partition("/")
        handlers = {("POST", "filter"): self.filter, ("POST", "prioritize"): self.prioritize,
                    ("POST", "bind"): self.bind}
        started = time.perf_counter()
        try:
            if method == "GET" and verb == "inspect":
                answer: Any = {"nodes": self.cache.inspect(rest or None)}
                outcome = "ok"
            elif (method, verb) in handlers and not rest:
                answer, outcome = handlers[(method, verb)](_decode(body))
            else:
                return None
        except BadRequest as exc:
            self.metrics.requests.labels(verb=verb, outcome="error").inc()
            return 400, json.dumps({"Error": str(exc)}).encode(), JSON_TYPE
        self.metrics.requests.labels(verb=verb, outcome=outcome).inc()
        self.metrics.duration.labels(verb=verb).observe(time.perf_counter() - started)
        return 200, json.dumps(answer).encode(), JSON_TYPE

    # -- verbs: (answer, outcome)
    def filter(self, args: Obj) -> tuple[Obj, str]:
        pod, names, nodes = _candidates(args)
        request = gpushare.pod_request(pod)
        if not request:
            return _filter_result(names, nodes, {}, {}), "passthrough"
        passed, failed = self.cache.filter(names, request)
        unresolvable = {node: why for node, why in failed.items() if any(u in why for u in UNRESOLVABLE)}
        failed = {node: why for node, why in failed.items() if node not in unresolvable}
        kept = set(passed)
        answer = _filter_result(passed, None if nodes is None else [n for n in nodes if _name(n) in kept],
                                failed, unresolvable)
        if not passed:
            log.info("pod fits no node", reason="unschedulable", pod=gpushare.pod_key(pod), units=request,
                     nodes=len(names))
        return answer, "ok" if passed else "unschedulable"

    def prioritize(self, args: Obj) -> tuple[list[Obj], str]:
        pod, names, _ = _candidates(args)
        request = gpushare.pod_request(pod)
        if not request:
            return [{"Host": name, "Score": 0} for name in names], "passthrough"
        scores = self.cache.scores(names, request, self.binder.options.policy)
        return [{"Host": name, "Score": score} for name, score in scores], "ok"

    def bind(self, args: Obj) -> tuple[Obj, str]:
        for field in ("PodName", "PodNamespace", "Node"):
            if field not in args:
                raise BadRequest(f"ExtenderBindingArgs without {field}")
        for field in ("PodName", "PodNamespace", "PodUID", "Node"):
            if field in args and not isinstance(args[field], str):
                raise BadRequest(f"{field} is not a string")
        name, namespace, node = args["PodName"], args["PodNamespace"], args["Node"]
        try:
            self.binder.bind(namespace, name, args.get("PodUID") or "", node)
        except BindError as exc:
            log.warning("bind failed", reason="bind-failed", pod=f"{namespace}/{name}", node=node, error=str(exc))
            return {"Error": str(exc)}, "error"
        return {"Error": ""}, "ok"


def _decode(body: bytes) -> Obj:
    try:
        args = json.loads(body or b"{}")
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(args, dict):
        raise BadRequest("body is not a JSON object")
    return args


def _name(node: Obj) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def _candidates(args: Obj) -> tuple[Obj, list[str], list[Obj] | None]:
    """(pod, candidate node names, full Node objects when the scheduler sent them instead of names)."""
    pod = args.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequest("ExtenderArgs without a Pod")
    _check_pod(pod)
    if args.get("NodeNames") is not None:
        names = args["NodeNames"]
        # One pass in C over the 1,000s of names a scheduler sends (a Python-level loop doubles a passthrough filter).
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise BadRequest("NodeNames is not a list of node names")
        return pod, names, None
    node_list = args.get("Nodes") or {}
    nodes = node_list.get("items") or [] if isinstance(node_list, dict) else None
    if not isinstance(nodes, list) or not all(isinstance(node, dict) and isinstance(node.get("metadata") or {}, dict)
                                              for node in nodes):
        raise BadRequest("Nodes is not a NodeList")
    return pod, [_name(node) for node in nodes], nodes


def _check_pod(pod: Obj) -> None:
    """BadRequest naming the first field of the pod that does not have a Pod's shape (where it is read)."""
    for field in ("metadata", "spec"):
        if not isinstance(pod.get(field) or {}, dict):
            raise BadRequest(f"Pod.{field} is not an object")
    containers = (pod.get("spec") or {}).get("containers") or []
    if not isinstance(containers, list) or not all(isinstance(container, dict) for container in containers):
        raise BadRequest("Pod.spec.containers is not a list of containers")
    for i, container in enumerate(containers):
        resources = container.get("resources") or {}
        if not isinstance(resources, dict):
            raise BadRequest(f"Pod.spec.containers[{i}].resources is not an object")
        for kind in ("limits", "requests"):
            if not isinstance(resources.get(kind) or {}, dict):
                raise BadRequest(f"Pod.spec.containers[{i}].resources.{kind} is not an object")


def _filter_result(names: list[str], nodes: list[Obj] | None, failed: dict[str, str],
                   unresolvable: dict[str, str]) -> Obj:
    result: Obj = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
    if nodes is None:
        result["NodeNames"] = names
    else:
        result["Nodes"] = {"metadata": {}, "items": nodes}
    return result
