"""Security posture, RBAC least privilege, scheduling and resources of the rendered DaemonSets."""

from __future__ import annotations

from typing import Any

import click
import helm_python
import pytest
import yaml
from kubernetes_validate import utils as kv

from tests.deploy import CHART, COMBINATIONS, find, labeller_ds, one, plugin_ds, render

COMBOS = list(COMBINATIONS.items())
IDS = list(COMBINATIONS)

Obj = dict[str, Any]
SOCKET_DIR = "/var/lib/kubelet/device-plugins"
# Steady-state RSS measured by tests/bench/bench_daemon.py (57 MiB) and bench_plugin.py (52 MiB); the plugin
# following the config label, by bench_config_switch.py (74 MiB); the DRA plugin, by bench_dra.py (77.4 MiB,
# 78.4 MiB on mi300x-x8-cpx).
MEASURED_RSS_MIB = {"gpu-labeller": 57, "gpu-labeller-device-plugin": 74, "gpu-labeller-dra-plugin": 79}


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def daemonsets(objects: list[Obj]) -> list[Obj]:
    return find(objects, "DaemonSet")


def pod(ds: Obj) -> Obj:
    spec: Obj = ds["spec"]["template"]["spec"]
    return spec


def containers(ds: Obj) -> list[Obj]:
    return list(pod(ds)["containers"])


def container(ds: Obj, name: str | None = None) -> Obj:
    """The DaemonSet's main container (the first), or the one called ``name``."""
    found = [c for c in containers(ds) if name is None or c["name"] == name]
    assert found, name
    return dict(found[0])


def host_mounts(ds: Obj, name: str | None = None) -> dict[str, tuple[str, Obj]]:
    """hostPath volume path -> (mount path, volumeMount) for every hostPath the container mounts."""
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod(ds)["volumes"] if "hostPath" in v}
    return {host_paths[m["name"]]: (m["mountPath"], m) for m in container(ds, name)["volumeMounts"]
            if m["name"] in host_paths}


@pytest.mark.parametrize(("name", "values"), COMBOS, ids=IDS)
def test_no_container_is_privileged_and_all_are_hardened(name: str, values: dict[str, Any]) -> None:
    for ds, box in ((each, box) for each in daemonsets(render(values)) for box in containers(each)):
        spec, ctx = pod(ds), box["securityContext"]
        assert ctx["privileged"] is False
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["capabilities"] == {"drop": ["ALL"]}
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(host_namespace)
        assert "initContainers" not in spec


NON_ROOT = [(name, values) for name, values in COMBOS if values.get("labeller", {}).get("output") != "features-file"]


