"""Linux inotify through libc (ctypes): being told that a directory's entries changed, instead of
looking at them again and again.

``DirectoryWatch`` calls ``changed()``, on a thread of its own that sleeps until the kernel has
something to say, when an entry of one of its directories is created, deleted, renamed in or out,
written and closed, or has its attributes changed, and when a directory itself goes. It is a hint,
not a report: the caller looks again at what it cares about (cheaply: a ``stat``), so one that
reads a burst of events at once, or an event about a neighbour, costs nothing but that look. A
directory that does not exist (yet, or any more: a kubelet restarting, a ConfigMap volume
remounted) is watched through its nearest existing parent, and watched itself again as soon as it
is back; one replaced by another at the same path is followed to the new one.

inotify does not see changes the kernel makes to sysfs attributes or procfs, nor on some network
file systems; those are still read on a schedule by their users. ``available`` is False where
inotify cannot be used at all (no libc symbol, ``fs.inotify.max_user_instances`` reached), and
``complete`` False while a directory could not be watched (``max_user_watches``): the caller then
polls as it would without a watch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from labeller.base.log import get_logger

log = get_logger(__name__)

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# What a directory's watch reports: its entries coming, going and being rewritten, and itself going.
DIRECTORY_EVENTS = (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB
                    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then len bytes of name)
_READ_BYTES = 64 * 1024
_RESOLVE_TRIES = 8  # directories made and removed faster than this many passes: the next event resolves again


class _Libc:
    """inotify_init1, inotify_add_watch and inotify_rm_watch from the C library; OSError when it has none."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        try:
            self.init1, self.add_watch = libc.inotify_init1, libc.inotify_add_watch
            self.rm_watch = libc.inotify_rm_watch
        except AttributeError:
            raise OSError(errno.ENOSYS, "this C library has no inotify") from None
        self.init1.argtypes, self.init1.restype = [ctypes.c_int], ctypes.c_int
        self.add_watch.argtypes, self.add_watch.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
        self.rm_watch.argtypes, self.rm_watch.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int


def _checked(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class Inotify:
    """One inotify instance: ``add`` a watch, ``remove`` it, ``read`` what happened (non-blocking)."""

    def __init__(self) -> None:
        self._libc = _Libc()
        self.fd = _checked(self._libc.init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")

    def add(self, path: Path, mask: int = DIRECTORY_EVENTS) -> int:
        """The watch descriptor of ``path`` (the same one again for a path already watched)."""
        return _checked(self._libc.add_watch(self.fd, os.fsencode(path), mask), f"{path}")

    def remove(self, wd: int) -> None:
        self._libc.rm_watch(self.fd, wd)  # a watch the kernel already dropped (IN_IGNORED) is no error

    def read(self) -> list[tuple[int, int, str]]:
        """Every event queued now, as (watch descriptor, mask, name); [] when none."""
        try:
            data = os.read(self.fd, _READ_BYTES)
        except BlockingIOError:
            return []
        events, offset = [], 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0")
            events.append((wd, mask, os.fsdecode(name)))
            offset += _EVENT.size + length
        return events

    def close(self) -> None:
        os.close(self.fd)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if os.path.isdir(path) else None


def _nearest_directory(path: Path) -> Path:
    while _identity(path) is None and path.parent != path:
        path = path.parent
    return path


class DirectoryWatch:
    """See the module docstring. ``watch(directories)`` says what to watch from now on (any thread);
    ``close`` ends the thread."""

    def __init__(self, changed: Callable[[], None], name: str = "inotify") -> None:
        self.changed, self.name = changed, name
        self.complete = True
        self._lock = threading.Lock()
        self._wanted: tuple[Path, ...] = ()
        self._watched: dict[Path, tuple[int, tuple[int, int] | None]] = {}  # path -> (wd, the directory watched)
        self._thread: threading.Thread | None = None
        try:
            self._inotify: Inotify | None = Inotify()
        except OSError as exc:
            log.warning("inotify unavailable; looking at files on a schedule instead", reason="no-inotify",
                        error=str(exc))
            self._inotify = None
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC) if self._inotify is not None else (-1, -1)

    @property
    def available(self) -> bool:
        return self._inotify is not None

    @property
    def watching(self) -> bool:
        """Every directory asked for (or its nearest parent) is watched: no need to poll them."""
        return self.available and self.complete

    def watch(self, directories: Iterable[Path]) -> None:
        with self._lock:
            self._wanted = tuple(dict.fromkeys(Path(d) for d in directories))
            self._resolve()
        if self._inotify is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _resolve(self) -> None:
        """Watch the nearest existing directory of each wanted one (the lock held). A directory made
        while its parent's watch was being added sends no event to that watch: look again until what
        is watched is still the nearest (a kubelet restarting makes its registry again at once)."""
        for _ in range(_RESOLVE_TRIES):
            wanted = self._resolve_once()
            if wanted is None or wanted == {_nearest_directory(path) for path in self._wanted}:
                return

    def _resolve_once(self) -> set[Path] | None:
        """One pass of ``_resolve``: the directories it watched, None without inotify."""
        inotify = self._inotify
        if inotify is None:
            return None
        wanted = {_nearest_directory(path) for path in self._wanted}
        for path in list(self._watched):
            wd, identity = self._watched[path]
            if path not in wanted or _identity(path) != identity:
                del self._watched[path]
                if all(w != wd for w, _ in self._watched.values()):
                    inotify.remove(wd)
        complete = True
        for path in sorted(wanted - set(self._watched)):
            identity = _identity(path)
            try:
                self._watched[path] = (inotify.add(path), identity)
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # gone meanwhile: the parent's event brings us back here
                    if self.complete:
                        log.warning("cannot watch a directory; looking at it on a schedule", reason="no-inotify",
                                    directory=str(path), error=exc.strerror)
                    complete = False
        self.complete = complete
        return wanted

    def _run(self) -> None:
        inotify = self._inotify
        assert inotify is not None
        poller = select.poll()
        poller.register(inotify.fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            events = inotify.read()
            gone = {wd for wd, mask, _ in events if mask & IN_IGNORED}
            with self._lock:
                if gone:
                    self._watched = {p: w for p, w in self._watched.items() if w[0] not in gone}
                self._resolve()
            if events:
                try:
                    self.changed()
                except Exception:  # a caller's bug must not end the watch
                    log.exception("handling a file change failed", watch=self.name)

    def close(self) -> None:
        if self._inotify is None:
            return
        os.write(self._stop_w, b"\0")
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            self._inotify.close()
            self._inotify = None
        os.close(self._stop_r)
        os.close(self._stop_w)
