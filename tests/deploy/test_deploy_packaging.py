"""Packaging: the license is declared as SPDX, shipped in full, and a wheel built from the tree carries it."""

from __future__ import annotations

import email.parser
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

from tests.deploy import ROOT
from tests.deploy.test_deploy_dockerfile import instructions

# The section headings of the Apache License 2.0, in order: the whole text, not a summary.
APACHE_SECTIONS = ["Definitions", "Grant of Copyright License", "Grant of Patent License", "Redistribution",
                   "Submission of Contributions", "Trademarks", "Disclaimer of Warranty", "Limitation of Liability",
                   "Accepting Warranty or Additional Liability"]


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_with_its_file() -> None:
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]  # PEP 639 forbids both


def test_license_file_holds_the_whole_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert re.search(r"Apache License\s+Version 2\.0, January 2004", text)
    headings = re.findall(r"^\s+(\d)\. ([^.]+)\.", text, flags=re.MULTILINE)
    assert headings == [(str(n), title) for n, title in enumerate(APACHE_SECTIONS, start=1)]
    assert "END OF TERMS AND CONDITIONS" in text


def test_build_backend_is_bounded_and_new_enough_for_spdx_licenses() -> None:
    (requirement,) = [Requirement(r) for r in pyproject()["build-system"]["requires"]]
    assert requirement.name == "setuptools"
    assert not requirement.specifier.contains(Version("76.9"))  # the SPDX `license` string needs >= 77
    assert requirement.specifier.contains(Version("77.0"))
    assert any(spec.operator in ("<", "<=") for spec in requirement.specifier)  # a future major cannot break builds


def test_wheel_metadata_carries_the_license_expression(tmp_path: Path) -> None:
    # Build from a copy of what the image build copies, so the worktree gets no build/ or egg-info.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for package in ("labeller", "vendors"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    # No build isolation: the test runs offline, with the setuptools of this environment.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "--wheel-dir", str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("gpu_labeller-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        dist_info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
        shipped = archive.read(f"{dist_info}/licenses/LICENSE").decode()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert shipped == (ROOT / "LICENSE").read_text()


def test_image_build_copies_the_license_the_wheel_needs() -> None:
    copied = [arg for keyword, rest in instructions() if keyword == "COPY" and not rest.startswith("--from")
              for arg in rest.split()[:-1]]
    assert set(pyproject()["project"]["license-files"]) <= set(copied)
