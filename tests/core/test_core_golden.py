"""Every built-in profile's dry-run output, as users see it, held against a reviewed copy.

Restructuring the code must not change what a user sees: labels (text and NFD), the device
plugin's resources, the DRA plugin's ResourceSlices and the probe's inventory, for each built-in
profile. When a change is meant to change them, regenerate with
``GOLDEN_UPDATE=1 python -m pytest tests/core/test_core_golden.py`` and review the diff of
``tests/fixtures/golden/`` like code.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from labeller.cli.root import main
from vendors.simulate import builtin_profiles

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
COMMANDS = {
    "labels.txt": ["labels"],
    "labels.nfd": ["labels", "--format", "nfd"],
    "resources.json": ["resources", "--format", "json"],
    "resources.txt": ["resources"],
    "probe.json": ["probe"],
    # the slices a node would publish once DRA serves every vendor (by default it serves none)
    "resourceslices.yaml": ["resourceslices", "--format", "yaml", "--dra-vendors", "all", "--node-name", "gpu-node"],
}


@pytest.mark.parametrize("output", sorted(COMMANDS))
@pytest.mark.parametrize("profile", sorted(builtin_profiles()))
def test_dry_run_output_is_unchanged(profile: str, output: str) -> None:
    result = CliRunner().invoke(main, ["--log-level", "error", *COMMANDS[output], "--simulate", profile])
    assert result.exit_code == 0, result.output
    path = GOLDEN / profile / output
    if os.environ.get("GOLDEN_UPDATE"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result.output)
    assert result.output == path.read_text()


def test_every_profile_has_its_golden_outputs() -> None:
    """A profile added without reviewed outputs, or outputs of a profile that is gone, fail here."""
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(builtin_profiles())
