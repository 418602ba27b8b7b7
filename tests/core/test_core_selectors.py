"""Label selectors and node affinity as the scheduler reads them; ``gpu-labeller match`` on the
built-in profiles and on profile files; ``labels --format selector|affinity`` snippets that parse
as YAML and select the node they were printed for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from labeller.host.snippets import snippet
from labeller.host.selectors import Requirement, SelectorError, parse_selector, selector_from_document
from tests.core.cli import error_line, in_process
from vendors.simulate import builtin_profiles

NODE = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "8"}


@pytest.mark.parametrize(("text", "matches"), [
    ("nvidia.com/gpu.present=true", True),
    ("nvidia.com/gpu.present==true", True),
    ("nvidia.com/gpu.product!=Tesla-T4", True),
    ("amd.com/gpu.family!=AI", True),  # != matches a node without the key
    ("nvidia.com/gpu.product in (Tesla-T4, NVIDIA-H100-80GB-HBM3)", True),
    ("nvidia.com/gpu.product notin (Tesla-T4,NVIDIA-H100-80GB-HBM3)", False),
    ("amd.com/gpu.present notin (true)", True),
    ("nvidia.com/gpu.present", True),
    ("!nvidia.com/gpu.present", False),
    ("!amd.com/gpu.present", True),
    ("nvidia.com/gpu.memory>81558,nvidia.com/gpu.count<9", True),
    ("nvidia.com/gpu.memory>81559", False),
    ("nvidia.com/gpu.product>3", False),  # not an integer
    (" nvidia.com/gpu.present = true , nvidia.com/gpu.count in (8) ", True),
    ("", True),
])
def test_selector_semantics(text: str, matches: bool) -> None:
    assert parse_selector(text).evaluate(NODE).matched is matches


@pytest.mark.parametrize(("text", "problem"), [
    ("nvidia.com/gpu.product in (a", "at character 29: expected ',' or ')', found the end"),
    ("nvidia.com/gpu.product in a", "expected '(' after in"),
    ("nvidia.com/gpu.product=bad value", "expected ',' or the end"),
    ("-bad=1", "name part must be alphanumeric"),
    ("k=" + "x" * 64, "not a valid label value"),
    ("k in ()", "in needs at least one value"),
    ("k>x", "expected an integer"),
    ("a=1,,b=2", "expected a label key"),
])
def test_selector_errors_name_the_place(text: str, problem: str) -> None:
    with pytest.raises(SelectorError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_selector(text)


def affinity(*terms: list[dict[str, object]], node_selector: dict[str, str] | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return spec


def test_affinity_terms_are_ored_and_expressions_anded() -> None:
    t4 = [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}]
    big = [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]},
           {"key": "amd.com/gpu.present", "operator": "DoesNotExist"}]
    selector = selector_from_document(affinity(t4, big), "f")
    outcome = selector.evaluate(NODE)
    assert outcome.matched and outcome.term == 1
    assert not selector_from_document(affinity(t4), "f").evaluate(NODE).matched
    assert not selector_from_document(affinity(big, node_selector={"x/y": "z"}), "f").evaluate(NODE).matched
    pod = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"spec": affinity(big)}}}
    assert selector_from_document(pod, "f").evaluate(NODE).matched
    assert selector_from_document({"nvidia.com/gpu.present": True}, "f").evaluate(NODE).matched
    by_name = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
    assert selector_from_document(by_name, "f").evaluate(NODE, "n1").matched
    assert not selector_from_document(by_name, "f").evaluate(NODE, "n2").matched


@pytest.mark.parametrize(("expression", "problem"), [
    ({"key": "k", "operator": "Gt", "values": ["1", "2"]}, "Gt takes exactly one integer value"),
    ({"key": "k", "operator": "Lt", "values": ["x"]}, "Lt takes exactly one integer value"),
    ({"key": "k", "operator": "Exists", "values": ["x"]}, "Exists takes no values"),
    ({"key": "k", "operator": "In"}, "In needs at least one value"),
    ({"key": "k", "operator": "Equals", "values": ["x"]}, "'Equals' is not one of In, NotIn"),
    ({"key": "k", "operator": "In", "values": ["x"], "value": "y"}, "unknown field 'value'"),
])
def test_affinity_errors_name_the_expression(expression: dict[str, object], problem: str) -> None:
    with pytest.raises(SelectorError, match=f"f: nodeSelectorTerms\\[0\\].matchExpressions\\[0\\].*{problem}"):
        selector_from_document(affinity([expression]), "f")


def test_requirement_text_round_trips() -> None:
    for text in ("a=1", "a!=1", "a in (1,2)", "a notin (1,2)", "a", "!a", "a>3", "a<3"):
        [requirement] = parse_selector(text).terms[0].requirements
        assert isinstance(requirement, Requirement) and requirement.text() == text


# --- the command --------------------------------------------------------------------------------

def test_match_the_near_miss_names_the_closest_existing_value() -> None:
    result = in_process("match", "nvidia.com/gpu.product=NVIDIA-H100-80GB")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert ("near   dgx-h100: nvidia.com/gpu.product=NVIDIA-H100-80GB: has "
            "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3") in lines
    assert ("no target has nvidia.com/gpu.product=NVIDIA-H100-80GB; closest existing value: "
            "NVIDIA-H100-80GB-HBM3") in lines
    assert lines[-1].startswith(f"0 of {len(builtin_profiles())} profiles match")
    # Labelling every profile for one answer logs nothing (l40s-x4-mps alone logs why MPS is not served).
    assert result.stderr == ""


def test_match_lists_every_matching_profile_and_exits_0() -> None:
    result = in_process("match", "amd.com/gpu.present=true,nvidia.com/gpu.present")
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("match")] == ["match  mixed-l40s-mi210"]


def test_match_a_typo_in_the_key_suggests_the_key() -> None:
    result = in_process("match", "nvidia.com/gpu.prodcut=Tesla-T4", "--simulate", "t4-time-slicing")
    assert result.returncode == 1
    assert "closest existing key: nvidia.com/gpu.product" in result.stdout


def test_match_an_affinity_file_against_given_profiles(tmp_path: Path) -> None:
    big = [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]}]
    amd = [{"key": "amd.com/gpu.cu-count", "operator": "Gt", "values": ["100"]}]
    path = tmp_path / "affinity.json"
    path.write_text(json.dumps(affinity(big, amd)))
    result = in_process("match", "--affinity", str(path), "--simulate", "t4-time-slicing", "--simulate", "dgx-h100",
                          "--simulate", "mi300x-x8-spx", "-v")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "match  dgx-h100 (term 1)" in lines and "match  mi300x-x8-spx (term 2)" in lines
    assert any(line.startswith("near   t4-time-slicing (term 1): nvidia.com/gpu.memory>40000: has "
                               "nvidia.com/gpu.memory=15109") for line in lines)


def test_match_on_a_profiles_dir(tmp_path: Path) -> None:
    source = Path(__file__).resolve().parents[2] / "vendors/profiles/t4-time-slicing.yaml"
    (tmp_path / "mine.yaml").write_text(source.read_text())
    result = in_process("match", "nvidia.com/gpu.product=Tesla-T4-SHARED", "--profiles-dir", str(tmp_path))
    assert result.returncode == 0 and result.stdout.splitlines()[0] == "match  mine", result.stdout


def test_affinity_with_min_memory_on_a_node_with_amd_and_nvidia_says_the_amd_gpus_go_by_model() -> None:
    """The minimum applies to NVIDIA's numeric gpu.memory; the AMD GPUs stay selected by model, and a
    comment line says so (AMD's vram is text, which Gt cannot compare)."""
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-L40S",
              "nvidia.com/gpu.memory": "46068",
              "amd.com/gpu.present": "true", "amd.com/gpu.product-name": "AMD_Instinct_MI210"}
    text = snippet(labels, "affinity", min_memory=40000)
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert len(comments) == 1 and "AMD" in comments[0] and "amd.com/gpu.product-name" in comments[0], text
    assert "--min-memory" in comments[0] and "nvidia.com/gpu.memory" in comments[0]
    [term] = yaml.safe_load(text)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert ({"key": "amd.com/gpu.product-name", "operator": "In", "values": ["AMD_Instinct_MI210"]}
            in term["matchExpressions"])
    assert {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["39999"]} in term["matchExpressions"]


