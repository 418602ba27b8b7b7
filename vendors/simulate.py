"""Simulated nodes: a profile file replayed through the real backends.

A profile describes a node as the vendor libraries and sysfs would report it (schema in the
README). ``simulated_node`` turns it into a temporary host root (PCI, DMI and AMD sysfs files) plus
a fake ``pynvml`` module, so discovery runs the same code as on real hardware.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from labeller.documents import DocumentError, read_document
from vendors import amd_sim, fake_nvml
from vendors.dmi import PRODUCT_NAME

PROFILE_KEYS = ("name", "description", "machine", "config", "nvidia", "amd")


class ProfileError(ValueError):
    """A profile problem, with a one-line message naming the file and key."""


@dataclass(frozen=True)
class SimulatedNode:
    name: str
    host_root: Path
    nvml: ModuleType  # the fake pynvml; without an NVIDIA section, one that finds no NVML library
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
    known = ", ".join(builtin_profiles())
    raise ProfileError(f"{profile}: no such profile file or built-in profile (built-in: {known})")


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


@contextmanager
def simulated_node(profile: str) -> Iterator[SimulatedNode]:
    """Build the node described by ``profile`` in a temporary directory, for the block's duration."""
    path = resolve(profile)
    data = load_profile(path)
    with tempfile.TemporaryDirectory(prefix="gpu-labeller-sim-", dir=scratch_dir()) as tmp:
        root = Path(tmp)
        if "machine" in data:
            dmi = root / PRODUCT_NAME
            dmi.parent.mkdir(parents=True)
            dmi.write_text(data["machine"] + "\n")
        # never the real pynvml: a simulated node must not pick up the GPUs of the machine it runs on
        nvml = fake_nvml.without_library()
        try:
            if "nvidia" in data:
                nvml = fake_nvml.build(data["nvidia"], root)
            if "amd" in data:
                amd_sim.build(data["amd"], root, base_dir=path.parent)
        except ValueError as exc:
            raise ProfileError(f"{path}: {exc}") from None
        yield SimulatedNode(str(data.get("name", path.stem)), root, nvml, data.get("config"))
