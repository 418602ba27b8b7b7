"""Files a process keeps in a directory of its own, that nothing in them can turn against the node.

The DRA plugin's checkpoint records and claims' CDI spec files, and the device plugin's CDI spec
files, live in directories others may write too (a pod with a hostPath mount of /var/run/cdi, a
careless script). What is found there is never trusted:

- ``directory`` opens the directory once: the path an admin gave as is, and the components the
  process makes itself never through a symlink (``O_DIRECTORY | O_NOFOLLOW``); every other call
  works relative to that descriptor, so a directory swapped for a link halfway changes nothing;
- ``replace`` writes a temporary file created with ``O_EXCL | O_NOFOLLOW`` and renames it over the
  file: a symlink, FIFO, device or directory at the name is refused (``NotOurs``), its target never
  opened; a link put there after the check is replaced by the rename, its target never written;
- ``read`` opens with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO does not wait for a writer), checks with
  ``fstat`` that it is a regular file and reads at most a limit;
- ``remove`` unlinks only a regular file, ``move_aside`` renames whatever is there (a link is
  renamed, not followed) to a name that holds nothing, ``remove_stale`` removes the temporary files
  a killed process left.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symlink"))
_ASIDE_TRIES = 100


def file_kind(mode: int) -> str:
    """What a file is ("a FIFO", "a symlink"), from its ``st_mode``."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class NotOurs(OSError):
    """Something that is not a regular file is where the process keeps one of its files (or not a
    directory where it keeps them); it was left alone. ``str()`` is one line naming it."""

    def __init__(self, directory: str, name: str, mode: int, expected: str = "not a regular file") -> None:
        super().__init__(f"{os.path.join(directory, name)} is {file_kind(mode)}, {expected}; left alone")
        self.mode = mode


class TooLarge(OSError):
    """A file larger than the limit its reader allows."""


def temporary_name(name: str) -> str:
    """A temporary file's name for ``name``: a dot-file (what reads ``*.json`` skips it) ending in ``.tmp``."""
    return f".{name}.{secrets.token_hex(4)}.tmp"


@contextmanager
def directory(base: Path, *made: str, mode: int = 0o755, create: bool = True) -> Iterator[int]:
    """A descriptor of ``base/made[0]/made[1]/...``, closed after the block. ``base`` is a path an
    admin gave (symlinks in it are followed); each of ``made`` is a directory this process makes and
    is never a symlink (``NotOurs`` when one, or anything but a directory, is there). With ``create``
    what is missing is made (``made`` with ``mode``), else FileNotFoundError."""
    if create:
        os.makedirs(base, exist_ok=True)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in made:
            if create:
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                found = _mode(fd, name) if exc.errno in (errno.ELOOP, errno.ENOTDIR) else None
                if found is None:
                    raise
                raise NotOurs(_where(fd), name, found, "not a directory") from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def own_directory(path: Path, *, create: bool = True) -> contextlib.AbstractContextManager[int]:
    """``directory`` for a directory the process writes its files into directly (a CDI spec
    directory): its parent as given, the directory itself never a symlink."""
    return directory(path.parent, path.name, create=create) if path.name else directory(path, create=create)


def directory_problem(base: Path, *made: str) -> str | None:
    """What keeps ``directory`` from opening and listing an existing ``base/made...`` (not a directory,
    a symlink, unreadable), as one line; None when it is fine or not made yet."""
    try:
        with directory(base, *made, create=False) as fd:
            names(fd)
    except FileNotFoundError:
        return None
    except NotOurs as exc:
        return str(exc)
    except OSError as exc:
        return f"{base.joinpath(*made)}: {exc.strerror or exc}"
    return None


def _mode(dir_fd: int, name: str) -> int | None:
    """The ``st_mode`` of what is at ``name`` itself (a link is not followed); None when nothing is."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def _where(dir_fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{dir_fd}")
    except OSError:
        return "."


def is_regular(dir_fd: int, name: str) -> bool:
    mode = _mode(dir_fd, name)
    return mode is not None and stat.S_ISREG(mode)


def replace(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Make ``name`` hold ``data`` (a new regular file, or a regular file replaced whole, atomically);
    ``NotOurs`` when something else is there. Not fsynced: see the callers."""
    found = _mode(dir_fd, name)
    if found is not None and not stat.S_ISREG(found):
        raise NotOurs(_where(dir_fd), name, found)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_ASIDE_TRIES):
        tmp = temporary_name(name)
        try:
            fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", name)
    try:
        try:
            os.fchmod(fd, mode)  # not the umask's
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise


