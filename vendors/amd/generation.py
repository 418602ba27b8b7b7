"""The KFD topology's stamp, read once a second by the health poll: it must cost next to nothing.

amdkfd bumps ``topology/generation_id`` whenever a topology node comes or goes (a partition mode
change, a reset, a GPU added or removed), and sysfs tells no one (no inotify, no ``sysfs_notify``),
so it is polled. Opening, checking and closing the file each time, through ``Path`` objects, cost
about 200 microseconds of a cold interpreter a second; this keeps the file open and re-reads it in
place (sysfs renders an attribute again on each read at offset 0): one ``stat`` (the same file is
still there: a driver reload or a hand-made tree can replace it) and one ``pread``. On a tree
without the file (a capture that left it out) the stamp is the ``stat`` of the topology's nodes
directory.
"""

from __future__ import annotations

import functools
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from labeller.base.ownfiles import file_kind
from vendors.amd.facts import KFD_TOPOLOGY_DIRS
from vendors.sysfs import Untrusted

_READ_LIMIT = 64  # a decimal counter and a newline


class TopologyStamp:
    """``read()``: the generation's bytes, the nodes directory's stat where there is no generation, an
    ``Untrusted`` reason as text, or None (no KFD topology: a node without AMD GPUs)."""

    def __init__(self, host_root: Path):
        self._topologies = tuple(str(host_root / relative) for relative in KFD_TOPOLOGY_DIRS)
        self._lock = threading.Lock()  # the health poll and the plugin's loop may read at once
        self._fd: int | None = None
        self._held: tuple[str, int, int] | None = None  # path, st_dev, st_ino of the open file

    def read(self) -> object:
        with self._lock:
            try:
                return self._read()
            except Untrusted as exc:
                self._close()
                return str(exc)

    def _read(self) -> object:
        for topology in self._topologies:
            path = topology + "/generation_id"
            try:
                st = os.stat(path)  # follows symlinks; a loop raises ELOOP
            except (FileNotFoundError, NotADirectoryError):
                nodes = self._nodes_stamp(topology + "/nodes")
                if nodes is None:
                    continue
                return nodes
            except OSError as exc:
                raise Untrusted(Path(path), exc.strerror or type(exc).__name__) from None
            if self._held != (path, st.st_dev, st.st_ino):
                self._open(path, st)
            assert self._fd is not None
            try:
                data = os.pread(self._fd, _READ_LIMIT + 1, 0)
            except OSError as exc:  # ENODEV: the driver removed the attribute under us
                raise Untrusted(Path(path), exc.strerror or type(exc).__name__) from None
            if len(data) > _READ_LIMIT:
                raise Untrusted(Path(path), f"larger than {_READ_LIMIT} bytes, more than any real one")
            return data
        self._close()
        return None

    @staticmethod
    def _nodes_stamp(path: str) -> object:
        """Without a ``generation_id``: the nodes directory's change time and link count (one more
        or one fewer subdirectory moves both, on sysfs and on a plain tree); None when it is missing."""
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise Untrusted(Path(path), exc.strerror or type(exc).__name__) from None
        if not stat.S_ISDIR(st.st_mode):
            raise Untrusted(Path(path), f"{file_kind(st.st_mode)}, not a directory")
        return (st.st_ino, st.st_mtime_ns, st.st_nlink)

    def _open(self, path: str, st: os.stat_result) -> None:
        self._close()
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(Path(path), f"{file_kind(st.st_mode)}, not a regular file")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            raise Untrusted(Path(path), exc.strerror or type(exc).__name__) from None
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):  # replaced since the stat
            os.close(fd)
            raise Untrusted(Path(path), f"{file_kind(opened.st_mode)}, not a regular file")
        self._fd, self._held = fd, (path, opened.st_dev, opened.st_ino)

    def __del__(self, close_fd: Callable[[int], None] = os.close) -> None:
        # Dropped from topology_stamp's cache (a process reading many host roots), or collected at
        # interpreter exit, when this module's globals may already be None: os.close is bound here.
        fd = getattr(self, "_fd", None)
        if fd is not None:
            close_fd(fd)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._held = None, None


@functools.lru_cache(maxsize=4)
def topology_stamp(host_root: Path) -> TopologyStamp:
    """The one stamp reader of ``host_root`` (the process reads one host root)."""
    return TopologyStamp(host_root)


def topology_generation(host_root: Path) -> object:
    """``Discovery.changes`` for AMD: a cheap stamp of the KFD topology (``TopologyStamp``)."""
    return topology_stamp(host_root).read()
