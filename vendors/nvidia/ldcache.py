"""The host's dynamic linker cache, ``etc/ld.so.cache`` under the driver root, read as nvidia-ctk
reads it: where the driver's libraries are when they are not in a standard library directory. GKE
and other images install the driver under ``/usr/local/nvidia/lib64`` and list that directory in
``ld.so.conf`` (a real H200's machine did: tests/fixtures/nvidia/h200-passthrough/layout.txt).

The format is glibc's (``ldconfig`` 2.x writes "glibc-ld.so.cache1.1"; before glibc 2.32 it could
follow an old "ld.so-1.7.0" table): a header, fixed-size entries, then a string table; each entry's
key (the soname) and value (its path) are offsets from the start of the new header. Only 64-bit
libc6 entries (x86-64, aarch64) count, as nvidia-ctk's. A cache that is not that format, or whose
offsets point outside it, gives nothing: the standard directories are still searched. The DRA plugin
builds a claim's spec at every prepare, so a cache is parsed once per version of the file (ldconfig
replaces it whole), not per call.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from vendors.sysfs import Untrusted, read_bytes

CACHE = "etc/ld.so.cache"
CACHE_LIMIT = 16 << 20  # a real cache is tens to hundreds of KB
_NEW = b"glibc-ld.so.cache1.1"
_OLD = b"ld.so-1.7.0"
_HEADER = struct.Struct("<20sIIB3xI12x")  # magic and version, entries, string table length, flags, extension
_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, OS version, hwcap
_OLD_HEADER = struct.Struct("<11sxI")  # magic, entries
_OLD_ENTRY_SIZE = 12  # flags, key, value
_LIBC6 = 0x0003
_TYPE_MASK = 0x00FF
_ARCH_MASK = 0xFF00
_64_BIT = {0x0300, 0x0A00}  # x86-64, aarch64
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")


def _string(data: bytes, offset: int) -> str | None:
    end = data.find(b"\0", offset)
    return None if offset >= len(data) or end < 0 else data[offset:end].decode(errors="replace")


def _new_header_at(data: bytes) -> int | None:
    if data.startswith(_NEW):
        return 0
    if not data.startswith(_OLD) or len(data) < _OLD_HEADER.size:
        return None
    _, old_entries = _OLD_HEADER.unpack_from(data)
    offset = _OLD_HEADER.size + old_entries * _OLD_ENTRY_SIZE
    offset += -offset % 8  # glibc aligns the new header as its 64-bit fields need
    return offset if data[offset:offset + len(_NEW)] == _NEW else None


def libraries(data: bytes) -> list[tuple[str, str]]:
    """(soname, path) of every 64-bit libc6 entry, in the cache's order; [] for anything else."""
    start = _new_header_at(data)
    if start is None or len(data) < start + _HEADER.size:
        return []
    _, entries, _, _, _ = _HEADER.unpack_from(data, start)
    first = start + _HEADER.size
    if first + entries * _ENTRY.size > len(data):
        return []
    table = data[start:]
    found = []
    for index in range(entries):
        flags, key, value, _, _ = _ENTRY.unpack_from(data, first + index * _ENTRY.size)
        if flags & _TYPE_MASK != _LIBC6 or flags & _ARCH_MASK not in _64_BIT:
            continue
        name, path = _string(table, key), _string(table, value)
        if name is None or path is None:
            return []  # an offset outside the cache: not one ldconfig wrote
        found.append((name, path))
    return found


_parsed: dict[Path, tuple[tuple[int, int, int, int], tuple[str, ...]]] = {}  # cache path -> (its stat, dirs)


def driver_library_dirs(driver_base: Path) -> list[str]:
    """The directories (relative to the driver root) the cache under ``driver_base`` lists the
    driver's libraries in, in its order; [] without a cache or with one that cannot be trusted."""
    path = driver_base / CACHE
    try:
        found = os.stat(path)
    except OSError:
        return []
    version = (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)
    known = _parsed.get(path)
    if known is None or known[0] != version:
        known = _parsed[path] = (version, _driver_dirs(path))
    return list(known[1])


def _driver_dirs(path: Path) -> tuple[str, ...]:
    try:
        data = read_bytes(path, CACHE_LIMIT)
    except Untrusted:
        return ()
    dirs: list[str] = []
    for name, library in libraries(data or b""):
        directory = str(Path(library).parent).lstrip("/")
        if name.startswith(DRIVER_LIBRARIES) and library.startswith("/") and ".." not in Path(library).parts \
                and directory not in dirs:
            dirs.append(directory)
    return tuple(dirs)
