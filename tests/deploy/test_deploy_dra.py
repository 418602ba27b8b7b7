"""DRA in the chart (dra.enabled): the kubelet DRA plugin's DaemonSet, its RBAC, the DeviceClasses (their
CEL evaluated on the slices of every built-in profile), and `dra.vendors` written into the default
config, which moves a node's GPUs from the device plugin to the DRA plugin."""

from __future__ import annotations

import importlib
import json
import re
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import click
import helm_python
import pytest
import yaml
from click.testing import CliRunner

from labeller.cli.root import main
from tests.core.test_core_dra_claims import DEVICE_CLASSES as CLAIM_TEST_DEVICE_CLASSES
from tests.deploy import CHART, ROOT, dra_ds, find, labeller_ds, one, plugin_ds, render
from tests.deploy.cel import DeviceClassSelector
from vendors import RESOURCE_NAMES, VENDORS
from vendors.simulate import builtin_profiles

Obj = dict[str, Any]
ON = {"dra": {"enabled": True}}
ALL_ON_DRA = {"dra": {"enabled": True, "vendors": ["nvidia", "amd"]}}
DRIVERS = [v.dra.driver for v in VENDORS if v.dra is not None]
DRA_OBJECTS = {"ServiceAccount/gpu-labeller-dra-plugin", "ClusterRole/gpu-labeller-dra-plugin",
               "ClusterRoleBinding/gpu-labeller-dra-plugin", "DaemonSet/gpu-labeller-dra-plugin",
               "DeviceClass/gpu.nvidia.com", "DeviceClass/mig.nvidia.com", "DeviceClass/gpu.amd.com"}
TWO_CONFIGS = {"config": {"data": {"default": {"version": "v1"},
                                   "dra": {"version": "v1", "labeller": {"dra": {"vendors": ["nvidia"]}}}}}}


def names(objects: list[Obj]) -> set[str]:
    return {f"{o['kind']}/{o['metadata']['name']}" for o in objects}


def pod(ds: Obj) -> Obj:
    spec: Obj = ds["spec"]["template"]["spec"]
    return spec


def container(ds: Obj) -> Obj:
    (box,) = pod(ds)["containers"]
    return dict(box)


def render_error(values: dict[str, Any]) -> str:
    chart = helm_python.Chart.load(CHART)
    try:
        with pytest.raises(helm_python.HelmError) as failure:
            chart.render(values, name="gpu-labeller", namespace="gpu-labeller")
    finally:
        chart.close()
    return str(failure.value)


# --- what the switch renders -----------------------------------------------------------------------

def test_dra_is_off_by_default_and_dra_vendors_alone_changes_nothing() -> None:
    default = render()
    assert not [n for n in names(default) if "dra" in n or n.startswith("DeviceClass/")]
    assert render({"dra": {"vendors": ["nvidia"]}}) == default  # only with dra.enabled


def test_dra_enabled_adds_the_plugin_its_rbac_and_the_device_classes_and_changes_nothing_else() -> None:
    default, enabled = render(), render(ON)
    assert names(enabled) - names(default) == DRA_OBJECTS
    assert [o for o in enabled if f"{o['kind']}/{o['metadata']['name']}" not in DRA_OBJECTS] == default
    assert names(render({"dra": {"enabled": True, "deviceClasses": {"enabled": False}}})) - names(default) == {
        n for n in DRA_OBJECTS if not n.startswith("DeviceClass/")}


def test_dra_vendors_changes_only_the_config_map() -> None:
    default, on = render(ON), render(ALL_ON_DRA)
    assert [o for o in on if o["kind"] != "ConfigMap"] == [o for o in default if o["kind"] != "ConfigMap"]


# --- the DaemonSet -----------------------------------------------------------------------------------

