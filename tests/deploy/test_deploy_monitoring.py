"""The chart's monitoring: the alerting rules (deploy/helm/gpu-labeller/files/alerts.yaml), the Grafana
dashboard (files/dashboard.json), and the PodMonitor, PrometheusRule and dashboard ConfigMap the chart
renders from them.

promtool checks the rules and runs their unit tests in .ci/alerts; these tests need no promtool: every
metric, label and label value the rules and the dashboard select is one the code exports (a renamed metric
fails here), every alert has a runbook and promtool tests, and the chart renders the rules file as it is.
"""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv

from tests.deploy import CHART, find, one, render
from tests.deploy.monitoring import (
    ALERTS_TEST_FILE,
    DASHBOARD_FILE,
    DYNAMIC,
    OPERATIONS_DOC,
    POD_MONITOR_SCHEMA,
    PROMETHEUS_RULE_SCHEMA,
    PROMETHEUS_SERIES,
    TARGET_LABELS,
    alerts,
    dashboard,
    dashboard_exprs,
    dashboard_panels,
    doc_anchors,
    emitted_values,
    family_name,
    grouping_labels,
    rule_groups,
    section,
    selectors,
    series_catalog,
)

ALERT_NAMES = [rule["alert"] for rule in alerts()]
ALL_ON = {"monitoring": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                         "dashboard": {"enabled": True}}}
MONITORING_KINDS = ("PodMonitor", "PrometheusRule")
# A label value the code computes at run time (a URL path), checked on a real process in
# test_deploy_monitoring_scrape.py instead.
CHECKED_ON_A_RUNNING_PROCESS = {("gpu_labeller_extender_request_duration_seconds", "verb")}


def seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", duration))


def alert(name: str) -> dict[str, Any]:
    return next(rule for rule in alerts() if rule["alert"] == name)


# --- the rules file ---------------------------------------------------------------------------------

def test_every_rule_is_an_alert_with_a_unique_name_a_severity_and_a_for_that_rides_out_flapping() -> None:
    assert len(ALERT_NAMES) == len(set(ALERT_NAMES)) >= 20
    for rule in alerts():
        assert re.fullmatch(r"GpuLabeller[A-Z][A-Za-z]+", rule["alert"]), rule
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"] == {"severity": rule["labels"]["severity"]}
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert seconds(rule["for"]) >= 300, f"{rule['alert']}: for {rule['for']} would page on a blip"


def test_what_pages_is_what_keeps_a_node_from_handing_out_its_gpus() -> None:
    critical = {rule["alert"] for rule in alerts() if rule["labels"]["severity"] == "critical"}
    assert critical == {"GpuLabellerDevicePluginNotRegistered", "GpuLabellerMpsDaemonNotReady",
                        "GpuLabellerDraNotRegistered", "GpuLabellerDraPrepareFailing"}


def test_the_issues_signals_each_have_an_alert() -> None:
    # labeller stuck or failing writes; plugin not registered, device unhealthy; extender errors and latency;
    # DRA publish and prepare failures
    wanted = {"GpuLabellerLabelsStale", "GpuLabellerWritesFailing", "GpuLabellerDevicePluginNotRegistered",
              "GpuLabellerGpuUnhealthy", "GpuLabellerExtenderErrors", "GpuLabellerExtenderSlow",
              "GpuLabellerDraPublishFailing", "GpuLabellerDraPrepareFailing"}
    assert wanted <= set(ALERT_NAMES)


def kept_labels(expr: str) -> set[str]:
    """The labels an alert's series keep: the first by (...) of an aggregation, else all of the metrics'."""
    by = re.search(r"\b(?:sum|max|min)\s+by\s*\(([^)]*)\)", expr)
    if by:
        return {label.strip() for label in by.group(1).split(",")}
    return TARGET_LABELS | {label for s in selectors(expr) for label in series_catalog().get(s.name, ())}


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_summary_and_description_name_where_and_what(name: str) -> None:
    rule = alert(name)
    text = rule["annotations"]["summary"] + " " + rule["annotations"]["description"]
    templated = set(re.findall(r"\$labels\.(\w+)", text))
    assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
    assert {"namespace", "pod"} <= templated, "the pod to look at"
    kept = kept_labels(rule["expr"])
    # node: where; resource, driver, verb: what. The scheduler extender runs on any node: its node says nothing.
    identity = {"resource", "driver", "verb"} | ({"node"} if "extender" not in rule["expr"] else set())
    assert identity & kept <= templated, f"kept {sorted(kept)}, templated {sorted(templated)}"
    assert templated <= kept, "a label the alert does not carry renders empty"


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_each_alert_has_a_runbook_section_in_operations(name: str) -> None:
    anchor = name.lower()
    assert alert(name)["annotations"]["runbook_url"] == f"docs/operations.md#{anchor}"
    assert doc_anchors().get(anchor) == name
    runbook = section(OPERATIONS_DOC, name)
    for part in ("**What it means.**", "**What to check.**", "**How to fix it.**"):
        assert part in runbook, f"{name}: no {part}"


