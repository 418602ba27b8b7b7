"""Simulated AMD sysfs trees for profiles. PLACEHOLDER: being written."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build(section: Any, root: Path, base_dir: Path) -> None:
    raise ValueError("amd: AMD simulation not written yet")
