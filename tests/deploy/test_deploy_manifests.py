"""deploy/manifests/ is the chart rendered by deploy/render.py, and valid on its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

from tests.deploy import (
    CHART,
    DRA_KUBE_VERSION,
    KUBE_VERSIONS,
    MANIFESTS,
    MIN_KUBE_VERSION,
    kube_version_for,
    load_render_script,
)

REGEN = "python deploy/render.py"
DRA_FILE = "kubelet-dra-plugin.yaml"
MAIN_FILE, MAIN_FILE_1_30 = "gpu-labeller.yaml", "gpu-labeller-k8s1.30.yaml"
POLICY_KUBE_VERSION = "1.30.0"


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    manifests: dict[str, str] = load_render_script().manifests()
    return manifests


def test_plain_manifests_equal_a_fresh_render(expected: dict[str, str]) -> None:
    assert sorted(str(p.relative_to(MANIFESTS)) for p in MANIFESTS.rglob("*.yaml")) == sorted(expected), (
        f"deploy/manifests/ holds other files than the render; run `{REGEN}`")
    stale = [name for name, text in expected.items() if (MANIFESTS / name).read_text() != text]
    assert not stale, f"deploy/manifests/{', '.join(stale)} out of date with the chart; regenerate: `{REGEN}`"


def test_regen_command_is_the_documented_one() -> None:
    assert load_render_script().REGEN_COMMAND == REGEN


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_plain_manifests_are_valid_kubernetes(kube_version: str) -> None:
    kinds = []
    for path in sorted(MANIFESTS.glob("*.yaml")):  # the order `kubectl apply -f deploy/manifests/` takes
        # The DRA file needs Kubernetes >= 1.34 (its header says so); the others 1.30 at most.
        version = kube_version_for({"dra": {"enabled": path.name == DRA_FILE}}, kube_version)
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                kv.validate(obj, version, strict=True)
                kinds.append(obj["kind"])
    # Namespace first so that one `kubectl apply -f` creates everything in order.
    assert kinds[0] == "Namespace"
    assert {"DaemonSet", "ClusterRole", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
            "DeviceClass"} <= set(kinds)


@pytest.mark.parametrize(("name", "floor"), [(MAIN_FILE, "Kubernetes 1.27 to 1.29"),
                                             ("scheduler-extender.yaml", "Kubernetes >= 1.27")])
def test_the_main_manifests_apply_on_the_oldest_kubernetes_the_chart_supports(name: str, floor: str) -> None:
    # Rendered for Chart.yaml's kubeVersion floor: no field an older API server refuses (recursiveReadOnly is
    # 1.30's), and no ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1 is 1.30's).
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={MIN_KUBE_VERSION}-0" == f">={load_render_script().MIN_KUBE_VERSION}-0"
    text = (MANIFESTS / name).read_text()
    assert floor in text.splitlines()[0]
    objects = [obj for obj in yaml.safe_load_all(text) if obj]
    assert objects
    for obj in objects:
        kv.validate(obj, MIN_KUBE_VERSION, strict=True)
    assert "recursiveReadOnly" not in text
    assert "ValidatingAdmissionPolicy" not in [o["kind"] for o in objects]


def test_the_1_27_manifest_names_the_1_30_one_for_later_clusters() -> None:
    assert f"on >= 1.30 apply {MAIN_FILE_1_30}" in (MANIFESTS / MAIN_FILE).read_text().splitlines()[0]


def host_mounts(ds: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(container, host path, its volume mount) for every hostPath mount of a DaemonSet."""
    spec = ds["spec"]["template"]["spec"]
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return [(box["name"], paths[m["name"]], m) for box in spec["containers"] for m in box.get("volumeMounts", [])
            if m["name"] in paths]


