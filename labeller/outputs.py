"""Label outputs that need no cluster: text, JSON, YAML, NFD features.d; atomic file writes."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

FORMATS = ("text", "json", "yaml", "nfd")


def render(labels: Mapping[str, str], fmt: str, expiry: datetime | None = None) -> str:
    """Labels in one of FORMATS, keys sorted. ``expiry`` adds NFD's expiry-time directive."""
    ordered = dict(sorted(labels.items()))
    if fmt == "json":
        return json.dumps(ordered, indent=2) + "\n"
    if fmt == "yaml":
        import yaml  # only this format needs it

        return yaml.safe_dump(ordered, default_flow_style=False, sort_keys=True) if ordered else "{}\n"
    lines = [f"{key}={value}" for key, value in ordered.items()]
    if fmt == "nfd":
        header = ["# Written by gpu-labeller; NFD local source (features.d) format."]
        if expiry is not None:
            stamp = expiry.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            header.append(f"# +expiry-time={stamp}")
        lines = header + lines
    elif fmt != "text":
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return "\n".join(lines) + "\n" if lines else ""


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` so readers see the old file or the new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # NFD ignores dot-files, so the temporary file is invisible to it until the rename.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
