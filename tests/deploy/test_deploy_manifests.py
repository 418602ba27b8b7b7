"""deploy/manifests/ is the chart rendered by deploy/render.py, and valid on its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils as kv

from tests.deploy import KUBE_VERSIONS, MANIFESTS, load_render_script

REGEN = "python deploy/render.py"


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


@pytest.mark.slow
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_plain_manifests_are_valid_kubernetes(kube_version: str) -> None:
    kinds = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                kv.validate(obj, kube_version, strict=True)
                kinds.append(obj["kind"])
    # Namespace first so that one `kubectl apply -f` creates everything in order.
    assert kinds[0] == "Namespace"
    assert {"DaemonSet", "ClusterRole", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= set(kinds)


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
