"""The chart lints and renders with the real Helm engine, and every object is valid Kubernetes."""

from __future__ import annotations

import json
from typing import Any

import helm_python
import pytest
import yaml
from kubernetes_validate import utils as kv

from tests.deploy import (
    CHART,
    COMBINATIONS,
    KUBE_VERSIONS,
    cluster,
    find,
    installed,
    kube_version_for,
    labeller_ds,
    one,
    plugin_ds,
    render,
)

COMBOS = list(COMBINATIONS.items())
IDS = list(COMBINATIONS)


@pytest.mark.parametrize(("name", "values"), COMBOS, ids=IDS)
def test_lint_is_clean(name: str, values: dict[str, Any]) -> None:
    report = helm_python.lint(CHART, values, strict=True, namespace="gpu-labeller", kube_version="v1.30.0")
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings and errors are not accepted.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(("name", "values"), COMBOS, ids=IDS)
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_is_valid_kubernetes(name: str, values: dict[str, Any], kube_version: str) -> None:
    objects = render(values)
    assert objects
    kube_version = kube_version_for(values, kube_version)
    for obj in objects:
        try:
            kv.validate(obj, kube_version, strict=True)
        except kv.ValidationError as e:  # pragma: no cover - the message is the point
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for {kube_version}: {e.message} "
                        f"at {list(e.path)}")


@pytest.mark.parametrize(("name", "values"), COMBOS, ids=IDS)
def test_namespaced_objects_land_in_the_release_namespace(name: str, values: dict[str, Any]) -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding", "DeviceClass"}
    for obj in render(values):
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in obj["metadata"]
        elif obj["kind"] in ("Role", "RoleBinding"):  # the extender reads unhealthy-GPU ConfigMaps of kube-system
            assert obj["metadata"]["namespace"] == "kube-system", obj["kind"]
        else:
            assert obj["metadata"]["namespace"] == "gpu-labeller", obj["kind"]


def test_default_render_has_exactly_the_expected_objects() -> None:
    objects = render()
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in installed(objects)) == sorted([
        "ServiceAccount/gpu-labeller", "ServiceAccount/gpu-labeller-device-plugin",
        "ClusterRole/gpu-labeller", "ClusterRoleBinding/gpu-labeller", "ConfigMap/gpu-labeller-config",
        "DaemonSet/gpu-labeller", "DaemonSet/gpu-labeller-device-plugin",
    ])
    # and, for `helm uninstall`, postDeleteCleanup's prune Job (test_deploy_prune.py)
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects if o not in installed(objects)) == [
        "ClusterRole/gpu-labeller-prune", "ClusterRoleBinding/gpu-labeller-prune", "Job/gpu-labeller-prune",
        "ServiceAccount/gpu-labeller-prune"]


def test_create_namespace_renders_the_namespace_with_the_pod_security_level_the_pods_need() -> None:
    ns = one(render({"createNamespace": True}), "Namespace", "gpu-labeller")
    # hostPath volumes are forbidden by the baseline level; the namespace must admit them.
    assert {key: value for key, value in ns["metadata"]["labels"].items() if key.startswith("pod-security.")} == {
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/audit": "privileged",
        "pod-security.kubernetes.io/warn": "privileged",
    }
    assert find(render(), "Namespace") == []


def test_both_daemonsets_need_the_privileged_level_for_their_host_paths() -> None:
    # Pod Security "baseline" forbids every hostPath volume: this is why the namespace is privileged.
    for ds in find(render({"createNamespace": True}), "DaemonSet"):
        volumes = ds["spec"]["template"]["spec"]["volumes"]
        assert [v for v in volumes if "hostPath" in v], ds["metadata"]["name"]


def test_plugin_off_renders_no_plugin_objects() -> None:
    objects = render({"devicePlugin": {"enabled": False}})
    names = [o["metadata"]["name"] for o in objects]
    assert not [n for n in names if "device-plugin" in n]
    labeller_ds(objects)


def test_policy_is_on_by_default_where_the_cluster_serves_it() -> None:
    # tests/deploy/test_deploy_admission_policy.py has every case of admissionPolicy.enabled
    assert find(render(**cluster("1.29.0")), "ValidatingAdmissionPolicy") == []
    objects = installed(render(**cluster("1.30.0")))
    assert one(objects, "ValidatingAdmissionPolicy")["apiVersion"] == "admissionregistration.k8s.io/v1"
    one(objects, "ValidatingAdmissionPolicyBinding")


