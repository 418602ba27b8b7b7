"""Dry-run output formats and atomic writes."""

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from labeller.base.outputs import render, write_atomic

LABELS = {"nvidia.com/gpu.product": "Tesla-T4", "amd.com/gpu.cu-count": "104"}


def test_text_is_sorted_key_value_lines() -> None:
    assert render(LABELS, "text") == "amd.com/gpu.cu-count=104\nnvidia.com/gpu.product=Tesla-T4\n"


def test_json_and_yaml_round_trip() -> None:
    assert json.loads(render(LABELS, "json")) == LABELS
    assert yaml.safe_load(render(LABELS, "yaml")) == LABELS
    assert yaml.safe_load(render({}, "yaml")) == {}


def test_nfd_features_file_has_expiry_directive() -> None:
    text = render(LABELS, "nfd", expiry=datetime(2026, 11, 22, 10, 0, tzinfo=UTC))
    lines = text.splitlines()
    assert "# +expiry-time=2026-11-22T10:00:00Z" in lines
    assert [line for line in lines if not line.startswith("#")] == [
        "amd.com/gpu.cu-count=104", "nvidia.com/gpu.product=Tesla-T4"]


def test_atomic_write_replaces_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    target = tmp_path / "features.d" / "gpu-labeller"
    write_atomic(target, "a=1\n")
    write_atomic(target, "a=2\n")
    assert target.read_text() == "a=2\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["gpu-labeller"]
    assert target.stat().st_mode & 0o777 == 0o644


def test_the_features_file_sink_keeps_its_symlink_and_may_create_its_directory(tmp_path: Path) -> None:
    # The daemon writes NFD's features.d file with the defaults: a symlinked file is followed, not
    # replaced, and a missing features.d directory is created (NFD may not have made it yet).
    real = tmp_path / "shared" / "gpu-labeller"
    link = tmp_path / "features.d" / "gpu-labeller"
    write_atomic(real, "a=1\n")
    link.parent.mkdir()
    link.symlink_to(real)
    write_atomic(link, "a=2\n")
    assert link.is_symlink() and real.read_text() == "a=2\n"
    assert sorted(p.name for p in real.parent.iterdir()) == ["gpu-labeller"]


def test_a_missing_directory_is_refused_when_the_caller_says_so(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "labels.txt"
    with pytest.raises(FileNotFoundError, match="directory .*missing does not exist"):
        write_atomic(target, "a=1\n", make_parents=False)
    assert not target.parent.exists()
