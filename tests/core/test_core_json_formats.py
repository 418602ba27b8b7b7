"""``--format json`` of ``match`` and ``profiles`` (``cleanup``'s: tests/daemon/test_daemon_upstream.py):
stable keys, and the default text output unchanged."""

from __future__ import annotations

import json

from click.testing import CliRunner

from labeller.cli.root import main
from vendors.simulate import builtin_profiles


def test_profiles_json_lists_each_profile_with_its_description() -> None:
    text = CliRunner().invoke(main, ["profiles"])
    result = CliRunner().invoke(main, ["profiles", "--format", "json"])
    assert result.exit_code == 0 and text.exit_code == 0
    document = json.loads(result.stdout)
    assert document == [{"name": name, "description": description} for name, description in builtin_profiles().items()]
    assert text.stdout.splitlines()[0].split()[0] == document[0]["name"]


def test_match_json_has_every_target_with_why_it_fails() -> None:
    selector = "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM"  # one letter short of the DGX H100's product
    text = CliRunner().invoke(main, ["match", selector])
    result = CliRunner().invoke(main, ["match", selector, "--format", "json"])
    assert result.exit_code == text.exit_code == 1  # nothing matches
    document = json.loads(result.stdout)
    assert set(document) == {"targets", "matched", "total", "terms", "results", "hints"}
    assert (document["targets"], document["matched"], document["terms"]) == ("profiles", 0, 1)
    assert document["total"] == len(builtin_profiles()) == len(document["results"])
    near = next(r for r in document["results"] if r["name"] == "dgx-h100")
    assert near == {"name": "dgx-h100", "match": False, "term": 1, "near": True, "reasons": [
        f"{selector}: has nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"]}
    assert document["hints"] == [f"no target has {selector}; closest existing value: NVIDIA-H100-80GB-HBM3"]
    assert "near   dgx-h100: " in text.stdout and text.stdout.splitlines()[-1].startswith("0 of ")


def test_match_json_of_a_match_exits_0() -> None:
    result = CliRunner().invoke(main, ["match", "amd.com/gpu.present=true", "--simulate", "mi210-x8",
                                       "--simulate", "dgx-h100", "--format", "json"])
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert [(r["name"], r["match"], r["reasons"]) for r in document["results"]] == [
        ("mi210-x8", True, []),
        ("dgx-h100", False, ["amd.com/gpu.present=true: no label amd.com/gpu.present (closest existing key: "
                             "nvidia.com/gpu.present)"])]
    assert document["hints"] == [] and document["matched"] == 1