@pytest.mark.parametrize(("name", "values"), NON_ROOT, ids=[name for name, _ in NON_ROOT])
def test_labeller_runs_as_non_root(name: str, values: dict[str, Any]) -> None:
    ctx = pod(labeller_ds(render(values)))["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == 65532 and ctx["runAsGroup"] == 65532


def test_features_file_output_runs_as_root_only_to_write_the_root_owned_features_dir() -> None:
    ds = labeller_ds(render({"labeller": {"output": "features-file"}}))
    assert pod(ds)["securityContext"]["runAsUser"] == 0
    mounts = host_mounts(ds)
    path, mount = mounts["/etc/kubernetes/node-feature-discovery/features.d"]
    assert path == "/etc/kubernetes/node-feature-discovery/features.d" and not mount.get("readOnly")
    assert "--features-file=/etc/kubernetes/node-feature-discovery/features.d/gpu-labeller" in container(ds)["args"]
    # Everything else stays read-only and unprivileged.
    assert all(m.get("readOnly") for p, (_, m) in mounts.items() if p != path)


def test_vgpu_detection_adds_only_sys_admin_and_root_to_the_labeller() -> None:
    objects = render({"labeller": {"vgpuDetection": True}})
    ds = labeller_ds(objects)
    ctx = container(ds)["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert ctx["privileged"] is False and ctx["readOnlyRootFilesystem"] is True
    assert pod(ds)["securityContext"]["runAsUser"] == 0
    assert all(m.get("readOnly") for _, m in host_mounts(ds).values())
    assert "add" not in container(plugin_ds(objects))["securityContext"]["capabilities"]


FIRMWARE = "version: v1\nlabeller:\n  labels:\n    firmware: true\n"


@pytest.mark.parametrize("config", [{"data": {"whole": {"version": "v1"}, "mi25": FIRMWARE}},
                                    {"data": {"mi25": yaml.safe_load(FIRMWARE)}}],
                         ids=["one-config-of-two-as-text", "a-mapping"])
def test_firmware_in_any_named_config_mounts_debugfs(config: dict[str, Any]) -> None:
    ds = labeller_ds(render({"config": config}))
    assert host_mounts(ds)["/sys/kernel/debug"][0] == "/host/sys/kernel/debug"
    assert pod(ds)["securityContext"]["runAsUser"] == 0


def test_firmware_labels_mount_debugfs_read_only_and_run_as_root_with_no_capability() -> None:
    # debugfs's root is mode 0700 and owned by root: uid 0 reads it as its owner, no capability needed.
    objects = render({"config": {"labeller": {"labels": {"firmware": True}}}})  # the former shape of `config`
    ds = labeller_ds(objects)
    path, mount = host_mounts(ds)["/sys/kernel/debug"]
    assert path == "/host/sys/kernel/debug" and mount["readOnly"] is True
    assert pod(ds)["securityContext"]["runAsUser"] == 0
    assert container(ds)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert all(m.get("readOnly") for _, m in host_mounts(ds).values())
    config = yaml.safe_load(one(objects, "ConfigMap")["data"]["default"])
    assert config["labeller"]["labels"]["firmware"] is True and config["flags"] == {"migStrategy": "none"}
    # Off (the default): no debugfs, and the labeller stays non-root.
    default = labeller_ds(render())
    assert "/sys/kernel/debug" not in host_mounts(default) and pod(default)["securityContext"]["runAsUser"] == 65532


def test_device_plugin_runs_as_root_but_unprivileged() -> None:
    ds = plugin_ds(render())
    assert pod(ds)["securityContext"]["runAsUser"] == 0
    assert container(ds)["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize(("name", "values"), COMBOS, ids=IDS)
def test_host_paths_are_read_only_except_the_plugin_socket_dir(name: str, values: dict[str, Any]) -> None:
    objects = render(values)
    writable = {("device-plugin", SOCKET_DIR), ("device-plugin", "/var/run/cdi"),
                ("mps-control-daemon", "/run/nvidia/mps"), ("mps-control-daemon", "/run/nvidia/mps/shm"),
                ("dra-plugin", "/var/lib/kubelet/plugins_registry"),
                ("dra-plugin", "/var/lib/kubelet/plugins/gpu.nvidia.com"),
                ("dra-plugin", "/var/lib/kubelet/plugins/gpu.amd.com"), ("dra-plugin", "/var/run/cdi"),
                ("dra-plugin", "/run/gpu-labeller/mps"), ("dra-plugin", "/run/gpu-labeller/mps/shm")}
    if values.get("labeller", {}).get("output") == "features-file":
        writable.add(("labeller", "/etc/kubernetes/node-feature-discovery/features.d"))
    for ds in daemonsets(objects):
        for box in containers(ds):
            for host_path, (_, mount) in host_mounts(ds, box["name"]).items():
                read_only = (box["name"], host_path) not in writable
                assert bool(mount.get("readOnly")) is read_only, (box["name"], host_path)


@pytest.mark.parametrize(("name", "values"), COMBOS, ids=IDS)
def test_read_only_host_trees_are_read_only_all_the_way_down(name: str, values: dict[str, Any]) -> None:
    # readOnly alone leaves the mounts under a tree writable (/dev/shm, /dev/pts, /sys/fs/cgroup under
    # /dev and /sys). recursiveReadOnly (Kubernetes 1.30+; IfPossible: a runtime without it mounts
    # plain read-only) needs no mount propagation. The one exception is a containerized driver's root:
    # its container mounts it after ours start, which only HostToContainer propagation lets us see.
    driver_root = values.get("config", {}).get("flags", {}).get("nvidiaDriverRoot", "/").rstrip("/")
    for ds in daemonsets(render(values)):
        for box in containers(ds):
            for host_path, (_, mount) in host_mounts(ds, box["name"]).items():
                if driver_root and host_path == driver_root:
                    assert mount.get("readOnly") is True and "recursiveReadOnly" not in mount
                    assert mount["mountPropagation"] == "HostToContainer", (box["name"], host_path)
                elif mount.get("readOnly"):
                    assert mount.get("recursiveReadOnly") == "IfPossible", \
                        (ds["metadata"]["name"], box["name"], host_path)
                    assert mount.get("mountPropagation", "None") == "None", (box["name"], host_path)


# Every read-only host mount both DaemonSets can have: libdrm (default), debugfs (firmware labels), the MPS root.
ALL_HOST_MOUNTS = {"config": {"version": "v1", "labeller": {"labels": {"firmware": True}},
                              "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}}


@pytest.mark.parametrize(("kube_version", "recursive"), [("1.29.0", False), ("1.31.0", True)])
def test_recursive_read_only_only_for_api_servers_that_know_it(kube_version: str, recursive: bool) -> None:
    # recursiveReadOnly is a 1.30 field: an older API server's strict field validation (kubectl's default)
    # refuses the whole DaemonSet for it. Below 1.30 the mounts stay plain read-only.
    objects = render(ALL_HOST_MOUNTS, kube_version=kube_version)
    read_only = []
    for ds in (labeller_ds(objects), plugin_ds(objects)):
        for box in containers(ds):
            for host_path, (_, mount) in host_mounts(ds, box["name"]).items():
                if mount.get("readOnly"):
                    read_only.append((box["name"], host_path))
                    assert mount.get("recursiveReadOnly") == ("IfPossible" if recursive else None), \
                        (box["name"], host_path)
        kv.validate(ds, kube_version, strict=True)
    # labeller: sys, libdrm, debugfs, mps root; plugin and MPS daemon: sys, dev (and the root)
    assert len(read_only) == 9


def test_host_mounts_are_the_documented_ones() -> None:
    objects = render()
    assert {p: m for p, (m, _) in host_mounts(labeller_ds(objects)).items()} == {
        "/sys": "/host/sys", "/usr/share/libdrm": "/host/usr/share/libdrm"}
    assert {p: m for p, (m, _) in host_mounts(plugin_ds(objects)).items()} == {
        "/sys": "/host/sys", "/dev": "/host/dev", SOCKET_DIR: SOCKET_DIR}
    libdrm = next(v for v in pod(labeller_ds(objects))["volumes"] if v["name"] == "host-libdrm")
    assert libdrm["hostPath"]["type"] == ""  # optional on the host: neither checked nor created
    assert "host-libdrm" not in str(labeller_ds(render({"labeller": {"libdrm": {"enabled": False}}})))


def rules(objects: list[Obj]) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    """The labeller's ClusterRole rules; [] when the chart grants it no role at all."""
    roles = find(objects, "ClusterRole", "gpu-labeller")
    return [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for role in roles for r in role["rules"]]


NODES = (("",), ("nodes",), ("get", "list", "watch", "patch"))
READ_NODES = (("",), ("nodes",), ("get", "list", "watch"))
TWO_CONFIGS = {"config": {"data": {"a": {"version": "v1"}, "b": {"version": "v1"}}}}
EVENTS = (("",), ("events",), ("create",))
NODEFEATURES = (("nfd.k8s-sigs.io",), ("nodefeatures",), ("get", "list", "watch", "create", "update"))


@pytest.mark.parametrize(("values", "expected"), [
    ({}, [NODES]),
    ({"labeller": {"events": {"enabled": True}}}, [NODES, EVENTS]),
    ({"labeller": {"output": "nodefeature"}}, [NODES, NODEFEATURES]),
    ({"labeller": {"output": "nodefeature", "events": {"enabled": True}}}, [NODES, EVENTS, NODEFEATURES]),
    ({"labeller": {"output": "features-file"}}, []),
    ({"labeller": {"output": "features-file", "events": {"enabled": True}}}, [EVENTS]),
    (TWO_CONFIGS, [NODES, EVENTS]),  # following the config label: an Event when a config fails
    ({**TWO_CONFIGS, "labeller": {"output": "features-file"}}, [READ_NODES, EVENTS]),
    ({"config": {**TWO_CONFIGS["config"], "nodeLabel": ""}}, [NODES]),
], ids=["default", "events", "nodefeature", "nodefeature+events", "features-file", "features-file+events",
        "config-label", "features-file+config-label", "config-label-off"])
def test_cluster_role_is_least_privilege(values: dict[str, Any], expected: list[Any]) -> None:
    objects = render(values)
    assert rules(objects) == expected
    assert find(objects, "Role") == [] and find(objects, "RoleBinding") == []
    if not expected:
        assert find(objects, "ClusterRole") == [] and find(objects, "ClusterRoleBinding") == []
        return
    binding = one(objects, "ClusterRoleBinding", "gpu-labeller")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "gpu-labeller"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-labeller", "namespace": "gpu-labeller"}]


@pytest.mark.parametrize(("values", "token"), [
    ({}, True),
    ({"labeller": {"output": "nodefeature"}}, True),
    ({"labeller": {"output": "features-file"}}, False),
    ({"labeller": {"output": "features-file", "events": {"enabled": True}}}, True),
    ({**TWO_CONFIGS, "labeller": {"output": "features-file"}}, True),
], ids=["node", "nodefeature", "features-file", "features-file+events", "features-file+config-label"])
def test_labeller_gets_a_token_only_when_it_calls_the_api(values: dict[str, Any], token: bool) -> None:
    objects = render(values)
    ds = labeller_ds(objects)
    assert pod(ds)["automountServiceAccountToken"] is token
    account = one(objects, "ServiceAccount", pod(ds)["serviceAccountName"])
    assert account.get("automountServiceAccountToken", True) is token


def test_device_plugin_has_no_api_access() -> None:
    objects = render()
    ds = plugin_ds(objects)
    account = pod(ds)["serviceAccountName"]
    assert account != pod(labeller_ds(objects))["serviceAccountName"]
    assert pod(ds)["automountServiceAccountToken"] is False
    assert one(objects, "ServiceAccount", account)["automountServiceAccountToken"] is False
    for binding in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding"):
        assert account not in [s["name"] for s in binding["subjects"]]


@pytest.mark.parametrize("values", [TWO_CONFIGS, {"config": {"name": "gpu-configs", "create": False}}],
                         ids=["two-configs", "existing-configmap"])
def test_device_plugin_following_the_config_label_may_only_read_nodes(values: dict[str, Any]) -> None:
    objects = render(values)
    ds = plugin_ds(objects)
    account = pod(ds)["serviceAccountName"]
    assert pod(ds)["automountServiceAccountToken"] is True
    assert one(objects, "ServiceAccount", account)["automountServiceAccountToken"] is True
    role = one(objects, "ClusterRole", "gpu-labeller-device-plugin")
    assert [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]] == [READ_NODES]
    bindings = [b for b in find(objects, "ClusterRoleBinding") if account in [s["name"] for s in b["subjects"]]]
    assert [(b["roleRef"]["name"], b["subjects"]) for b in bindings] == [
        ("gpu-labeller-device-plugin", [{"kind": "ServiceAccount", "name": account, "namespace": "gpu-labeller"}])]
    assert find(render({**values, "devicePlugin": {"enabled": False}}), "ClusterRole",
                "gpu-labeller-device-plugin") == []


def test_device_plugin_runs_only_on_nodes_the_labeller_labelled() -> None:
    affinity = pod(plugin_ds(render()))["affinity"]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # Terms are ORed; expressions inside one term are ANDed: one expression per term.
    assert terms == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
        {"matchExpressions": [{"key": "amd.com/gpu.present", "operator": "In", "values": ["true"]}]},
    ]
    assert "affinity" not in pod(labeller_ds(render()))  # the labeller runs on every node


@pytest.mark.parametrize(("name", "values"), COMBOS, ids=IDS)
def test_resources_priority_tolerations_and_rollout(name: str, values: dict[str, Any]) -> None:
    for ds, box in ((each, box) for each in daemonsets(render(values)) for box in containers(each)):
        spec = pod(ds)
        resources = box["resources"]
        request, limit = (mebibytes(resources[kind]["memory"]) for kind in ("requests", "limits"))
        # room for a probe's peak, never an OOM kill at rest
        assert request >= MEASURED_RSS_MIB[ds["metadata"]["name"]] and limit >= 2 * request
        assert resources["requests"]["cpu"] == "10m" and "cpu" not in resources["limits"]  # no CPU throttling
        assert spec["priorityClassName"] == "system-node-critical"
        assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}
        if values.get("tolerateAllTaints"):
            assert spec["tolerations"] == [{"operator": "Exists"}]
        else:
            assert spec["tolerations"] == [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "CriticalAddonsOnly", "operator": "Exists"},
            ]
        assert spec.get("runtimeClassName") == values.get("runtimeClassName")
        probes = box
        assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"


def env(ds: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(ds)["env"]}


def test_environment_follows_nvidia_practice() -> None:
    objects = render()
    labeller, plugin = env(labeller_ds(objects)), env(plugin_ds(objects))
    for variables in (labeller, plugin):
        assert variables["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert variables["NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        assert variables["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert labeller["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert plugin["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


@pytest.mark.parametrize(("values", "args"), [
    ({}, ["--config-dir=/etc/gpu-labeller", "--config-label="]),  # one config: no label to follow
    ({"config": {"default": "a", "data": {"a": {"version": "v1"}, "b": {"version": "v1"}}}},
     ["--config-dir=/etc/gpu-labeller", "--config-name=a", "--config-label=nvidia.com/device-plugin.config"]),
    ({"config": {"name": "gpu-configs", "create": False, "nodeLabel": "example.com/gpu-config"}},
     ["--config-dir=/etc/gpu-labeller", "--config-label=example.com/gpu-config"]),
    ({"config": {"nodeLabel": "", "data": {"a": {"version": "v1"}, "b": {"version": "v1"}}}},
     ["--config-dir=/etc/gpu-labeller", "--config-label="]),
], ids=["default", "named", "existing", "label-off"])
def test_both_components_read_the_same_config_map_and_follow_the_same_label(values: dict[str, Any],
                                                                           args: list[str]) -> None:
    objects = render(values)
    for ds in (labeller_ds(objects), plugin_ds(objects)):
        config = next(v for v in pod(ds)["volumes"] if v["name"] == "config")
        assert config["configMap"]["name"] == values.get("config", {}).get("name", "gpu-labeller-config")
        mount = next(m for m in container(ds)["volumeMounts"] if m["name"] == "config")
        assert mount == {"name": "config", "mountPath": "/etc/gpu-labeller", "readOnly": True}  # no subPath: updates
        assert [a for a in container(ds)["args"] if a.startswith("--config")] == args


def _parse(command: click.Command, args: list[str]) -> dict[str, Any]:
    ctx = command.make_context(command.name, args, resilient_parsing=False)
    return dict(ctx.params)


@pytest.mark.parametrize("values", [{}, {"labeller": {"output": "nodefeature", "events": {"enabled": True}}},
                                    {"labeller": {"output": "features-file"}}, TWO_CONFIGS],
                         ids=["default", "nodefeature", "file", "config-label"])
def test_labeller_args_parse_with_the_real_cli(values: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from labeller.cli.commands.run import run

    monkeypatch.setenv("NODE_NAME", "node-1")
    args = container(labeller_ds(render(values)))["args"]
    assert args[0] == "run"
    params = _parse(run, args[1:])
    assert str(params["host_root"]) == "/host" and params["interval"] == 60 and params["metrics_port"] == 8080
    assert params["output"] == values.get("labeller", {}).get("output", "node")
    assert params["events"] is bool(values.get("labeller", {}).get("events"))
    assert str(params["config_dir"]) == "/etc/gpu-labeller" and params["config_path"] is None
    assert params["config_label"] == ("nvidia.com/device-plugin.config" if values is TWO_CONFIGS else "")


@pytest.mark.parametrize("values", [{}, TWO_CONFIGS], ids=["default", "config-label"])
def test_device_plugin_args_parse_with_the_real_cli(values: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from labeller.cli.commands.device_plugin import device_plugin

    monkeypatch.delenv("CONFIG_FILE", raising=False)
    args = container(plugin_ds(render(values)))["args"]
    assert args[0] == "device-plugin"
    params = _parse(device_plugin, args[1:])
    assert params["socket_dir"] is not None and params["metrics_port"] == 8081
    assert str(params["config_dir"]) == "/etc/gpu-labeller"
    assert params["config_label"] == ("nvidia.com/device-plugin.config" if values is TWO_CONFIGS else "")


@pytest.mark.parametrize(("interval", "seconds"), [(60, 60.0), (0.5, 0.5), ("2m", 120.0), ("500ms", 0.5)])
def test_labeller_interval_takes_seconds_or_a_duration(interval: Any, seconds: float,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from labeller.cli.commands.run import run

    monkeypatch.setenv("NODE_NAME", "node-1")
    args = container(labeller_ds(render({"labeller": {"interval": interval}})))["args"]
    assert _parse(run, args[1:])["interval"] == seconds


MPS_CDI = {"config": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": "cdi-annotations"}},
                      "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}}


def test_mps_runs_the_control_daemon_beside_the_plugin_and_both_see_the_mps_root() -> None:
    objects = render(MPS_CDI)
    plugin = plugin_ds(objects)
    assert [c["name"] for c in containers(plugin)] == ["device-plugin", "mps-control-daemon"]
    daemon = host_mounts(plugin, "mps-control-daemon")
    assert daemon["/run/nvidia/mps"][0] == "/run/nvidia/mps" and daemon["/run/nvidia/mps/shm"][0] == "/dev/shm"
    assert host_mounts(plugin)["/run/nvidia/mps"] == (
        "/run/nvidia/mps", {"name": "mps-root", "mountPath": "/run/nvidia/mps", "readOnly": True,
                            "recursiveReadOnly": "IfPossible"})
    assert host_mounts(labeller_ds(objects))["/run/nvidia/mps"][1]["readOnly"] is True
    mps_env = {e["name"]: e.get("value") for e in container(plugin, "mps-control-daemon")["env"]}
    assert mps_env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility" and mps_env["NVIDIA_VISIBLE_DEVICES"] == "all"
    # without sharing.mps: one container, no MPS root anywhere
    default = render()
    assert [c["name"] for c in containers(plugin_ds(default))] == ["device-plugin"]
    assert "/run/nvidia/mps" not in host_mounts(plugin_ds(default)) | host_mounts(labeller_ds(default))


def test_mps_root_follows_the_config() -> None:
    values = {"config": {"version": "v1", "flags": {"mpsRoot": "/var/lib/mps/"},
                         "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}}}}
    plugin = plugin_ds(render(values))
    assert set(host_mounts(plugin, "mps-control-daemon")) >= {"/var/lib/mps", "/var/lib/mps/shm"}


def test_cdi_mounts_the_spec_dir_and_the_driver_files_only_when_a_cdi_strategy_is_set() -> None:
    plugin = plugin_ds(render(MPS_CDI))
    mounts = host_mounts(plugin)
    assert mounts["/var/run/cdi"][0] == "/var/run/cdi" and not mounts["/var/run/cdi"][1].get("readOnly")
    assert mounts["/usr"] == ("/host/usr", {"name": "host-usr", "mountPath": "/host/usr", "readOnly": True,
                                            "recursiveReadOnly": "IfPossible"})
    assert "--cdi-spec-dir=/var/run/cdi" in container(plugin)["args"]
    assert "/var/run/cdi" not in host_mounts(plugin_ds(render()))
    listed = plugin_ds(render({"config": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": ["envvar"]}}}}))
    assert "/var/run/cdi" not in host_mounts(listed)


def test_mps_control_daemon_args_parse_with_the_real_cli() -> None:
    from labeller.cli.commands.mps import mps_control_daemon
    from labeller.cli.commands.device_plugin import device_plugin

    plugin = plugin_ds(render(MPS_CDI))
    args = container(plugin, "mps-control-daemon")["args"]
    assert args[0] == "mps-control-daemon"
    params = _parse(mps_control_daemon, args[1:])
    assert params["metrics_port"] == 8082 and params["check_interval"] == 5.0 and str(params["host_root"]) == "/host"
    # it reads the same named configs as the plugin, from the same mounted directory
    assert str(params["config_dir"]) == "/etc/gpu-labeller" and params["config_path"] is None
    assert str(_parse(device_plugin, container(plugin)["args"][1:])["cdi_spec_dir"]) == "/var/run/cdi"


MPS_NAMED = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n"


def test_mps_and_cdi_are_set_up_when_any_named_config_asks_for_them() -> None:
    # A pool config that shares by MPS (as YAML text) next to a whole-GPU default: the plugin pod
    # carries the control daemon, which follows the node's config label like the plugin.
    values = {"config": {"default": "whole", "data": {
        "whole": {"version": "v1"},
        "mps-4": MPS_NAMED,
        "cdi": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": ["cdi-cri"]}}}}}}
    plugin = plugin_ds(render(values))
    assert [c["name"] for c in containers(plugin)] == ["device-plugin", "mps-control-daemon"]
    daemon_args = container(plugin, "mps-control-daemon")["args"]
    assert "--config-label=nvidia.com/device-plugin.config" in daemon_args and "--config-name=whole" in daemon_args
    assert pod(plugin)["automountServiceAccountToken"] is True  # both containers read their Node's label
    assert "/var/run/cdi" in host_mounts(plugin) and "/run/nvidia/mps" in host_mounts(labeller_ds(render(values)))


def test_an_existing_config_map_gets_mps_and_cdi_only_when_asked() -> None:
    existing = {"config": {"name": "gpu-configs", "create": False}}
    assert [c["name"] for c in containers(plugin_ds(render(existing)))] == ["device-plugin"]
    asked = plugin_ds(render({**existing, "devicePlugin": {"mpsControlDaemon": {"enabled": True}, "cdiEnabled": True}}))
    assert [c["name"] for c in containers(asked)] == ["device-plugin", "mps-control-daemon"]
    assert "/var/run/cdi" in host_mounts(asked)


def test_named_configs_with_different_mps_roots_are_refused() -> None:
    chart = helm_python.Chart.load(CHART)
    values = {"config": {"data": {"a": {"version": "v1", "flags": {"mpsRoot": "/run/a"}},
                                  "b": {"version": "v1", "flags": {"mpsRoot": "/run/b"}}}}}
    try:
        with pytest.raises(helm_python.HelmError, match="different flags.mpsRoot"):
            chart.render(values, name="gpu-labeller", namespace="gpu-labeller")
    finally:
        chart.close()
