"""Every read of the host's files in ``vendors/`` goes through here: bounded, non-blocking, and
only of regular files.

A host root is outside our control (a wrong mount, a hand-made tree, a hostile container), so a
path where sysfs has an attribute may hold a FIFO, a device, a socket, a symlink loop or a huge
file. Reading any of those could hang the probe or exhaust memory. So a file is read only when
``stat`` says it is a regular file; it is opened with ``O_NONBLOCK | O_NOCTTY`` and checked again
with ``fstat`` (a FIFO swapped in between is never read); and no more than a limit is read.

Two outcomes are kept apart: a file that is *missing* is ``None`` (sysfs attributes come and go
with the hardware), while a file that *exists but cannot be trusted* raises ``Untrusted``, which
the backends turn into a reported problem, so that nothing is removed on its account.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from labeller.base.ownfiles import file_kind, read_at_most

# A sysfs attribute is at most one page (4 KiB); debugfs text such as amdgpu_firmware_info is a few KiB.
ATTRIBUTE_LIMIT = 64 * 1024
# PCI Express extended configuration space; sysfs serves 256 bytes for conventional PCI.
CONFIG_SPACE_LIMIT = 4096
# Text tables read from the host, such as libdrm's amdgpu.ids (about 25 KiB today).
TABLE_LIMIT = 1024 * 1024
# Entries in one directory listing: a large server lists a few thousand PCI functions.
ENTRY_LIMIT = 65536

_MISSING = (FileNotFoundError, NotADirectoryError)


class Untrusted(Exception):
    """A file or directory that exists but cannot be believed: not a regular file (or not a
    directory), larger than any real one, or failing to read. ``str()`` is one line naming the path."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def read_bytes(path: Path, limit: int = ATTRIBUTE_LIMIT) -> bytes | None:
    """The file's content; None when it does not exist; ``Untrusted`` when it is not a regular
    file, holds more than ``limit`` bytes, or cannot be read."""
    try:
        if not stat.S_ISREG(mode := os.stat(path).st_mode):  # follows symlinks; a loop raises ELOOP
            raise Untrusted(path, f"{file_kind(mode)}, not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except _MISSING:
        return None
    except OSError as exc:
        raise Untrusted(path, _reason(exc)) from None
    try:
        if not stat.S_ISREG(mode := os.fstat(fd).st_mode):  # replaced since the stat
            raise Untrusted(path, f"{file_kind(mode)}, not a regular file")
        data = read_at_most(fd, limit)  # sysfs may hand a file over in pieces
        if data is None:
            raise Untrusted(path, f"larger than {limit} bytes, more than any real one")
        return data
    except OSError as exc:
        raise Untrusted(path, _reason(exc)) from None
    finally:
        os.close(fd)


def read_text(path: Path, limit: int = ATTRIBUTE_LIMIT) -> str | None:
    """The stripped text of a file (bad bytes replaced); None when it does not exist."""
    data = read_bytes(path, limit)
    return None if data is None else data.decode(errors="replace").strip()


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


def list_dir(path: Path, limit: int = ENTRY_LIMIT) -> list[str] | None:
    """The sorted entry names of a directory; None when it does not exist; ``Untrusted`` when it is
    not a directory, cannot be listed, or holds more than ``limit`` entries."""
    names: list[str] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                names.append(entry.name)
                if len(names) > limit:
                    raise Untrusted(path, f"more than {limit} entries, more than any real one")
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise Untrusted(path, "not a directory") from None
    except OSError as exc:
        raise Untrusted(path, f"cannot list: {_reason(exc)}") from None
    return sorted(names)


def numa_node(value: int | None) -> int | None:
    """The kernel writes -1 for "no NUMA affinity"; model that as None."""
    return value if value is not None and value >= 0 else None