def test_the_alerts_section_lists_every_alert_and_nothing_else() -> None:
    headings = re.findall(r"^### (GpuLabeller\w+)$", section(OPERATIONS_DOC, "Alerts"), re.MULTILINE)
    assert headings == ALERT_NAMES


def test_every_alert_has_promtool_tests_that_fire_it_and_that_must_not() -> None:
    tests = yaml.safe_load(ALERTS_TEST_FILE.read_text())
    assert tests["rule_files"] == ["../../../deploy/helm/gpu-labeller/files/alerts.yaml"]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
            for expected in check["exp_alerts"]:
                annotations = alert(check["alertname"])["annotations"]
                assert set(expected["exp_annotations"]) == set(annotations), "every annotation is checked"
                assert "{{" not in json.dumps(expected["exp_annotations"])
    assert fires == silent == set(ALERT_NAMES)


# --- the metrics the rules and the dashboard use are the ones the code exports ------------------------

EXPRESSIONS = [(rule["alert"], rule["expr"]) for rule in alerts()] + [
    (f"dashboard: {panel['title']}", target["expr"]) for panel in dashboard_panels() for target in panel["targets"]]


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=[w for w, _ in EXPRESSIONS])
def test_every_selected_metric_and_label_is_exported(where: str, expr: str) -> None:
    catalog = {**series_catalog(), **PROMETHEUS_SERIES}
    found = selectors(expr)
    assert found, "an expression that selects nothing of ours"
    for selector in found:
        assert selector.name in catalog, f"{selector.name} is not exported by any process"
        labels = set(catalog[selector.name]) | TARGET_LABELS
        for label, _, _ in selector.matchers:
            assert label in labels, f"{selector.name} has no label {label} (it has {sorted(catalog[selector.name])})"
    exported = set().union(*(catalog[s.name] for s in found)) | TARGET_LABELS | {"le"}
    assert grouping_labels(expr) <= exported


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=[w for w, _ in EXPRESSIONS])
def test_every_selected_label_value_is_one_the_code_gives(where: str, expr: str) -> None:
    for selector in selectors(expr):
        if selector.name in PROMETHEUS_SERIES:
            continue
        family = family_name(selector.name)
        for label, _, _ in selector.matchers:
            wanted = selector.values(label)
            if label in TARGET_LABELS or wanted is None or (family, label) in CHECKED_ON_A_RUNNING_PROCESS:
                continue
            given = emitted_values()[(family, label)] - {DYNAMIC}
            assert wanted <= given, f"{selector.name}{{{label}}}: the code gives {sorted(given)}, not {wanted - given}"


def test_a_renamed_metric_would_fail_the_check() -> None:
    # the check above is only as good as the catalog: it holds every metric of every process, and nothing else
    catalog = series_catalog()
    assert "gpu_labeller_writes_total" in catalog and "gpu_labeller_write_total" not in catalog
    assert catalog["gpu_labeller_extender_request_duration_seconds_bucket"] == ("verb", "le")
    assert emitted_values()[("gpu_labeller_writes", "outcome")] == {"success", "error"}
    assert emitted_values()[("gpu_labeller_probes", "outcome")] == {"ok", "partial", "failed"}
    assert emitted_values()[("gpu_labeller_plugin_devices", "health")] == {"Healthy", "Unhealthy"}


# --- the dashboard -------------------------------------------------------------------------------

