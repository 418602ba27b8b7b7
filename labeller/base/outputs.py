"""Label outputs that need no cluster: text, JSON, YAML, NFD features.d; safe file writes."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
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
            stamp = expiry.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            header.append(f"# +expiry-time={stamp}")
        lines = header + lines
    elif fmt != "text":
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return "\n".join(lines) + "\n" if lines else ""


def write_atomic(path: Path, text: str, mode: int = 0o644, *, make_parents: bool = True, durable: bool = True) -> None:
    """Write ``text`` to ``path`` without destroying anything that lives there.

    - A regular file (or a new one) is replaced atomically: a temporary file in the same directory,
      then a rename, so readers see the old content or the new, never a torn file. An existing
      file keeps its permission bits; a new one gets ``mode``.
    - A symlink is followed: its target gets the new content and the link stays a link.
    - Anything else (a character device such as /dev/null, a FIFO, /dev/stdout) is written through,
      appending, never replaced.
    - A missing parent directory is created with ``make_parents``, else FileNotFoundError.
    - ``durable``: the data reaches the disk (fsync) before the rename. Without it a process that
      dies at any moment still leaves the old content or the new (the page cache has it); only a
      machine that loses power may find the new file empty.
    """
    if _writes_through(path):
        with open(path, "a", encoding="utf-8") as stream:
            stream.write(text)
        return
    target = _final_target(path)
    if not target.parent.is_dir():
        if not make_parents:
            raise FileNotFoundError(errno.ENOENT, f"directory {target.parent} does not exist", str(path))
        target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        pass
    # NFD ignores dot-files, so the temporary file is invisible to it until the rename.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# /proc/<pid>/fd (and /proc/<pid>/task/<tid>/fd): where /dev/stdout, /dev/fd/N and /proc/self/fd/N lead.
_DESCRIPTOR_DIR = re.compile(r"/proc/\d+(/task/\d+)?/fd")


def _writes_through(path: Path) -> bool:
    """True when ``path`` must be written in place: not a regular file, or an open descriptor's name.

    /dev/stdout redirected to a file (``> out`` or ``>> log``) leads to a regular file, but the shell
    opened it for us: replacing that file would lose what ``>>`` appended before."""
    try:
        kind = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(kind):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    return not stat.S_ISREG(kind) or _names_a_descriptor(path)


def _names_a_descriptor(path: Path) -> bool:
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on symlinks followed in one lookup
        if _DESCRIPTOR_DIR.fullmatch(os.path.realpath(os.path.dirname(current))):
            return True
        if not os.path.islink(current):
            return False
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    return False


def _final_target(path: Path) -> Path:
    """Where ``path`` leads after every symlink, also when that file does not exist yet."""
    target = Path(os.path.realpath(path))
    if target.is_symlink():  # realpath gives up on a loop
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
    return target
