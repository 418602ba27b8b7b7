"""Simulated nodes: a profile file replayed through the real backends.

A profile describes a node as the vendor libraries and sysfs would report it (schema in
docs/profiles.md). ``SimulatedProfile`` turns it into a host root (PCI, DMI and each vendor's files) plus
each vendor's stand-in (a fake ``pynvml`` module for NVIDIA), so discovery runs the same code as
on real hardware, and builds it again when the profile file changes under a running process. A
vendor's section is handed to its simulator (``Discovery.simulator``: ``build(section, root,
base_dir)`` and ``absent()``), imported only here, so nothing of it runs on a real node.

Host roots live in /dev/shm (or TMPDIR) as ``gpu-labeller-sim-<pid>-<random>``: the owner removes
its own on exit, and every new ``SimulatedProfile`` removes those of processes that are gone (a
SIGKILL leaves its root behind until then).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Self

import yaml

from labeller.model.documents import DocumentError, read_document
from labeller.base.errors import InputError
from vendors import VENDORS
from vendors.dmi import PRODUCT_NAME
from vendors.sim_pci import write_host_bridge

PROFILE_KEYS = ("name", "description", "machine", "config", *(vendor.name for vendor in VENDORS))
ROOT_PREFIX = "gpu-labeller-sim-"
_ROOT_NAME = re.compile(rf"^{ROOT_PREFIX}(\d+)-")


class ProfileError(InputError, ValueError):
    """A profile problem, with a one-line message naming the file and key."""


@dataclass(frozen=True)
class SimulatedNode:
    name: str
    host_root: Path
    handles: dict[str, Any]  # vendor name -> its stand-in, e.g. "nvidia": a fake pynvml (one that
    # finds no NVML library when the profile has no NVIDIA section)
    config: Any  # the profile's own config section (raw), or None


def _builtin_dir() -> Path:
    return Path(str(resources.files("vendors") / "profiles"))


def builtin_profiles() -> dict[str, str]:
    """Built-in profile name -> description."""
    out: dict[str, str] = {}
    for path in sorted(_builtin_dir().glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        out[path.stem] = str(data.get("description", ""))
    return out


def resolve(profile: str) -> Path:
    """A built-in profile name, or a path to a YAML/JSON profile file."""
    builtin = _builtin_dir() / f"{profile}.yaml"
    if "/" not in profile and builtin.is_file():
        return builtin
    path = Path(profile)
    if path.is_file():
        return path
    names = list(builtin_profiles())
    by_lower = {name.lower(): name for name in names}
    near = difflib.get_close_matches(profile.lower(), by_lower, n=1, cutoff=0.6)
    if near:
        raise ProfileError(f"{profile}: no such profile file or built-in profile; did you mean {by_lower[near[0]]}? "
                           "(gpu-labeller profiles lists them all)")
    raise ProfileError(f"{profile}: no such profile file or built-in profile (built-in: {', '.join(names)})")


def load_profile(path: Path) -> dict[str, Any]:
    try:
        data = read_document(path, "profile")
    except DocumentError as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(data, Mapping):
        raise ProfileError(f"{path}: a profile must be a mapping with keys {', '.join(PROFILE_KEYS)}")
    unknown = sorted(set(data) - set(PROFILE_KEYS))
    if unknown:
        raise ProfileError(f"{path}: {unknown[0]}: unknown key (known: {', '.join(PROFILE_KEYS)})")
    if "machine" in data and not isinstance(data["machine"], str):
        raise ProfileError(f"{path}: machine: must be a string")
    return dict(data)


def scratch_dir() -> str | None:
    """Where to build a simulated host root: memory (/dev/shm) unless the user chose TMPDIR.

    A simulated node is a few hundred small files; on a disk-backed /tmp creating them can cost
    more than everything else ``labels --simulate`` does.
    """
    shm = "/dev/shm"
    if "TMPDIR" not in os.environ and os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_dead_roots(directory: Path) -> list[Path]:
    """Remove the host roots in ``directory`` whose owning process is gone; returns what was removed."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = _ROOT_NAME.match(entry.name)
        if match is not None and not _process_alive(int(match[1])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _build(path: Path, data: Mapping[str, Any], root: Path) -> SimulatedNode:
    """Write the node described by ``data`` (the profile at ``path``) under ``root``."""
    write_host_bridge(root)  # a real /sys always lists PCI devices, GPUs or not
    if "machine" in data:
        dmi = root / PRODUCT_NAME
        dmi.parent.mkdir(parents=True)
        dmi.write_text(data["machine"] + "\n")
    # every vendor gets a stand-in, so a simulated node never consults the machine it runs on
    handles: dict[str, Any] = {}
    try:
        for vendor in VENDORS:
            simulator = vendor.discovery.simulator()
            section = data.get(vendor.name)
            handles[vendor.name] = (simulator.build(section, root, path.parent) if section is not None
                                    else simulator.absent())
    except ValueError as exc:
        raise ProfileError(f"{path}: {exc}") from None
    return SimulatedNode(str(data.get("name", path.stem)), root, handles, data.get("config"))


_FileStamp = tuple[int, int, int] | None  # (inode, size, mtime in ns); None: the file is gone


class SimulatedProfile:
    """A profile built into a host root; a profile file is built again when it changes.

    ``node`` is the current build. ``refresh()`` looks at the file (a ``stat``, then the contents
    only when the ``stat`` differs) and builds a new root only when the contents changed, so an
    unchanged profile keeps its root and its fake NVML module (and with it what tests injected
    through ``inject_xid`` or ``set_lost``). Built-in profiles never change and are never re-read.
    Roots replaced by a refresh are kept until ``close()``: a reader such as the plugin's health
    checks may still be looking at the old one.
    """

    def __init__(self, profile: str) -> None:
        self.path = resolve(profile)
        self.follows_file = not self.path.is_relative_to(_builtin_dir())
        self._roots: list[Path] = []
        remove_dead_roots(Path(scratch_dir() or tempfile.gettempdir()))
        self._stamp = self._stat()
        self._contents = self._read()
        self.node = self._build()

    def refresh(self, check: Callable[[SimulatedNode], object] = lambda node: None) -> bool:
        """Build the node again if the profile file changed since the last look; True when ``node`` is new.

        ``check`` may reject the new node by raising ProfileError. A file that is gone, unreadable,
        invalid or rejected raises ProfileError once; ``node`` stays the previous build."""
        if not self.follows_file:
            return False
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        contents = self._read()
        if contents == self._contents:
            return False
        self._contents = contents
        candidate = self._build()
        try:
            check(candidate)
        except ProfileError:
            self._remove(candidate.host_root)
            raise
        self.node = candidate
        return True

    def close(self) -> None:
        for root in list(self._roots):
            self._remove(root)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stat(self) -> _FileStamp:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def _build(self) -> SimulatedNode:
        data = load_profile(self.path)
        root = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-", dir=scratch_dir()))
        self._roots.append(root)
        try:
            return _build(self.path, data, root)
        except BaseException:
            self._remove(root)
            raise

    def _remove(self, root: Path) -> None:
        shutil.rmtree(root, ignore_errors=True)
        self._roots.remove(root)


@contextmanager
def simulated_node(profile: str) -> Iterator[SimulatedNode]:
    """Build the node described by ``profile`` in a temporary directory, for the block's duration."""
    with SimulatedProfile(profile) as simulation:
        yield simulation.node
