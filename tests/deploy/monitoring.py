"""What the chart's alerts and dashboard ask of the metrics, and what the code exports: the rules file
and the dashboard as the chart ships them, the selectors of their PromQL, and a catalog of every metric
the processes register (their metrics classes), with the label values the code can give each label.

No promtool here: .ci/alerts runs it. These helpers let the tests tie every metric name, label name and
label value the rules and the dashboard use to the code, so that renaming one fails a test.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from tests.deploy import CHART, ROOT

ALERTS_FILE = CHART / "files" / "alerts.yaml"
DASHBOARD_FILE = CHART / "files" / "dashboard.json"
ALERTS_TEST_FILE = ROOT / "tests" / "deploy" / "alerts" / "alerts_test.yaml"
OPERATIONS_DOC = ROOT / "docs" / "operations.md"

# Labels a Prometheus scrape through the chart's PodMonitor adds to every series (the operator's target
# labels, and the two the PodMonitor relabels: node and component); `le` is every histogram bucket's.
TARGET_LABELS = frozenset({"job", "namespace", "pod", "container", "endpoint", "instance", "service", "node",
                           "component"})
# Series that are Prometheus's own, not gpu-labeller's: up (one per target) and ALERTS (firing alerts).
PROMETHEUS_SERIES = {"up": frozenset(), "ALERTS": frozenset({"alertname", "alertstate", "severity"})}
# The prefixes of the named-config metrics (labeller.process.follow.ConfigMetrics), one per process that
# follows a node's config: run, device-plugin, dra-plugin, mps-control-daemon.
CONFIG_METRIC_PREFIXES = ("gpu_labeller", "gpu_labeller_plugin", "gpu_labeller_dra", "gpu_labeller_mps")

Obj = dict[str, Any]


def rule_groups() -> list[Obj]:
    groups: list[Obj] = yaml.safe_load(ALERTS_FILE.read_text())["groups"]
    return groups


def alerts() -> list[Obj]:
    return [rule for group in rule_groups() for rule in group["rules"]]


def dashboard() -> Obj:
    model: Obj = json.loads(DASHBOARD_FILE.read_text())
    return model


def dashboard_panels() -> list[Obj]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p["targets"]]


# --- PromQL, as far as the checks need it ---------------------------------------------------------

_SELECTOR = re.compile(r"\b(gpu_labeller_[a-z0-9_]+|up|ALERTS)\b\s*(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")
_PLAIN_ALTERNATIVES = re.compile(r"^[A-Za-z0-9_-]+(\|[A-Za-z0-9_-]+)*$")


@dataclasses.dataclass(frozen=True)
class Selector:
    """One series selector of an expression: ``name{label op "value", ...}``."""
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value)

    def values(self, label: str) -> set[str] | None:
        """The plain values an = or =~ matcher on ``label`` selects (a regex of alternatives of plain words),
        None when the matcher is another regex or there is none."""
        for name, op, value in self.matchers:
            if name == label and op in ("=", "=~") and _PLAIN_ALTERNATIVES.match(value):
                return set(value.split("|"))
        return None


def selectors(expr: str) -> list[Selector]:
    return [Selector(m.group(1), tuple(_MATCHER.findall(m.group(2) or ""))) for m in _SELECTOR.finditer(expr)]


def grouping_labels(expr: str) -> set[str]:
    """The labels of every by (...), on (...), without (...) and ignoring (...) clause."""
    return {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label.strip()}


# --- what the code exports ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # as prometheus_client names it: a counter's without _total
    type: str  # counter, gauge, histogram
    labels: tuple[str, ...]
    attribute: str | None  # the attribute of its metrics class that holds it (None: not held)
    package: str  # the labeller package whose metrics class registers it

    def series(self) -> dict[str, tuple[str, ...]]:
        """The series names PromQL can select, with their labels."""
        if self.type == "counter":
            return {f"{self.name}_total": self.labels}
        if self.type == "histogram":
            return {f"{self.name}_bucket": (*self.labels, "le"), f"{self.name}_sum": self.labels,
                    f"{self.name}_count": self.labels}
        return {self.name: self.labels}


def _metrics_objects() -> Iterator[tuple[str, object, CollectorRegistry]]:
    """(package, metrics object, its registry) for every metrics class the processes use."""
    from labeller.apps.daemon.metrics import Metrics as DaemonMetrics
    from labeller.apps.draplugin.metrics import DraMetrics
    from labeller.apps.extender.cache import ShareCache
    from labeller.apps.extender.metrics import Metrics as ExtenderMetrics
    from labeller.apps.mps.service import Metrics as MpsMetrics
    from labeller.apps.plugin.metrics import PluginMetrics
    from labeller.process.follow import ConfigMetrics

    daemon, plugin, dra = DaemonMetrics(), PluginMetrics(), DraMetrics()
    extender, mps = ExtenderMetrics(ShareCache()), MpsMetrics()
    for package, holder in (("daemon", daemon), ("plugin", plugin), ("draplugin", dra), ("extender", extender),
                            ("mps", mps)):
        yield package, holder, holder.registry
    for prefix in CONFIG_METRIC_PREFIXES:
        registry = CollectorRegistry()
        yield "process", ConfigMetrics(registry, prefix), registry


@functools.cache
def families() -> tuple[Family, ...]:
    """Every metric family the code registers, whichever process serves it."""
    found: list[Family] = []
    for package, holder, registry in _metrics_objects():
        held = {metric._name: (attribute, metric) for attribute, metric in vars(holder).items()
                if isinstance(metric, MetricWrapperBase)}
        for family in registry.collect():
            attribute, metric = held.get(family.name, (None, None))
            labels = tuple(metric._labelnames) if metric is not None else ()
            found.append(Family(family.name, family.type, labels, attribute, package))
    return tuple(found)


@functools.cache
def series_catalog() -> dict[str, tuple[str, ...]]:
    """Series name -> its labels (the target labels aside), for every series the code exports."""
    return {name: labels for family in families() for name, labels in family.series().items()}


def family_name(series: str) -> str:
    return next(f.name for f in families() if series in f.series())


DYNAMIC = "<computed at run time>"


@functools.cache
def emitted_values() -> dict[tuple[str, str], frozenset[str]]:
    """(family name, label) -> the values the code passes to ``.labels(label=...)``: string constants, module
    constants (HEALTHY), both arms of ``a if c else b``; DYNAMIC for a value computed at run time."""
    by_package: dict[tuple[str, str], list[Family]] = {}
    for family in families():
        if family.attribute is not None:
            by_package.setdefault((family.package, family.attribute), []).append(family)
    values: dict[tuple[str, str], set[str]] = {}
    for path in sorted((ROOT / "labeller").rglob("*.py")):
        relative = path.relative_to(ROOT).with_suffix("")
        if "api" in relative.parts:
            continue  # generated gRPC code
        package = relative.parts[2] if relative.parts[1] == "apps" and len(relative.parts) > 3 else ""
        module_name = ".".join(relative.parts)
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "labels" and isinstance(node.func.value, ast.Attribute)):
                    continue
                for family in by_package.get((package, node.func.value.attr), []):
                    for keyword in node.keywords:
                        if keyword.arg is not None:
                            values.setdefault((family.name, keyword.arg), set()).update(
                                _constant_values(keyword.value, module_name, function))
    return {key: frozenset(found) for key, found in values.items()}


def _constant_values(node: ast.expr, module_name: str, function: ast.FunctionDef | ast.AsyncFunctionDef,
                     seen: frozenset[str] = frozenset()) -> set[str]:
    """The string values an expression can have: a constant, both arms of a conditional, a local variable's
    every assignment in ``function``, a module constant; DYNAMIC for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return (_constant_values(node.body, module_name, function, seen)
                | _constant_values(node.orelse, module_name, function, seen))
    if isinstance(node, ast.Name) and node.id not in seen:
        assigns = [a for a in ast.walk(function) if isinstance(a, ast.Assign)
                   and any(isinstance(n, ast.Name) and n.id == node.id for t in a.targets for n in ast.walk(t))]
        if assigns:
            values = {DYNAMIC} if any(not isinstance(t, ast.Name) for a in assigns for t in a.targets) else set()
            return values.union(*(_constant_values(a.value, module_name, function, seen | {node.id})
                                  for a in assigns if all(isinstance(t, ast.Name) for t in a.targets)))
        value = getattr(importlib.import_module(module_name), node.id, None)
        if isinstance(value, str):
            return {value}
    return {DYNAMIC}