def read(dir_fd: int, name: str, limit: int) -> bytes | None:
    """The content of the regular file ``name``, None when there is none; ``NotOurs`` when something
    else is there (never opened when ``lstat`` already tells), ``TooLarge`` beyond ``limit`` bytes."""
    found = _mode(dir_fd, name)
    if found is None:
        return None
    if not stat.S_ISREG(found):
        raise NotOurs(_where(dir_fd), name, found)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link swapped in since the lstat
            raise NotOurs(_where(dir_fd), name, stat.S_IFLNK) from None
        raise
    try:
        found = os.fstat(fd).st_mode
        if not stat.S_ISREG(found):  # swapped since the lstat
            raise NotOurs(_where(dir_fd), name, found)
        data = read_at_most(fd, limit)
        if data is None:
            raise TooLarge(f"{os.path.join(_where(dir_fd), name)} is larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


def read_at_most(fd: int, limit: int) -> bytes | None:
    """What ``fd`` holds, read to its end; None as soon as that is more than ``limit`` bytes (a file
    may be handed over in pieces, and grow while it is read)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, limit + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None
    return b"".join(chunks)


def remove(dir_fd: int, name: str) -> bool:
    """Remove the regular file ``name``; False when nothing is there, ``NotOurs`` (left alone) when
    something other than a regular file is."""
    found = _mode(dir_fd, name)
    if found is None:
        return False
    if not stat.S_ISREG(found):
        raise NotOurs(_where(dir_fd), name, found)
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def move_aside(dir_fd: int, name: str, suffix: str = ".bad") -> str:
    """Rename whatever is at ``name`` (a link itself, never its target) to ``name + suffix``, or, when
    something is already there, to the first of ``name + suffix + ".1"``, ``".2"``, ... that holds
    nothing. The name it got."""
    for attempt in range(_ASIDE_TRIES):
        aside = name + suffix + (f".{attempt}" if attempt else "")
        if _mode(dir_fd, aside) is not None:
            continue
        try:
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                continue  # made there since the look
            raise
        return aside
    raise FileExistsError(errno.EEXIST, f"no free name to move it aside after {_ASIDE_TRIES} tries", name)


@dataclass(frozen=True)
class MovedAside:
    """A record that was not the process's own, and the name it was moved aside to."""

    name: str
    problem: str


def read_record(dir_fd: int, name: str, limit: int, parse: Callable[[bytes], T],
                refused: tuple[type[Exception], ...]) -> T | MovedAside | None:
    """The record at ``name`` as ``parse`` reads it; None when there is none. Anything that is not one
    (not a regular file, over ``limit`` bytes, a directory, a link, or what ``parse`` refuses with one
    of ``refused``) is moved aside (``move_aside``) and said so. Other OSErrors are raised."""
    not_ours: tuple[type[Exception], ...] = (NotOurs, TooLarge, *refused)
    try:
        data = read(dir_fd, name, limit)
        return None if data is None else parse(data)
    except not_ours as exc:
        problem = str(exc)
    except OSError as exc:
        if exc.errno not in (errno.EISDIR, errno.ELOOP):
            raise
        problem = exc.strerror or str(exc)
    return MovedAside(move_aside(dir_fd, name), problem)


def remove_stale(dir_fd: int, pattern: re.Pattern[str]) -> list[str]:
    """Remove the regular files whose whole name matches ``pattern`` (temporary files a killed process
    left); the names removed. Anything else that matches is left alone."""
    removed = []
    for name in names(dir_fd):
        if pattern.fullmatch(name) and is_regular(dir_fd, name):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            removed.append(name)
    return removed


def names(dir_fd: int) -> list[str]:
    """The names in the directory."""
    with os.scandir(dir_fd) as entries:
        return [entry.name for entry in entries]
