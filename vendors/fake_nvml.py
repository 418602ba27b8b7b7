"""A fake ``pynvml`` module that replays a profile's NVML values. PLACEHOLDER: being written."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any


def build(section: Any, root: Path) -> ModuleType:
    raise ValueError("nvidia: NVIDIA simulation not written yet")