def config_map(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The rendered ConfigMap's configs, each parsed as YAML."""
    cm = one(render(values), "ConfigMap", "gpu-labeller-config")
    return {name: yaml.safe_load(text) for name, text in cm["data"].items()}


def test_config_map_holds_the_default_config_and_the_labeller_accepts_it() -> None:
    from labeller.model.config import parse_document
    from vendors import RESOURCE_NAMES

    assert config_map() == {"default": {"version": "v1", "flags": {"migStrategy": "none"}}}
    parse_document(config_map()["default"], RESOURCE_NAMES)


def test_named_configs_reach_the_config_map_as_mappings_or_as_nvidias_yaml_text() -> None:
    from labeller.model.config import parse_document
    from vendors import RESOURCE_NAMES

    text = "version: v1\nflags:\n  migStrategy: mixed  # a comment stays\n"
    values = {"config": {"data": {"whole": {"version": "v1"}, "mig-mixed": text}}}
    cm = one(render(values), "ConfigMap", "gpu-labeller-config")
    assert cm["data"] == {"whole": "version: v1\n", "mig-mixed": text}  # text verbatim, comments and all
    for document in config_map(values).values():
        parse_document(document, RESOURCE_NAMES)
    # NVIDIA's device plugin chart calls it `map`
    assert config_map({"config": {"map": {"x": text, "y": text}}}) == {"x": yaml.safe_load(text),
                                                                       "y": yaml.safe_load(text)}


def test_a_config_in_the_former_shape_is_the_one_config_default() -> None:
    sharing = {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}
    values = {"config": {"version": "v1", "flags": {"migStrategy": "single"}, "sharing": sharing}}
    assert config_map(values) == {"default": {"version": "v1", "flags": {"migStrategy": "single"}, "sharing": sharing}}


def test_an_existing_config_map_is_mounted_and_none_is_rendered() -> None:
    objects = render({"config": {"name": "gpu-configs", "create": False}})
    assert find(objects, "ConfigMap") == []
    for ds in (labeller_ds(objects), plugin_ds(objects)):
        volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
        assert volume["configMap"] == {"name": "gpu-configs"}
    named = render({"config": {"name": "gpu-configs"}})  # create (the default) under that name
    assert one(named, "ConfigMap")["metadata"]["name"] == "gpu-configs"


def test_a_config_edit_is_followed_live_so_it_rolls_no_pod() -> None:
    def templates(data: dict[str, Any]) -> list[Any]:
        objects = render({"config": {"data": data}})
        return [ds["spec"]["template"] for ds in (labeller_ds(objects), plugin_ds(objects))]

    before = templates({"default": {"version": "v1"}, "ts4": {"version": "v1", "flags": {"migStrategy": "mixed"}}})
    after = templates({"default": {"version": "v1"}, "ts4": {"version": "v1", "flags": {"migStrategy": "single"}}})
    assert before == after
    assert "annotations" not in before[0]["metadata"]


def test_config_create_false_needs_the_name_of_an_existing_config_map() -> None:
    chart = helm_python.Chart.load(CHART)
    try:
        with pytest.raises(helm_python.HelmError, match="config.create is false: set config.name"):
            chart.render({"config": {"create": False}}, name="gpu-labeller", namespace="gpu-labeller")
    finally:
        chart.close()


@pytest.mark.parametrize("bad", [
    {"labeller": {"output": "stdout"}},
    {"labeller": {"metricsPort": 0}},
    {"devicePlugin": {"socketDir": "relative/dir"}},
    {"admissionPolicy": {"ownedPrefixes": ["it's"]}},
    {"unknownKey": True},
    {"config": {"version": None, "flags": {"migStrategy": "none"}}},
    {"config": {"version": "v2"}},
    {"config": {"data": {"..data": {"version": "v1"}}}},  # a hidden name is no config
    {"config": {"data": {"has space": {"version": "v1"}}}},
    {"config": {"data": {"old": {"version": "v2"}}}},
    {"config": {"data": {"empty": ""}}},
    {"config": {"defualt": "x"}},
    {"config": {"nodeLabel": "not a label!"}},
    {"labeller": {"interval": "soon"}},
    {"labeller": {"interval": 0}},
    {"extender": {"policy": "random"}},
    {"extender": {"bindWait": "soon"}},
    {"extender": {"service": {"type": "LoadBalancer"}}},
    {"extender": {"replicas": 2}},
    {"dra": {"vendors": ["intel"]}},
    {"dra": {"vendors": ["nvidia", "nvidia"]}},
    {"dra": {"vendors": "nvidia"}},
    {"dra": {"pluginsDir": "var/lib/kubelet/plugins"}},
    {"dra": {"metricsPort": 70000}},
    {"dra": {"deviceClasses": {"create": True}}},
    {"monitoring": {"podMonitor": {"interval": "30 seconds"}}},
    {"monitoring": {"podMonitor": {"enabeld": True}}},
    {"monitoring": {"prometheusRule": {"runbookBaseUrl": "docs.example.com"}}},
    {"monitoring": {"prometheusRule": {"disabled": "GpuLabellerLabelsStale"}}},
    {"monitoring": {"prometheusRule": {"additionalRuleLabels": {"team": 7}}}},
    {"monitoring": {"dashboard": {"labels": ["grafana_dashboard"]}}},
], ids=lambda v: json.dumps(v))
def test_schema_rejects_bad_values(bad: dict[str, Any]) -> None:
    chart = helm_python.Chart.load(CHART)
    try:
        with pytest.raises(helm_python.HelmValuesError):
            chart.render(bad, name="gpu-labeller", namespace="gpu-labeller")
    finally:
        chart.close()
