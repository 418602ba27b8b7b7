"""The chart's optional scheduler extender: off by default, least-privilege RBAC, a hardened
single-replica Deployment whose args the real CLI accepts, and the Service the scheduler calls."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import find, one, render

Obj = dict[str, Any]
NAME = "gpu-labeller-scheduler-extender"


def deployment(values: dict[str, Any] | None = None) -> Obj:
    return one(render({"extender": {"enabled": True, **(values or {})}}), "Deployment", NAME)


def test_off_by_default() -> None:
    objects = render()
    assert not [o for o in objects
                if o["metadata"]["labels"].get("app.kubernetes.io/component") == "scheduler-extender"]


def test_rbac_is_what_placement_needs_and_no_more() -> None:
    objects = render({"extender": {"enabled": True}})
    assert one(objects, "ClusterRole", NAME)["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    ]
    role = one(objects, "Role", NAME)
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]
    for binding in (one(objects, "ClusterRoleBinding", NAME), one(objects, "RoleBinding", NAME)):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "gpu-labeller"}]
    assert one(objects, "ServiceAccount", NAME)["metadata"]["namespace"] == "gpu-labeller"


def test_one_hardened_non_root_replica_with_probes_and_measured_resources() -> None:
    deploy = deployment()
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    spec = deploy["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 65532
    box = spec["containers"][0]
    ctx = box["securityContext"]
    assert ctx["privileged"] is False and ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True and ctx["capabilities"] == {"drop": ["ALL"]}
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "volumes"))
    assert box["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert box["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert box["ports"] == [{"name": "http", "containerPort": 39999}]
    assert box["resources"]["requests"]["memory"] == "128Mi"  # above the 90 MiB measured at 10,000 pods


@pytest.mark.parametrize("values", [{}, {"policy": "spread", "bindWait": "5s", "assumeTimeout": 120, "port": 40000}],
                         ids=["default", "custom"])
def test_args_parse_with_the_real_cli(values: dict[str, Any]) -> None:
    from labeller.extender.cli import scheduler_extender

    args = deployment(values)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "scheduler-extender"
    ctx = scheduler_extender.make_context("scheduler-extender", list(args[1:]))
    assert ctx.params["port"] == values.get("port", 39999)
    assert ctx.params["policy"] == values.get("policy", "binpack")
    assert ctx.params["bind_wait"] == (5.0 if values else 4.0)
    assert ctx.params["assume_timeout"] == (120.0 if values else 60.0)


def test_service_reaches_the_pods_and_can_be_a_node_port_as_gpushares() -> None:
    objects = render({"extender": {"enabled": True}})
    service = one(objects, "Service", NAME)
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 39999, "targetPort": "http"}]
    pod_labels = one(objects, "Deployment", NAME)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    node_port = one(render({"extender": {"enabled": True, "service": {"type": "NodePort", "nodePort": 32766}}}),
                    "Service", NAME)
    assert node_port["spec"]["ports"][0]["nodePort"] == 32766


def test_manifest_holds_only_the_extender() -> None:
    from tests.deploy import MANIFESTS

    kinds = [line.split(": ")[1] for line in (MANIFESTS / "scheduler-extender.yaml").read_text().splitlines()
             if line.startswith("kind: ")]
    assert kinds == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                     "Service", "Deployment"]
    assert not find(render(), "Deployment")