@pytest.mark.parametrize(("args", "problem"), [
    (["nvidia.com/gpu.product in (a"], "expected ',' or ')'"),
    ([], "give a SELECTOR"),
    (["--affinity", "/nonexistent.yaml"], "/nonexistent.yaml: cannot read node affinity file"),
    (["a", "--simulate", "no-such-profile"], "no-such-profile"),
    (["a", "--simulate", "dgx-h100", "--kubeconfig", "k"], "not both"),
])
def test_match_bad_input_is_one_line_and_exit_2(args: list[str], problem: str) -> None:
    result = in_process("match", *args)
    assert result.returncode == 2
    assert problem in error_line(result)


# --- snippets -----------------------------------------------------------------------------------

@pytest.mark.parametrize("profile", ["dgx-h100", "t4-time-slicing", "mi300x-x8-spx", "mixed-l40s-mi210",
                                     "a100-mig-single", "rx7900xtx"])
@pytest.mark.parametrize("fmt", ["selector", "affinity"])
def test_snippets_are_yaml_that_selects_the_node_they_came_from(tmp_path: Path, profile: str, fmt: str) -> None:
    result = in_process("labels", "--simulate", profile, "--format", fmt)
    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    assert list(document) == (["nodeSelector"] if fmt == "selector" else ["affinity"])
    labels = json.loads(in_process("labels", "--simulate", profile, "--format", "json").stdout)
    assert selector_from_document(document, "snippet").evaluate(labels).matched
    path = tmp_path / "snippet.yaml"
    path.write_text(result.stdout)
    matched = in_process("match", "--affinity", str(path), "--simulate", profile)
    assert matched.returncode == 0 and matched.stdout.startswith(f"match  {profile}")