def test_dashboard_is_a_grafana_model_on_a_chosen_prometheus() -> None:
    model = dashboard()
    assert model["uid"] == "gpu-labeller" and model["title"] == "gpu-labeller" and model["schemaVersion"] >= 36
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert [variables[n]["type"] for n in ("namespace", "node")] == ["query", "query"]
    assert variables["node"]["includeAll"] and variables["node"]["multi"]
    ids = [p["id"] for p in model["panels"]]
    titles = [p["title"] for p in model["panels"]]
    assert len(ids) == len(set(ids)) and len(titles) == len(set(titles))
    for panel in dashboard_panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["title"] and panel["description"], panel["id"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(t["expr"] for t in panel["targets"])
        assert all('namespace="$namespace"' in t["expr"] for t in panel["targets"]), panel["title"]


def test_dashboard_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_dashboard_shows_every_signal_an_alert_fires_on() -> None:
    shown = {s.name for expr in dashboard_exprs() for s in selectors(expr)}
    for rule in alerts():
        used = {s.name for s in selectors(rule["expr"])}
        assert used <= shown, f"{rule['alert']}: {sorted(used - shown)} on no panel"


# --- the chart ------------------------------------------------------------------------------------

def test_off_by_default() -> None:
    objects = render()
    assert not [o for o in objects if o["kind"] in MONITORING_KINDS]
    assert find(objects, "ConfigMap", "gpu-labeller-dashboard") == []


@pytest.mark.parametrize("key", ["podMonitor", "prometheusRule", "dashboard"])
def test_each_object_has_its_own_switch(key: str) -> None:
    objects = render({"monitoring": {key: {"enabled": True}}})
    kinds = {o["kind"] for o in objects if o["kind"] in MONITORING_KINDS}
    dashboards = find(objects, "ConfigMap", "gpu-labeller-dashboard")
    assert (kinds, len(dashboards)) == {"podMonitor": ({"PodMonitor"}, 0), "prometheusRule": ({"PrometheusRule"}, 0),
                                        "dashboard": (set(), 1)}[key]


def test_prometheus_rule_is_the_rules_file_as_it_is() -> None:
    rule = one(render(ALL_ON), "PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["metadata"]["name"] == "gpu-labeller" and rule["metadata"]["namespace"] == "gpu-labeller"
    assert rule["spec"]["groups"] == rule_groups()


def test_prometheus_rule_options() -> None:
    values = {"monitoring": {"prometheusRule": {
        "enabled": True, "namespace": "monitoring", "labels": {"release": "kube-prometheus-stack"},
        "additionalRuleLabels": {"team": "gpu-platform", "severity": "ignored"},
        "disabled": ["GpuLabellerProbeIncomplete", "GpuLabellerTargetDown"],
        "runbookBaseUrl": "https://docs.example.com/gpu-labeller/"}}}
    rule = one(render(values), "PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rendered = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(rendered) == set(ALERT_NAMES) - {"GpuLabellerProbeIncomplete", "GpuLabellerTargetDown"}
    assert "gpu-labeller.scrape" not in [group["name"] for group in rule["spec"]["groups"]]  # no empty group
    for name, r in rendered.items():
        source = alert(name)
        assert r["labels"] == {"team": "gpu-platform", "severity": source["labels"]["severity"]}
        assert r["annotations"]["runbook_url"] == f"https://docs.example.com/gpu-labeller/operations/#{name.lower()}"
        assert (r["expr"], r["for"], r["annotations"]["description"]) == (
            source["expr"], source["for"], source["annotations"]["description"])


def test_disabling_an_alert_that_does_not_exist_is_refused() -> None:
    with pytest.raises(helm_python.errors.HelmRenderError) as error:
        render({"monitoring": {"prometheusRule": {"enabled": True, "disabled": ["GpuLabellerLabelStale"]}}})
    assert "monitoring.prometheusRule.disabled: GpuLabellerLabelStale is not one of the chart's alerts " \
           "(GpuLabellerLabelsStale, " in str(error.value)


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("DaemonSet", "Deployment")]


EVERY_COMPONENT = {**ALL_ON, "extender": {"enabled": True}, "dra": {"enabled": True},
                   "devicePlugin": {"mpsControlDaemon": {"enabled": True}}}


def test_pod_monitor_scrapes_every_metrics_port_of_every_component() -> None:
    objects = render(EVERY_COMPONENT)
    monitor = one(objects, "PodMonitor")
    jsonschema.validate(monitor, POD_MONITOR_SCHEMA)
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["gpu-labeller"]}
    ports = {endpoint["port"] for endpoint in spec["podMetricsEndpoints"]}
    assert ports == {"metrics", "mps-metrics"}
    scraped = []
    for workload in workloads(objects):
        template = workload["spec"]["template"]
        assert spec["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        for container in template["spec"]["containers"]:
            served = {p["name"] for p in container.get("ports", []) if p["name"] in ("metrics", "mps-metrics")}
            assert len(served) == 1, f"{workload['metadata']['name']}/{container['name']}: {served}"
            assert served <= ports
            scraped.append(container["name"])
    assert sorted(scraped) == ["device-plugin", "dra-plugin", "labeller", "mps-control-daemon", "scheduler-extender"]


def test_pod_monitor_gives_the_labels_the_alerts_rely_on() -> None:
    objects = render(EVERY_COMPONENT)
    spec = one(objects, "PodMonitor")["spec"]
    # job: the value of the pods' label named by jobLabel, as GpuLabellerTargetDown selects it
    job = re.search(r'job="([^"]+)"', alert("GpuLabellerTargetDown")["expr"])
    assert job is not None
    for workload in workloads(objects):
        assert workload["spec"]["template"]["metadata"]["labels"][spec["jobLabel"]] == job.group(1)
    for endpoint in spec["podMetricsEndpoints"]:
        assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint["relabelings"]
        assert (endpoint["interval"], endpoint["scrapeTimeout"], endpoint["path"]) == ("30s", "10s", "/metrics")


def test_pod_monitor_scrapes_the_mps_port_only_where_the_daemon_runs() -> None:
    ports = [e["port"] for e in one(render(ALL_ON), "PodMonitor")["spec"]["podMetricsEndpoints"]]
    assert ports == ["metrics"]


def test_pod_monitor_options() -> None:
    monitor = one(render({"monitoring": {"podMonitor": {
        "enabled": True, "namespace": "monitoring", "labels": {"release": "kps"}, "interval": "1m",
        "scrapeTimeout": "15s"}}}), "PodMonitor")
    jsonschema.validate(monitor, POD_MONITOR_SCHEMA)
    assert monitor["metadata"]["namespace"] == "monitoring" and monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu-labeller"]}  # the pods stay where they are
    assert {(e["interval"], e["scrapeTimeout"]) for e in monitor["spec"]["podMetricsEndpoints"]} == {("1m", "15s")}


def test_dashboard_config_map_holds_the_dashboard_for_grafanas_sidecar() -> None:
    config_map = one(render(ALL_ON), "ConfigMap", "gpu-labeller-dashboard")
    kv.validate(config_map, "1.30.0", strict=True)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["gpu-labeller.json"]) == dashboard()
    assert config_map["data"]["gpu-labeller.json"] == DASHBOARD_FILE.read_text().rstrip("\n")


def test_dashboard_options() -> None:
    config_map = one(render({"monitoring": {"dashboard": {
        "enabled": True, "namespace": "grafana", "labels": {"grafana_dashboard": None, "dashboards": "gpu"},
        "annotations": {"grafana_folder": "GPUs"}}}}), "ConfigMap", "gpu-labeller-dashboard")
    assert config_map["metadata"]["namespace"] == "grafana"
    assert "grafana_dashboard" not in config_map["metadata"]["labels"]
    assert config_map["metadata"]["labels"]["dashboards"] == "gpu"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPUs"}


@pytest.mark.parametrize("kind", MONITORING_KINDS)
def test_install_on_a_cluster_without_the_operators_crds_is_refused(kind: str) -> None:
    key = {"PodMonitor": "podMonitor", "PrometheusRule": "prometheusRule"}[kind]
    values = {"monitoring": {key: {"enabled": True}}}
    discovered = ("apps/v1/DaemonSet",)  # helm install: the cluster's own list of what it serves
    with pytest.raises(helm_python.errors.HelmRenderError) as error:
        render(values, api_versions=discovered)
    assert (f"monitoring.{key}.enabled is true but this cluster does not serve monitoring.coreos.com/v1 {kind}: "
            "install the Prometheus Operator's CRDs first") in str(error.value)
    assert one(render(values, api_versions=(*discovered, f"monitoring.coreos.com/v1/{kind}")), kind)
    assert one(render(values), kind)  # helm template: rendered as asked


def test_lint_is_clean_with_everything_on() -> None:
    report = helm_python.lint(CHART, EVERY_COMPONENT, strict=True, namespace="gpu-labeller", kube_version="v1.34.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