# --- the runbooks ----------------------------------------------------------------------------------

def doc_anchors(path: Path = OPERATIONS_DOC) -> dict[str, str]:
    """Anchor -> heading text of every heading of a docs page, as MkDocs' toc extension makes them
    (lower case, punctuation dropped, spaces to hyphens)."""
    anchors = {}
    for line in path.read_text().splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\s-]", "", heading.group(1)).strip().lower()
            anchors[re.sub(r"[-\s]+", "-", slug)] = heading.group(1)
    return anchors


def section(path: Path, heading: str) -> str:
    """The text under a heading of a docs page, up to the next heading of the same or a higher level."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"^#+\s+{re.escape(heading)}\s*$", line))
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    body = []
    for line in lines[start + 1:]:
        match = re.match(r"^(#+)\s", line)
        if match and len(match.group(1)) <= level:
            break
        body.append(line)
    return "\n".join(body)


# --- the Prometheus Operator's CRDs, as far as the chart uses them ---------------------------------

# Facts from the CRDs of prometheus-operator (example/prometheus-operator-crd, monitoring.coreos.com v1,
# operator 0.93): the fields the chart writes, their types, the duration pattern, what is required. The
# keys a field may have are closed here (the CRDs list more) so that a misspelt one fails.
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {"type": "object", "required": ["name", "namespace"], "properties": {
    "name": {"type": "string", "minLength": 1}, "namespace": {"type": "string", "minLength": 1},
    "labels": _STRING_MAP, "annotations": _STRING_MAP}}
PROMETHEUS_RULE_SCHEMA: Obj = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": {"type": "object", "additionalProperties": False, "properties": {"groups": {
            "type": "array", "items": {
                "type": "object", "required": ["name"], "additionalProperties": False, "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": {"type": "string", "pattern": DURATION},
                    "rules": {"type": "array", "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False, "properties": {
                            "alert": {"type": "string"}, "record": {"type": "string"},
                            "expr": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                            "for": {"type": "string", "pattern": DURATION},
                            "keep_firing_for": {"type": "string", "minLength": 1, "pattern": DURATION},
                            "labels": _STRING_MAP, "annotations": _STRING_MAP}}}}}}}}}}
_RELABELING = {"type": "object", "additionalProperties": False, "properties": {
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "labelmap", "LabelMap",
                        "labeldrop", "LabelDrop", "labelkeep", "LabelKeep"]},
    "sourceLabels": {"type": "array", "items": {"type": "string"}},
    "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
    "replacement": {"type": "string"}}}
POD_MONITOR_SCHEMA: Obj = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"},
        "metadata": _METADATA,
        "spec": {"type": "object", "required": ["selector"], "additionalProperties": False, "properties": {
            "jobLabel": {"type": "string"},
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
            "selector": {"type": "object", "additionalProperties": False, "properties": {
                "matchLabels": _STRING_MAP, "matchExpressions": {"type": "array"}}},
            "podMetricsEndpoints": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "properties": {
                    "port": {"type": "string"}, "path": {"type": "string"},
                    "interval": {"type": "string", "pattern": DURATION},
                    "scrapeTimeout": {"type": "string", "pattern": DURATION},
                    "relabelings": {"type": "array", "items": _RELABELING}}}}}}}}