def test_affinity_with_min_memory_uses_gt_min_minus_one() -> None:
    result = in_process("labels", "--simulate", "dgx-h100", "--format", "affinity", "--min-memory", "40000")
    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    [term] = document["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["39999"]} in term["matchExpressions"]
    assert all(e["key"] != "nvidia.com/gpu.product" for e in term["matchExpressions"])
    selector = selector_from_document(document, "s")
    assert selector.evaluate({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.memory": "40000"}).matched
    assert not selector.evaluate({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.memory": "39999"}).matched


@pytest.mark.parametrize(("args", "problem"), [
    (["--simulate", "t4-time-slicing", "--format", "affinity", "--min-memory", "40000"], "less than --min-memory"),
    (["--simulate", "dgx-h100", "--format", "selector", "--min-memory", "1"], "--min-memory needs --format affinity"),
    (["--simulate", "mi210-x8", "--format", "affinity", "--min-memory", "1"], "--min-memory needs"),
])
def test_snippet_bad_input(args: list[str], problem: str) -> None:
    result = in_process("labels", *args)
    assert result.returncode == 2 and problem in error_line(result)


# --- the selector guide, docs/selectors.md -------------------------------------------------------------------------

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "selectors.md"


def guide() -> str:
    return GUIDE.read_text()


def all_profile_labels() -> dict[str, dict[str, str]]:
    from labeller.host.machine import NodeOptions, open_host
    from vendors.simulate import builtin_profiles

    out = {}
    for name in builtin_profiles():
        with open_host(NodeOptions(simulate=name)) as node:
            inventory = node.probe()
            out[name] = node.labels(inventory, node.offer(inventory)).labels
    return out


def test_every_example_of_the_selector_guide_selects_a_builtin_profile() -> None:
    import re

    labels = all_profile_labels()
    blocks = re.findall(r"```yaml\n(.*?)```", guide(), re.S)
    selectors = re.findall(r"gpu-labeller match '([^']+)'", guide())
    assert len(blocks) >= 4 and len(selectors) >= 3
    for block in blocks:
        selector = selector_from_document(yaml.safe_load(block), "docs/selectors.md")
        assert any(selector.evaluate(node).matched for node in labels.values()), block
    for text in selectors:
        assert any(parse_selector(text).evaluate(node).matched for node in labels.values()), text
    mixed = selector_from_document(yaml.safe_load(blocks[-1]), "docs/selectors.md")
    assert mixed.evaluate(labels["mixed-l40s-mi210"]).matched and mixed.evaluate(labels["mi300x-x8-spx"]).matched


def test_match_labels_the_profiles_with_the_config_given(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                      "      - {name: nvidia.com/gpu, replicas: 4}\n")
    shared = in_process("match", "nvidia.com/gpu.replicas=4", "--simulate", "dgx-h100", "--config", str(config))
    assert shared.returncode == 0 and shared.stdout.startswith("match  dgx-h100"), shared.stdout
    whole = in_process("match", "nvidia.com/gpu.replicas=4", "--simulate", "dgx-h100")
    assert whole.returncode == 1