def test_dra_plugin_has_the_device_plugins_security_posture_and_its_own_service_account() -> None:
    objects = render(ON)
    ds, device_plugin = dra_ds(objects), plugin_ds(objects)
    # the same pod and container hardening as the device plugin: root only for the kubelet's sockets
    assert pod(ds)["securityContext"] == pod(device_plugin)["securityContext"]
    assert container(ds)["securityContext"] == container(device_plugin)["securityContext"] == {
        "privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod(ds).get(host_namespace)
    assert "initContainers" not in pod(ds)
    # scheduled where the device plugin is: nodes the labeller found GPUs on
    assert pod(ds)["affinity"] == pod(device_plugin)["affinity"]
    assert pod(ds)["tolerations"] == pod(device_plugin)["tolerations"]
    # it always calls the API server (slices, claims): its own account, with a token
    account = pod(ds)["serviceAccountName"]
    assert account == "gpu-labeller-dra-plugin"
    assert account not in {pod(labeller_ds(objects))["serviceAccountName"], pod(device_plugin)["serviceAccountName"]}
    assert pod(ds)["automountServiceAccountToken"] is True
    assert one(objects, "ServiceAccount", account).get("automountServiceAccountToken", True) is True


def host_mounts(ds: Obj) -> dict[str, Obj]:
    """hostPath -> its volumeMount (and the volume's type) for every hostPath the plugin mounts."""
    volumes = {v["name"]: v["hostPath"] for v in pod(ds)["volumes"] if "hostPath" in v}
    return {volumes[m["name"]]["path"]: {**m, "type": volumes[m["name"]].get("type")}
            for m in container(ds)["volumeMounts"] if m["name"] in volumes}


def test_dra_plugin_mounts_only_what_it_needs() -> None:
    mounts = host_mounts(dra_ds(render(ON)))
    read_only = {"readOnly": True, "recursiveReadOnly": "IfPossible"}
    # the socket directories at their host paths (the kubelet dials the path the registration names):
    # the registry, and one directory per driver, not the kubelet's whole plugins directory
    sockets = ["/var/lib/kubelet/plugins_registry", *(f"/var/lib/kubelet/plugins/{d}" for d in DRIVERS)]
    expected = {
        **{path: {"mountPath": path} for path in [*sockets, "/var/run/cdi"]},
        "/sys": {"mountPath": "/host/sys", **read_only},
        "/dev": {"mountPath": "/host/dev", **read_only},
        "/usr": {"mountPath": "/host/usr", **read_only},  # the driver files an NVIDIA claim's CDI spec mounts
        "/proc/driver": {"mountPath": "/host/proc/driver", **read_only},  # MIG capability minors: its caps nodes
        # claims' MPS daemons, at the host's path (their CDI specs mount the pipe directory from there), and
        # the shared memory of their servers and clients
        "/run/gpu-labeller/mps": {"mountPath": "/run/gpu-labeller/mps"},
        "/run/gpu-labeller/mps/shm": {"mountPath": "/dev/shm"},
    }
    assert {path: {k: v for k, v in m.items() if k not in ("name", "type")} for path, m in mounts.items()} == expected
    assert mounts["/var/lib/kubelet/plugins_registry"]["type"] == "Directory"  # the kubelet's: never made up
    assert {mounts[p]["type"] for p in sockets[1:] + ["/var/run/cdi"]} == {"DirectoryOrCreate"}
    assert "/var/lib/kubelet/plugins" not in mounts
    config = next(m for m in container(dra_ds(render(ON)))["volumeMounts"] if m["name"] == "config")
    assert config == {"name": "config", "mountPath": "/etc/gpu-labeller", "readOnly": True}


def test_a_containerized_driver_root_is_mounted_whole_read_only_and_seen_when_mounted_later() -> None:
    values = {**ON, "config": {"version": "v1", "flags": {"nvidiaDriverRoot": "/run/nvidia/driver/"}}}
    mounts = host_mounts(dra_ds(render(values)))
    mount = mounts["/run/nvidia/driver"]  # whole: GKE's driver keeps its libraries in <root>/lib64, not usr/
    assert (mount["mountPath"], mount["readOnly"]) == ("/host/run/nvidia/driver", True)
    # the driver's container mounts its root there after the plugin starts: only propagation shows it
    assert mount["mountPropagation"] == "HostToContainer" and "recursiveReadOnly" not in mount
    assert mount["type"] == "DirectoryOrCreate"
    assert "/run/nvidia/driver/usr" not in mounts and "/etc/ld.so.cache" not in mounts


@pytest.mark.parametrize("component", ["dra", "device-plugin"])
def test_the_hosts_linker_cache_is_mounted_only_when_asked(component: str) -> None:
    cdi = {"version": "v1", "flags": {"plugin": {"deviceListStrategy": ["cdi-cri"]}}}
    base: dict[str, Any] = {**ON, "config": cdi} if component == "dra" else {"config": cdi}
    pick = dra_ds if component == "dra" else plugin_ds
    assert "/etc/ld.so.cache" not in host_mounts(pick(render(base)))
    mount = host_mounts(pick(render({**base, "hostLinkerCache": True})))["/etc/ld.so.cache"]
    # a file, never made: a node without one keeps the pod waiting rather than getting a directory there
    assert (mount["mountPath"], mount["readOnly"], mount["type"]) == ("/host/etc/ld.so.cache", True, "File")
    rooted = {**base, "hostLinkerCache": True,
              "config": {**cdi, "flags": {**cdi["flags"], "nvidiaDriverRoot": "/run/nvidia/driver"}}}
    assert "/etc/ld.so.cache" not in host_mounts(pick(render(rooted)))  # the driver root brings its own


def test_directories_follow_the_values() -> None:
    values = {"dra": {"enabled": True, "pluginsDir": "/var/lib/k0s/kubelet/plugins/",
                      "registryDir": "/var/lib/k0s/kubelet/plugins_registry", "cdiSpecDir": "/etc/cdi",
                      "metricsPort": 9443, "mpsRoot": "/run/dra-mps/"}}
    ds = dra_ds(render(values))
    args = container(ds)["args"]
    assert {"--plugins-dir=/var/lib/k0s/kubelet/plugins", "--registry-dir=/var/lib/k0s/kubelet/plugins_registry",
            "--cdi-spec-dir=/etc/cdi", "--metrics-port=9443", "--mps-root=/run/dra-mps"} <= set(args)
    assert set(host_mounts(ds)) >= {"/var/lib/k0s/kubelet/plugins_registry", "/etc/cdi", "/run/dra-mps",
                                    "/run/dra-mps/shm", *(f"/var/lib/k0s/kubelet/plugins/{d}" for d in DRIVERS)}
    assert host_mounts(ds)["/run/dra-mps"]["mountPath"] == "/run/dra-mps"
    assert container(ds)["ports"] == [{"name": "metrics", "containerPort": 9443, "protocol": "TCP"}]


def test_node_name_from_the_downward_api_and_probes_on_the_metrics_port() -> None:
    box = container(dra_ds(render(ON)))
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in box["env"]}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert box["ports"] == [{"name": "metrics", "containerPort": 8083, "protocol": "TCP"}]
    assert box["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert box["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_metrics_port_differs_from_every_other_components() -> None:
    objects = render({"dra": {"enabled": True}, "extender": {"enabled": True},
                      "devicePlugin": {"mpsControlDaemon": {"enabled": True}}})
    ports = [p["containerPort"] for o in find(objects, "DaemonSet") + find(objects, "Deployment")
             for c in pod(o)["containers"] for p in c["ports"]]
    assert sorted(ports) == [8080, 8081, 8082, 8083, 39998, 39999]


@pytest.mark.parametrize(("values", "label"), [
    (ON, ""), (TWO_CONFIGS | ON, "nvidia.com/device-plugin.config"),
    ({"config": {"name": "gpu-configs", "create": False}} | ON, "nvidia.com/device-plugin.config"),
], ids=["one-config", "named-configs", "existing-configmap"])
def test_it_reads_the_same_configs_and_follows_the_same_label_as_the_others(values: dict[str, Any], label: str) -> None:
    objects = render(values)
    ds = dra_ds(objects)
    volume = next(v for v in pod(ds)["volumes"] if v["name"] == "config")
    assert volume == next(v for v in pod(plugin_ds(objects))["volumes"] if v["name"] == "config")
    config_args = [a for a in container(ds)["args"] if a.startswith("--config")]
    assert config_args == [a for a in container(plugin_ds(objects))["args"] if a.startswith("--config")]
    assert f"--config-label={label}" in config_args


def dra_plugin_command() -> click.Command:
    """``gpu-labeller dra-plugin`` (labeller.cli.commands.dra_plugin) where it is built; until then a command made of
    the same shared option decorators, with the directory options the issue gives it."""
    try:
        command: click.Command = importlib.import_module("labeller.cli.commands.dra_plugin").dra_plugin
        return command
    except ModuleNotFoundError as missing:
        if not (missing.name or "").startswith("labeller.apps.draplugin"):
            raise
    from labeller.cli.commands.options import (
        discovery_options,
        endpoint_options,
        own_node_options,
    )

    directory = click.Path(path_type=Path, file_okay=False)

    @click.command("dra-plugin")
    @discovery_options
    @own_node_options
    @click.option("--plugins-dir", type=directory, default=Path("/var/lib/kubelet/plugins"))
    @click.option("--registry-dir", type=directory, default=Path("/var/lib/kubelet/plugins_registry"))
    @endpoint_options(8083)
    @click.option("--cdi-spec-dir", type=directory, default=Path("/var/run/cdi"))
    def dra_plugin(**_: Any) -> None:
        """The options of the DRA plugin."""

    return dra_plugin


@pytest.mark.parametrize("values", [ON, TWO_CONFIGS | ON], ids=["one-config", "named-configs"])
def test_args_parse_with_the_plugins_command_line(values: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")  # what the downward API gives it
    args = container(dra_ds(render(values)))["args"]
    assert args[0] == "dra-plugin"
    command = dra_plugin_command()
    params = command.make_context(command.name, args[1:], resilient_parsing=False).params
    assert str(params["host_root"]) == "/host" and params["node_name"] == "gpu-node-1"
    assert str(params["plugins_dir"]) == "/var/lib/kubelet/plugins"
    assert str(params["registry_dir"]) == "/var/lib/kubelet/plugins_registry"
    assert str(params["cdi_spec_dir"]) == "/var/run/cdi" and params["metrics_port"] == 8083
    assert str(params["config_dir"]) == "/etc/gpu-labeller" and params["config_path"] is None
    assert params["config_label"] == ("nvidia.com/device-plugin.config" if "data" in values.get("config", {}) else "")


# --- RBAC --------------------------------------------------------------------------------------------

def rules(objects: list[Obj]) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    role = one(objects, "ClusterRole", "gpu-labeller-dra-plugin")
    return [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]]


SLICES = (("resource.k8s.io",), ("resourceslices",), ("get", "list", "watch", "create", "update", "delete"))
CLAIMS = (("resource.k8s.io",), ("resourceclaims",), ("get",))


@pytest.mark.parametrize(("values", "node_verbs"), [
    (ON, ("get",)),
    (TWO_CONFIGS | ON, ("get", "list", "watch")),  # its own Node (field selector), to follow the config label
], ids=["one-config", "follows-label"])
def test_rbac_is_its_own_and_least_privilege(values: dict[str, Any], node_verbs: tuple[str, ...]) -> None:
    objects = render(values)
    assert rules(objects) == [SLICES, CLAIMS, (("",), ("nodes",), node_verbs)]
    binding = one(objects, "ClusterRoleBinding", "gpu-labeller-dra-plugin")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "gpu-labeller-dra-plugin"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-labeller-dra-plugin",
                                    "namespace": "gpu-labeller"}]
    # no other binding names it, and the other components gain nothing
    holders = [b["metadata"]["name"] for b in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding")
               if "gpu-labeller-dra-plugin" in [s["name"] for s in b["subjects"]]]
    assert holders == ["gpu-labeller-dra-plugin"]
    without = render({k: v for k, v in values.items() if k != "dra"})
    assert [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")
            and o["metadata"]["name"] != "gpu-labeller-dra-plugin"] == [
        o for o in without if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_service_account_name_and_annotations_follow_the_values() -> None:
    objects = render({"namespaceOverride": "gpus", "dra": {"enabled": True, "serviceAccount": {
        "name": "dra", "annotations": {"example.com/role": "x"}}}})
    account = one(objects, "ServiceAccount", "dra")
    assert (account["metadata"]["namespace"] == "gpus"
            and account["metadata"]["annotations"] == {"example.com/role": "x"})
    assert pod(dra_ds(objects))["serviceAccountName"] == "dra"
    assert one(objects, "ClusterRoleBinding", "gpu-labeller-dra-plugin")["subjects"] == [
        {"kind": "ServiceAccount", "name": "dra", "namespace": "gpus"}]


# --- dra.vendors: which vendors the default config serves through DRA ---------------------------------

def configs(values: dict[str, Any]) -> dict[str, Any]:
    cm = one(render(values), "ConfigMap", "gpu-labeller-config")
    return {name: yaml.safe_load(text) for name, text in cm["data"].items()}


def test_dra_vendors_are_written_into_the_default_config_which_the_components_accept() -> None:
    from labeller.model.config import parse_document

    written = configs(ALL_ON_DRA)
    assert written == {"default": {"version": "v1", "flags": {"migStrategy": "none"},
                                   "labeller": {"dra": {"vendors": ["nvidia", "amd"]}}}}
    assert parse_document(written["default"], RESOURCE_NAMES).dra_vendors == ("nvidia", "amd")
    assert configs(ON) == configs({})  # no vendors: the configs as given


@pytest.mark.parametrize(("config", "default"), [
    ({"default": "whole", "data": {"whole": {"version": "v1"}, "ts4": "version: v1\n"}}, "whole"),
    ({"data": {"default": {"version": "v1", "labeller": {"labels": {"firmware": True}}}, "ts4": {"version": "v1"}}},
     "default"),
    ({"data": {"only": "version: v1  # a comment\nflags:\n  migStrategy: single\n"}}, "only"),
    ({"version": "v1", "flags": {"migStrategy": "mixed"}}, "default"),  # the former shape
], ids=["config.default", "called-default", "the-only-one-as-text", "former-shape"])
def test_only_the_config_of_nodes_without_the_label_changes(config: dict[str, Any], default: str) -> None:
    given, written = configs({"config": config}), configs({"config": config, **ALL_ON_DRA})
    assert {name: doc for name, doc in written.items() if name != default} == {
        name: doc for name, doc in given.items() if name != default}
    assert written[default] == {**given[default], "labeller": {**given[default].get("labeller", {}),
                                                               "dra": {"vendors": ["nvidia", "amd"]}}}


@pytest.mark.parametrize(("config", "message"), [
    ({"name": "gpu-configs", "create": False}, "does not write into an existing ConfigMap"),
    ({"data": {"a": {"version": "v1"}, "b": {"version": "v1"}}}, "no default config to write it into"),
    ({"default": "c", "data": {"a": {"version": "v1"}, "b": {"version": "v1"}}}, 'config.default "c"'),
    ({"data": {"default": "version: v1\nlabeller:\n  dra:\n    vendors: [amd]\n"}}, "keep one"),
], ids=["existing-configmap", "no-default", "unknown-default", "both-say"])
def test_dra_vendors_that_cannot_be_written_are_refused(config: dict[str, Any], message: str) -> None:
    assert message in render_error({"config": config, **ALL_ON_DRA})


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


NO_DRA = "serves no vendor through DRA"  # resourceslices then previews every vendor, and says so on stderr


def publishes_nothing(*args: str) -> bool:
    """Whether the DRA plugin publishes nothing on this node: resourceslices says so (and shows a preview)."""
    result = CliRunner().invoke(main, ["resourceslices", *args])
    assert result.exit_code == 0, result.output
    return NO_DRA in result.stderr


def test_one_value_moves_every_node_without_the_label_from_the_device_plugin_to_dra(tmp_path: Path) -> None:
    """The rendered ConfigMap, mounted as the components mount it: the device plugin withholds the GPUs,
    the DRA plugin publishes them, the labels say so; a node labelled for another config keeps them."""
    values = {"config": {"data": {"default": {"version": "v1"}, "time-sliced-4": {"version": "v1"}}}, **ALL_ON_DRA}
    for name, text in one(render(values), "ConfigMap", "gpu-labeller-config")["data"].items():
        (tmp_path / name).write_text(text)
    node = ["--simulate", "mixed-l40s-mi210", "--config-dir", str(tmp_path)]
    resources = run("resources", *node)
    assert "served through DRA" in resources and "nvidia.com/gpu" in resources and "amd.com/gpu" in resources
    slices = json.loads(run("resourceslices", *node, "--node-name", "gpu-node-1", "--format", "json"))["items"]
    assert sorted(s["spec"]["driver"] for s in slices) == sorted(DRIVERS) and not publishes_nothing(*node)
    labels = run("labels", *node)
    assert "nvidia.com/gpu.dra=true" in labels and "amd.com/gpu.dra=true" in labels
    pinned = [*node, "--config-name", "time-sliced-4"]  # what a node labelled time-sliced-4 gets
    assert "served through DRA" not in run("resources", *pinned)
    assert publishes_nothing(*pinned)


def doc_values() -> dict[str, Any]:
    """The chart values of the node-by-node example in docs/deploy.md (DRA in the chart)."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    part = text[text.index("## DRA in the chart"):text.index("## RBAC and security")]
    (block,) = re.findall(r"```yaml\n(.*?)```", part, re.S)
    values: dict[str, Any] = yaml.safe_load(textwrap.dedent(block))
    return values


def test_the_docs_node_by_node_example_moves_only_a_labelled_node(tmp_path: Path) -> None:
    values = doc_values()
    objects = render(values)
    assert "--config-label=nvidia.com/device-plugin.config" in container(dra_ds(objects))["args"]
    for name, text in one(objects, "ConfigMap", "gpu-labeller-config")["data"].items():
        (tmp_path / name).write_text(text)
    node = ["--simulate", "mixed-l40s-mi210", "--config-dir", str(tmp_path), "--format", "json"]
    labelled = json.loads(run("resourceslices", *node, "--config-name", "dra"))["items"]  # labelled ...config=dra
    assert publishes_nothing(*node) and not publishes_nothing(*node, "--config-name", "dra")
    assert sorted(s["spec"]["driver"] for s in labelled) == sorted(DRIVERS)
    assert "served through DRA" in run("resources", "--simulate", "mixed-l40s-mi210", "--config-dir", str(tmp_path),
                                       "--config-name", "dra")


# --- DeviceClasses -----------------------------------------------------------------------------------

def device_classes() -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in find(render(ON), "DeviceClass")}


def test_device_classes_are_the_vendors_and_the_ones_the_doc_claims_use() -> None:
    classes = device_classes()
    assert all(c["apiVersion"] == "resource.k8s.io/v1" for c in classes.values())
    expressions = {name: [s["cel"]["expression"] for s in c["spec"]["selectors"]] for name, c in classes.items()}
    assert expressions == {name: [expression] for name, expression in CLAIM_TEST_DEVICE_CLASSES.items()}
    page = (ROOT / "docs" / "deploy.md").read_text()
    for name, (expression,) in expressions.items():
        assert f"`{name}`" in page and expression in page


@cache
def published(profile: str) -> list[tuple[str, Obj]]:
    """(driver, device) for every device `gpu-labeller resourceslices` publishes on the profile, all vendors on DRA."""
    out = run("resourceslices", "--simulate", profile, "--dra-vendors", "all", "--format", "json")
    return [(s["spec"]["driver"], d) for s in json.loads(out)["items"] for d in s["spec"]["devices"]]


def expected_class(driver: str, device: Obj) -> str:
    kind = device["attributes"]["type"]["string"]
    return {("gpu.nvidia.com", "gpu"): "gpu.nvidia.com", ("gpu.nvidia.com", "mig"): "mig.nvidia.com"}.get(
        (driver, kind), "gpu.amd.com" if driver == "gpu.amd.com" else "none")


@pytest.mark.parametrize("profile", sorted(builtin_profiles()))
def test_each_published_device_is_in_exactly_its_class(profile: str) -> None:
    selectors = {name: DeviceClassSelector(c) for name, c in device_classes().items()}
    devices = published(profile)
    assert devices
    for driver, device in devices:
        chosen = [name for name, selector in selectors.items() if selector.selects(driver, device)]
        assert chosen == [expected_class(driver, device)], (profile, device["name"])


@pytest.mark.parametrize(("profile", "counts"), [
    ("dgx-h100", {"gpu.nvidia.com": 8}),
    ("dgx-a100-mig-mixed", {"gpu.nvidia.com": 4, "mig.nvidia.com": 22}),  # MIG on: its MIG devices, not the GPU
    ("a100-mig-single", {"mig.nvidia.com": 56}),
    ("mixed-l40s-mi210", {"gpu.nvidia.com": 2, "gpu.amd.com": 2}),
    ("mi300x-x8-cpx", {"gpu.amd.com": 63}),  # partitions are AMD's one class too
], ids=lambda v: v if isinstance(v, str) else "")
def test_classes_count_what_a_user_expects(profile: str, counts: dict[str, int]) -> None:
    selectors = {name: DeviceClassSelector(c) for name, c in device_classes().items()}
    found = {name: sum(selector.selects(driver, d) for driver, d in published(profile))
             for name, selector in selectors.items()}
    assert {name: n for name, n in found.items() if n} == counts


def test_a_foreign_drivers_device_is_in_none_of_our_classes() -> None:
    device = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
    for selector in (DeviceClassSelector(c) for c in device_classes().values()):
        assert selector.selects("gpu.example.com", device) is False


def whole_gpu_resource(vendor: str, profile: str) -> str:
    """The extended resource the device plugin serves a vendor's whole GPUs as (`resources --simulate`)."""
    out = json.loads(run("resources", "--simulate", profile, "--format", "json"))
    (name,) = {r["name"] for r in out["resources"] if r["vendor"] == vendor}
    return str(name)


@pytest.mark.parametrize("kube_version", ["1.34.0", "1.36.0"])
def test_the_gpu_classes_carry_the_extended_resources_the_device_plugin_serves(kube_version: str) -> None:
    """A pod asking nvidia.com/gpu or amd.com/gpu, as written for the device plugin, gets a device of the class."""
    classes = {o["metadata"]["name"]: o["spec"].get("extendedResourceName")
               for o in find(render(ON, kube_version), "DeviceClass")}
    assert classes == {"gpu.nvidia.com": whole_gpu_resource("nvidia", "dgx-h100"), "mig.nvidia.com": None,
                       "gpu.amd.com": whole_gpu_resource("amd", "mi210-x8")}
    assert set(classes.values()) == {"nvidia.com/gpu", "amd.com/gpu", None}


@pytest.mark.parametrize(("values", "kube_version"), [
    ({"dra": {"enabled": True, "deviceClasses": {"extendedResourceNames": False}}}, "1.34.0"),  # the switch
    (ON, "1.33.0"),  # DeviceClassSpec has no such field before 1.34
])
def test_no_extended_resource_name_where_switched_off_or_unknown(values: dict[str, Any], kube_version: str) -> None:
    classes = find(render(values, kube_version), "DeviceClass")
    assert len(classes) == 3 and not [c for c in classes if "extendedResourceName" in c["spec"]]


def test_the_plain_dra_manifest_carries_the_extended_resource_names() -> None:
    text = (ROOT / "deploy" / "manifests" / "kubelet-dra-plugin.yaml").read_text()
    classes = {o["metadata"]["name"]: o["spec"].get("extendedResourceName")
               for o in yaml.safe_load_all(text) if o and o["kind"] == "DeviceClass"}
    assert classes == {"gpu.nvidia.com": "nvidia.com/gpu", "mig.nvidia.com": None, "gpu.amd.com": "amd.com/gpu"}
