"""deploy/manifests/ is the chart rendered by deploy/render.py, and valid on its own."""

from __future__ import annotations

from pathlib import Path

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


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    manifests: dict[str, str] = load_render_script().manifests()
    return manifests


def test_plain_manifests_equal_a_fresh_render(expected: dict[str, str]) -> None:
    assert sorted(p.name for p in MANIFESTS.glob("*.yaml")) == sorted(expected), (
        f"deploy/manifests/ holds other files than the render; run `{REGEN}`")
    stale = [name for name, text in expected.items() if (MANIFESTS / name).read_text() != text]
    assert not stale, f"deploy/manifests/{', '.join(stale)} out of date with the chart; regenerate: `{REGEN}`"


def test_regen_command_is_the_documented_one() -> None:
    assert load_render_script().REGEN_COMMAND == REGEN


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_plain_manifests_are_valid_kubernetes(kube_version: str) -> None:
    kinds = []
    for path in sorted(MANIFESTS.glob("*.yaml")):  # the order `kubectl apply -f deploy/manifests/` takes
        # The DRA file needs Kubernetes >= 1.34 (its header says so); the others 1.30.
        version = kube_version_for({"dra": {"enabled": path.name == DRA_FILE}}, kube_version)
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                kv.validate(obj, version, strict=True)
                kinds.append(obj["kind"])
    # Namespace first so that one `kubectl apply -f` creates everything in order.
    assert kinds[0] == "Namespace"
    assert {"DaemonSet", "ClusterRole", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
            "DeviceClass"} <= set(kinds)


@pytest.mark.parametrize("name", ["gpu-labeller.yaml", "scheduler-extender.yaml"])
def test_the_main_manifests_apply_on_the_oldest_kubernetes_the_chart_supports(name: str) -> None:
    # Rendered for Chart.yaml's kubeVersion floor: no field an older API server refuses (recursiveReadOnly is 1.30's).
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={MIN_KUBE_VERSION}-0" == f">={load_render_script().MIN_KUBE_VERSION}-0"
    text = (MANIFESTS / name).read_text()
    assert f"Kubernetes >= {MIN_KUBE_VERSION.removesuffix('.0')}" in text.splitlines()[0]
    objects = [obj for obj in yaml.safe_load_all(text) if obj]
    assert objects
    for obj in objects:
        kv.validate(obj, MIN_KUBE_VERSION, strict=True)
    assert "recursiveReadOnly" not in text


def test_main_manifest_has_no_admission_policy_and_policy_file_nothing_else() -> None:
    main = [o["kind"] for o in yaml.safe_load_all((MANIFESTS / "gpu-labeller.yaml").read_text()) if o]
    policy = [o["kind"] for o in yaml.safe_load_all((MANIFESTS / "validating-admission-policy.yaml").read_text()) if o]
    assert "ValidatingAdmissionPolicy" not in main
    assert policy == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def test_check_mode_reports_stale_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    script = load_render_script()
    monkeypatch.setattr(script, "MANIFESTS", tmp_path)
    assert script.main(["--check"]) == 1
    assert REGEN in capsys.readouterr().err
    assert script.main([]) == 0
    assert script.main(["--check"]) == 0


def test_plain_manifests_show_two_named_configs_that_the_labeller_accepts() -> None:
    from labeller.config import parse_document
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
    assert f"Kubernetes >= {DRA_KUBE_VERSION.removesuffix('.0')}; apply after gpu-labeller.yaml" in text.splitlines()[0]
    main = [o for o in yaml.safe_load_all((MANIFESTS / "gpu-labeller.yaml").read_text()) if o]
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
    assert out == ["deploy/manifests: 4 files up to date"]


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
