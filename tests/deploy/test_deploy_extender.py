"""The chart's optional scheduler extender: off by default, least-privilege RBAC, a hardened
single-replica Deployment whose args the real CLI accepts, the Service the scheduler calls over mutual
TLS with certificates that work together, the scheduler's KubeSchedulerConfiguration, and a
NetworkPolicy that admits only the scheduler."""

from __future__ import annotations

import base64
import socket
import ssl
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from labeller.process.httpserver import server_tls, start_http_server
from tests.builders import PATIENCE_S
from tests.deploy import CHART, find, one, render

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
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert spec["volumes"] == [{"name": "tls", "secret": {"secretName": f"{NAME}-tls", "defaultMode": 0o440}}]
    assert box["volumeMounts"] == [{"name": "tls", "mountPath": "/etc/gpu-labeller/tls", "readOnly": True}]
    # Probes cannot present a client certificate: they use the plain port that serves health and metrics only.
    assert box["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert box["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert box["ports"] == [{"name": "https", "containerPort": 39999}, {"name": "metrics", "containerPort": 39998}]
    assert box["resources"]["requests"]["memory"] == "128Mi"  # above the 90 MiB measured at 10,000 pods


@pytest.mark.parametrize("values", [{}, {"policy": "spread", "bindWait": "5s", "assumeTimeout": 120, "port": 40000}],
                         ids=["default", "custom"])
def test_args_parse_with_the_real_cli(values: dict[str, Any]) -> None:
    from labeller.cli.commands.extender import scheduler_extender

    args = deployment(values)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "scheduler-extender"
    ctx = scheduler_extender.make_context("scheduler-extender", list(args[1:]))
    assert ctx.params["port"] == values.get("port", 39999)
    assert ctx.params["policy"] == values.get("policy", "binpack")
    assert ctx.params["bind_wait"] == (5.0 if values else 4.0)
    assert ctx.params["assume_timeout"] == (120.0 if values else 60.0)
    assert (ctx.params["tls_cert_file"], ctx.params["tls_key_file"], ctx.params["client_ca_file"]) == (
        "/etc/gpu-labeller/tls/tls.crt", "/etc/gpu-labeller/tls/tls.key", "/etc/gpu-labeller/tls/ca.crt")
    assert ctx.params["bind_address"] is None  # with TLS: every address of the pod
    assert ctx.params["metrics_port"] == 39998 and ctx.params["scheduler_names"] == ("default-scheduler",)


def test_the_service_is_cluster_internal_https_and_no_node_port_can_be_asked() -> None:
    objects = render({"extender": {"enabled": True}})
    service = one(objects, "Service", NAME)
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "https", "port": 39999, "targetPort": "https"}]
    pod_labels = one(objects, "Deployment", NAME)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    chart = helm_python.Chart.load(CHART)
    try:
        for bad in ({"type": "NodePort"}, {"nodePort": 32766}):
            with pytest.raises(helm_python.HelmValuesError):
                chart.render({"extender": {"enabled": True, "service": bad}}, name="x", namespace="gpu-labeller")
    finally:
        chart.close()


def secret_files(objects: list[Obj], name: str, directory: Path) -> dict[str, Path]:
    secret = one(objects, "Secret", name)
    assert secret["type"] == "kubernetes.io/tls"
    files = {}
    for key, value in secret["data"].items():
        files[key] = directory / f"{name}-{key}"
        files[key].write_bytes(base64.b64decode(value))
    return files


def test_generated_certificates_let_the_scheduler_and_only_it_in(tmp_path: Path) -> None:
    """The serving Secret configures the real server (--tls-*), the client Secret the scheduler's side
    (tlsConfig, checking serverName): the handshake succeeds, and without the client certificate it fails."""
    objects = render({"extender": {"enabled": True}})
    server = secret_files(objects, f"{NAME}-tls", tmp_path)
    client = secret_files(objects, f"{NAME}-scheduler-client", tmp_path)
    config = yaml.safe_load(one(objects, "ConfigMap", f"{NAME}-scheduler-config")["data"]["scheduler-config.yaml"])
    server_name = config["extenders"][0]["tlsConfig"]["serverName"]
    http = start_http_server(0, "127.0.0.1", tls=server_tls(str(server["tls.crt"]), str(server["tls.key"]),
                                                            str(server["ca.crt"])))
    try:
        scheduler = ssl.create_default_context(cafile=str(client["ca.crt"]))
        scheduler.load_cert_chain(str(client["tls.crt"]), str(client["tls.key"]))
        with socket.create_connection(("127.0.0.1", http.port), timeout=PATIENCE_S) as raw, \
                scheduler.wrap_socket(raw, server_hostname=server_name) as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert tls.recv(1024).startswith(b"HTTP/1.1 200 ")
        anonymous = ssl.create_default_context(cafile=str(client["ca.crt"]))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with socket.create_connection(("127.0.0.1", http.port), timeout=PATIENCE_S) as raw, \
                    anonymous.wrap_socket(raw, server_hostname=server_name) as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                if not tls.recv(1024):  # TLS 1.3: the refusal arrives after the handshake
                    raise ConnectionResetError("closed")
    finally:
        http.close()


