"""Small, forgiving readers for sysfs-style files (one value per file, or ``key value`` lines)."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """The stripped content of a file, or None when it is missing or unreadable."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def read_int(path: Path, base: int = 0) -> int | None:
    """An integer file ("0x10de", "12", "-1"); None when missing or not a number."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def read_properties(path: Path) -> dict[str, int] | None:
    """A KFD ``properties`` file: ``key value`` lines with integer values. Bad lines are skipped."""
    text = read_text(path)
    if text is None:
        return None
    props: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                props[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return props


def numa_node(value: int | None) -> int | None:
    """The kernel writes -1 for "no NUMA affinity"; model that as None."""
    return value if value is not None and value >= 0 else None