def test_the_1_30_manifest_installs_the_policy_and_mounts_host_trees_read_only_all_the_way_down() -> None:
    text = (MANIFESTS / MAIN_FILE_1_30).read_text()
    assert "Kubernetes >= 1.30: with the ValidatingAdmissionPolicy" in text.splitlines()[0]
    objects = [o for o in yaml.safe_load_all(text) if o]
    for obj in objects:
        kv.validate(obj, POLICY_KUBE_VERSION, strict=True)
    main = [o for o in yaml.safe_load_all((MANIFESTS / MAIN_FILE).read_text()) if o]
    # the same objects as the 1.27 file, plus the labeller's Node policy and its binding
    assert [f"{o['kind']}/{o['metadata']['name']}" for o in objects] == [
        f"{o['kind']}/{o['metadata']['name']}" for o in main] + [
        "ValidatingAdmissionPolicy/gpu-labeller-own-node-labels",
        "ValidatingAdmissionPolicyBinding/gpu-labeller-own-node-labels"]
    policy = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy")
    binding = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    # /sys (both DaemonSets) and /dev (the device plugin): read-only down to every submount
    read_only = [(box, path, m.get("recursiveReadOnly")) for ds in objects if ds["kind"] == "DaemonSet"
                 for box, path, m in host_mounts(ds) if m.get("readOnly")]
    assert {(box, path) for box, path, _ in read_only} >= {("labeller", "/sys"), ("device-plugin", "/sys"),
                                                          ("device-plugin", "/dev")}
    assert {recursive for _, _, recursive in read_only} == {"IfPossible"}


def test_check_mode_reports_stale_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    script = load_render_script()
    monkeypatch.setattr(script, "MANIFESTS", tmp_path)
    assert script.main(["--check"]) == 1
    assert REGEN in capsys.readouterr().err
    assert script.main([]) == 0
    assert script.main(["--check"]) == 0


def test_plain_manifests_show_two_named_configs_that_the_labeller_accepts() -> None:
    from labeller.model.config import parse_document
    from vendors import RESOURCE_NAMES

    objects = [o for o in yaml.safe_load_all((MANIFESTS / "gpu-labeller.yaml").read_text()) if o]
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    configs = {name: parse_document(yaml.safe_load(text), RESOURCE_NAMES) for name, text in config_map["data"].items()}
    assert sorted(configs) == ["default", "time-sliced-4"]
    assert configs["time-sliced-4"].sharing.replicas_for("nvidia.com/gpu") == 4
    for ds in (o for o in objects if o["kind"] == "DaemonSet"):
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--config-label=nvidia.com/device-plugin.config" in args


def test_dra_file_holds_only_the_dra_objects_and_uses_the_main_files_namespace_and_configs() -> None:
    text = (MANIFESTS / DRA_FILE).read_text()
    dra = [o for o in yaml.safe_load_all(text) if o]
    assert [f"{o['kind']}/{o['metadata']['name']}" for o in dra] == [
        "ServiceAccount/gpu-labeller-dra-plugin", "ClusterRole/gpu-labeller-dra-plugin",
        "ClusterRoleBinding/gpu-labeller-dra-plugin", "DaemonSet/gpu-labeller-dra-plugin",
        "DeviceClass/gpu.nvidia.com", "DeviceClass/mig.nvidia.com", "DeviceClass/gpu.amd.com",
        "ValidatingAdmissionPolicy/gpu-labeller-dra-plugin-own-node-slices",
        "ValidatingAdmissionPolicyBinding/gpu-labeller-dra-plugin-own-node-slices"]
    assert (f"Kubernetes >= {DRA_KUBE_VERSION.removesuffix('.0')}; apply after {MAIN_FILE_1_30}"
            in text.splitlines()[0])
    main = [o for o in yaml.safe_load_all((MANIFESTS / MAIN_FILE_1_30).read_text()) if o]
    assert not [o for o in main if o["kind"] == "DeviceClass" or "dra" in o["metadata"]["name"]]
    (namespace,) = [o["metadata"]["name"] for o in main if o["kind"] == "Namespace"]
    (config_map,) = [o for o in main if o["kind"] == "ConfigMap"]
    (plugin,) = [o for o in dra if o["kind"] == "DaemonSet"]
    spec = plugin["spec"]["template"]["spec"]
    assert plugin["metadata"]["namespace"] == namespace
    assert {"name": "config", "configMap": {"name": config_map["metadata"]["name"]}} in spec["volumes"]
    # the example configs leave every node on the device plugin until a config names a vendor
    assert all("dra" not in yaml.safe_load(config).get("labeller", {}) for config in config_map["data"].values())
    assert "--config-label=nvidia.com/device-plugin.config" in spec["containers"][0]["args"]