def test_the_scheduler_configuration_calls_the_extender_over_mutual_tls() -> None:
    objects = render({"extender": {"enabled": True}})
    config_map = one(objects, "ConfigMap", f"{NAME}-scheduler-config")
    config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1" and config["kind"] == "KubeSchedulerConfiguration"
    host = f"{NAME}.gpu-labeller.svc"
    assert config["extenders"] == [{
        "urlPrefix": f"https://{host}:39999/gpushare-scheduler", "filterVerb": "filter",
        "prioritizeVerb": "prioritize", "bindVerb": "bind", "weight": 1, "enableHTTPS": True,
        "tlsConfig": {"caFile": "/etc/kubernetes/gpu-labeller-extender/ca.crt",
                      "certFile": "/etc/kubernetes/gpu-labeller-extender/tls.crt",
                      "keyFile": "/etc/kubernetes/gpu-labeller-extender/tls.key", "serverName": host},
        "httpTimeout": "5s", "nodeCacheCapable": True, "ignorable": False,
        "managedResources": [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}]}]
    pinned = render({"extender": {"enabled": True, "service": {"clusterIP": "10.96.0.50"},
                                  "schedulerConfig": {"host": "10.96.0.50",
                                                      "apiVersion": "kubescheduler.config.k8s.io/v1beta3"}}})
    extender = yaml.safe_load(one(pinned, "ConfigMap", f"{NAME}-scheduler-config")["data"]["scheduler-config.yaml"])
    assert extender["apiVersion"] == "kubescheduler.config.k8s.io/v1beta3"  # for a scheduler before 1.25
    assert extender["extenders"][0]["urlPrefix"] == "https://10.96.0.50:39999/gpushare-scheduler"
    assert extender["extenders"][0]["tlsConfig"]["serverName"] == host  # the certificate is still checked
    assert one(pinned, "Service", NAME)["spec"]["clusterIP"] == "10.96.0.50"


def test_an_existing_secret_is_mounted_and_none_is_generated() -> None:
    objects = render({"extender": {"enabled": True, "tls": {"existingSecret": "extender-certs"}}})
    assert not find(objects, "Secret")
    volumes = one(objects, "Deployment", NAME)["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["secret"]["secretName"] == "extender-certs"


def test_the_network_policy_admits_only_the_scheduler_to_the_extender_port() -> None:
    policy = one(render({"extender": {"enabled": True}}), "NetworkPolicy", NAME)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    api, metrics = policy["spec"]["ingress"]
    assert api == {"ports": [{"port": "https", "protocol": "TCP"}], "from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
         "podSelector": {"matchLabels": {"component": "kube-scheduler"}}}]}
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}]}
    pods = one(render({"extender": {"enabled": True}}), "Deployment", NAME)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pods.items()
    own = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    custom = one(render({"extender": {"enabled": True, "networkPolicy": {"from": own}}}), "NetworkPolicy", NAME)
    assert custom["spec"]["ingress"][0]["from"] == own
    assert not find(render({"extender": {"enabled": True, "networkPolicy": {"enabled": False}}}), "NetworkPolicy")


def test_manifest_holds_only_the_extender() -> None:
    from tests.deploy import MANIFESTS

    kinds = [line.split(": ")[1] for line in (MANIFESTS / "scheduler-extender.yaml").read_text().splitlines()
             if line.startswith("kind: ")]
    assert kinds == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
                     "Service", "Deployment", "NetworkPolicy"]
    assert "PRIVATE KEY" not in (MANIFESTS / "scheduler-extender.yaml").read_text()  # the user's own Secret
    assert not find(render(), "Deployment")