def test_check_mode_says_in_one_line_that_the_files_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_render_script().main(["--check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["deploy/manifests: 6 files up to date"]


def write_values(path: Path, values: dict[str, object]) -> str:
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_a_values_file_is_checked_with_the_labellers_config_validator(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The chart renders any string as a config; render.py refuses what the labeller would refuse."""
    values = write_values(tmp_path / "values.yaml", {"config": {"data": {
        "default": {"version": "v1", "flags": {"migStrategy": "Mixed"}}}}})
    assert load_render_script().main(["--check", "-f", values]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line == (f"Error: {values}: config.data.default: flags.migStrategy: must be one of none, single, mixed, "
                    "got 'Mixed'")


def test_values_files_merge_in_order_as_helm_takes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = write_values(tmp_path / "a.yaml", {"config": {"data": {
        "default": {"version": "v1", "flags": {"migStrategy": "none"}},
        "mig": {"version": "v1", "flags": {"migStrategy": "single"}}}}})
    second = write_values(tmp_path / "b.yaml", {"config": {"data": {
        "mig": {"version": "v1", "flags": {"migStrategy": "mixed"}}}}})
    script = load_render_script()
    assert script.main(["--check", "--values", first, "-f", second]) == 0
    [summary] = capsys.readouterr().out.splitlines()
    assert summary.startswith(f"{first}, {second}: renders ") and "configs default, mig valid" in summary
    assert script.main(["-f", first, "-f", second]) == 0  # without --check: the manifests, as `helm template`
    objects = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert yaml.safe_load(config_map["data"]["mig"])["flags"]["migStrategy"] == "mixed"
    assert yaml.safe_load(config_map["data"]["default"])["flags"]["migStrategy"] == "none"


def test_a_values_file_the_chart_refuses_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = write_values(tmp_path / "values.yaml", {"dra": {"enabled": True, "vendors": ["nvidia"]},
                                                     "config": {"name": "theirs", "create": False}})
    assert load_render_script().main(["--check", "-f", values]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"Error: {values}: ") and "dra.vendors: the chart does not write" in line


def test_a_value_the_charts_schema_refuses_is_named_with_its_path_and_cause(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Helm's schema error is several lines whose first says only that something is wrong: the whole of
    it, one line per problem, with no traceback."""
    typo = write_values(tmp_path / "typo.yaml", {"labeller": {"enabeld": True}})
    assert load_render_script().main(["--check", "-f", typo]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"Error: {typo}: values do not match the chart's schema (gpu-labeller/values.schema.json): "
        "at '/labeller': additional properties 'enabeld' not allowed"]
    two = write_values(tmp_path / "two.yaml", {"labeller": {"enabeld": True}, "devicePlugin": {"enabled": "yes"}})
    assert load_render_script().main(["-f", two]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"Error: {two}: values do not match the chart's schema (gpu-labeller/values.schema.json), " \
                       "2 problems:"
    assert sorted(lines[1:]) == ["  at '/devicePlugin/enabled': got string, want boolean",
                                 "  at '/labeller': additional properties 'enabeld' not allowed"]


def test_a_values_file_renders_for_the_cluster_version_given(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Without --kube-version as `helm template` (no cluster known: the default `auto` installs no policy);
    with it, as `helm install` on a cluster of that version (its APIs and fields)."""
    values = write_values(tmp_path / "values.yaml", {"labeller": {"events": {"enabled": True}}})
    script = load_render_script()

    def render(*extra: str) -> tuple[list[str], str]:
        assert script.main(["-f", values, *extra]) == 0
        out = capsys.readouterr().out
        return [f"{o['kind']}/{o['metadata']['name']}" for o in yaml.safe_load_all(out) if o], out

    offline, _ = render()
    assert not [name for name in offline if name.startswith("ValidatingAdmissionPolicy")]
    names, text = render("--kube-version", "1.34")
    assert "ValidatingAdmissionPolicy/gpu-labeller-own-node-labels" in names
    assert "recursiveReadOnly: IfPossible" in text
    old, text = render("--kube-version", "v1.29.4")
    assert not [name for name in old if name.startswith("ValidatingAdmissionPolicy")]
    assert "recursiveReadOnly" not in text


@pytest.mark.parametrize("argv", [["--kube-version", "1.x", "-f", "values.yaml"], ["--kube-version", "1.31"]])
def test_a_bad_kube_version_or_one_without_values_is_refused(argv: list[str],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        load_render_script().main(argv)
    assert exited.value.code == 2
    assert "--kube-version" in capsys.readouterr().err
