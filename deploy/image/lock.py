#!/usr/bin/env python3
"""Write the image's lock files: its runtime dependencies at exact versions, with their files' sha256.

    python deploy/image/lock.py                       # rewrite deploy/image/requirements*.lock
    python deploy/image/lock.py --index-url URL       # resolve against another index (default: PyPI)

pip's own resolver does the work (`pip install --dry-run --report`, nothing is installed): it resolves
pyproject.toml's dependencies for the image's interpreter, CPython 3.11 on glibc 2.36 (Debian bookworm,
as python:3.11-slim-bookworm), on x86_64; the versions it picks are then resolved again, pinned, on
aarch64, so that the lock holds the hashes of both platforms' files. The Dockerfile installs
requirements.lock with `pip install --no-deps --require-hashes`: what it lists is exactly what the
image holds, nothing resolved on the day of the build. requirements-<extra>.lock holds what an
optional extra adds (`--build-arg EXTRAS=amd`); the test extra is not for images.

UNUSED names what a dependency requires but gpu-labeller never imports; it is left out of the lock,
with what only it requires. pip is run isolated from this machine's pip configuration (its extra
indexes and local wheels are not what an image build sees); `--cert` (default: $PIP_CERT) is the CA
bundle for a TLS-inspecting proxy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LOCK = HERE / "requirements.lock"
# Optional extras an image may be built with (pyproject's "test" is not one), and the architectures they
# are locked for: pyamdgpuinfo publishes no aarch64 wheel.
IMAGE_EXTRAS = {"amd": ("x86_64",)}
PYTHON_VERSION = "3.11"
GLIBC_MINOR = 36  # Debian bookworm's glibc 2.36
ARCHITECTURES = ("x86_64", "aarch64")
# Requirements of a dependency that gpu-labeller never imports: (dependency, requirement) -> why.
UNUSED: dict[tuple[str, str], str] = {
    ("kubernetes", "aiohttp"): "kubernetes.aio only (the asyncio client; gpu-labeller uses the synchronous one)",
    ("kubernetes", "aiohttp-retry"): "kubernetes.aio only",
}


class LockError(Exception):
    """The dependencies cannot be locked, or what is installed does not satisfy them: one line."""


@dataclass
class Locked:
    """One locked distribution: its pinned version, its files' hashes, and who requires it."""

    name: str  # as the index spells it
    version: str
    hashes: set[str] = field(default_factory=set)
    via: set[str] = field(default_factory=set)  # canonical names of requirers; "gpu-labeller" for pyproject's


def project_requirements(extra: str | None = None) -> list[Requirement]:
    """pyproject.toml's runtime dependencies, or an optional extra's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return [Requirement(text) for text in listed]


def platforms(architecture: str) -> list[str]:
    """pip's --platform values for manylinux on ``architecture``, the most specific first: pip takes them
    as given (it does not widen manylinux_2_36 to older glibc versions)."""
    tags = [f"manylinux_2_{minor}_{architecture}" for minor in range(GLIBC_MINOR, 16, -1)]
    return tags + [f"manylinux2014_{architecture}"]


def resolve(requirements: Iterable[str], architecture: str, index_url: str, cert: str | None,
            constraints: Iterable[str] = ()) -> dict[str, Any]:
    """pip's installation report for ``requirements`` on ``architecture`` (nothing is installed)."""
    with tempfile.TemporaryDirectory(prefix="gpu-labeller-lock-") as scratch:
        report, constraint_file = Path(scratch) / "report.json", Path(scratch) / "constraints.txt"
        constraint_file.write_text("".join(f"{line}\n" for line in constraints))
        command = [sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--disable-pip-version-check",
                   "--dry-run", "--ignore-installed", "--report", str(report), "--index-url", index_url,
                   "--constraint", str(constraint_file), "--only-binary=:all:", "--implementation", "cp",
                   "--python-version", PYTHON_VERSION, "--abi", "cp" + PYTHON_VERSION.replace(".", ""),
                   # pip takes platform options only with --target; a dry run writes nothing there
                   "--target", str(Path(scratch) / "never-written")]
        command += [option for tag in platforms(architecture) for option in ("--platform", tag)]
        command += ["--cert", cert] if cert else []
        result = subprocess.run([*command, *requirements], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            problem = [line for line in result.stderr.splitlines() if line.startswith("ERROR")] or ["pip failed"]
            raise LockError(f"{architecture}: {problem[-1]}")
        loaded: dict[str, Any] = json.loads(report.read_text())
        return loaded


def closure(report: Mapping[str, Any], roots: Iterable[Requirement],
            unused: Mapping[tuple[str, str], str] = UNUSED) -> dict[NormalizedName, Locked]:
    """What ``roots`` need, transitively, among the report's distributions (markers evaluated in the
    report's environment, extras followed), leaving out the ``unused`` requirements and what only they need."""
    found = {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}
    environment = dict(report["environment"])
    locked: dict[NormalizedName, Locked] = {}
    pending: list[tuple[Requirement, str]] = [(requirement, "gpu-labeller") for requirement in roots]
    seen: set[tuple[NormalizedName, str]] = set()
    skipped = {(canonicalize_name(requirer), canonicalize_name(name)) for requirer, name in unused}
    while pending:
        requirement, requirer = pending.pop()
        name = canonicalize_name(requirement.name)
        if (canonicalize_name(requirer), name) in skipped:
            continue
        if requirement.marker and not requirement.marker.evaluate({**environment, "extra": ""}):
            continue
        if name not in found:
            raise LockError(f"{requirer} requires {requirement}, which is missing")
        metadata = found[name]["metadata"]
        if not requirement.specifier.contains(metadata["version"], prereleases=True):
            raise LockError(f"{requirer} requires {requirement}, not {metadata['version']}")
        entry = locked.setdefault(name, Locked(metadata["name"], metadata["version"]))
        entry.via.add(canonicalize_name(requirer))
        for extra in sorted(requirement.extras) or [""]:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for text in metadata.get("requires_dist") or []:
                needed = Requirement(text)
                if needed.marker is None or needed.marker.evaluate({**environment, "extra": extra}):
                    needed.marker = None  # evaluated: the requirement holds here
                    pending.append((needed, metadata["name"]))
    return locked


def file_hashes(report: Mapping[str, Any]) -> dict[NormalizedName, tuple[str, set[str]]]:
    """Each distribution's version and the sha256 of the file pip chose for it."""
    hashes: dict[NormalizedName, tuple[str, set[str]]] = {}
    for item in report["install"]:
        digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if not digest:
            raise LockError(f"{item['metadata']['name']}: the index gave no sha256")
        hashes[canonicalize_name(item["metadata"]["name"])] = (item["metadata"]["version"], {digest})
    return hashes


def parse(text: str) -> dict[NormalizedName, Locked]:
    """A lock file written by ``render``: each distribution's version, hashes and requirers."""
    locked: dict[NormalizedName, Locked] = {}
    entry: Locked | None = None
    for line in text.replace("\\\n", " ").splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "#":
            if entry is not None and words[1:2] == ["via"]:
                entry.via = {canonicalize_name(name) for name in " ".join(words[2:]).split(", ")}
            continue
        name, _, version = words[0].partition("==")
        if not version or len(words) < 2 or any(not word.startswith("--hash=sha256:") for word in words[1:]):
            raise LockError(f"not a pinned requirement with hashes: {line.strip()}")
        entry = locked[canonicalize_name(name)] = Locked(name, version, {word.split(":", 1)[1] for word in words[1:]})
    return locked


def render(locked: Mapping[str, Locked], header: str) -> str:
    """A requirements file in pip-compile's layout: `name==version \\` and its hashes, then `# via`."""
    lines = [header.rstrip("\n")]
    for key in sorted(locked):
        entry = locked[key]
        lines.append(f"{entry.name}=={entry.version} \\")
        hashes = sorted(entry.hashes)
        lines += [f"    --hash=sha256:{digest}" + (" \\" if n < len(hashes) - 1 else "")
                  for n, digest in enumerate(hashes)]
        lines.append("    # via " + ", ".join(sorted(entry.via)))
    return "\n".join(lines) + "\n"


def lock(roots: list[Requirement], index_url: str, cert: str | None, architectures: tuple[str, ...] = ARCHITECTURES,
         base: Mapping[NormalizedName, Locked] | None = None) -> dict[NormalizedName, Locked]:
    """Resolve ``roots`` (with ``base`` pinned) on the first architecture, then pinned on the others for their
    files' hashes; the closure, less ``base``."""
    pins = [f"{entry.name}=={entry.version}" for entry in (base or {}).values()]
    report = resolve([str(r) for r in roots], architectures[0], index_url, cert, pins)
    locked = closure(report, roots)
    pins += [f"{entry.name}=={entry.version}" for entry in locked.values()]
    for architecture, hashes in [(architectures[0], file_hashes(report))] + [
            (arch, file_hashes(resolve([str(r) for r in roots], arch, index_url, cert, pins)))
            for arch in architectures[1:]]:
        for name, entry in locked.items():
            if name not in hashes or hashes[name][0] != entry.version:
                raise LockError(f"{entry.name}=={entry.version} has no wheel for {architecture}")
            entry.hashes |= hashes[name][1]
    return {name: entry for name, entry in locked.items() if name not in (base or {})}


def header(what: str, architectures: tuple[str, ...]) -> str:
    return (f"# The image's {what}:\n"
            f"# exact versions, with the sha256 of their files for CPython {PYTHON_VERSION} on manylinux (glibc <= "
            f"2.{GLIBC_MINOR}) {' and '.join(architectures)}.\n"
            "# The Dockerfile installs them with `pip install --no-deps --require-hashes`.\n"
            "# Generated from pyproject.toml by deploy/image/lock.py: do not edit by hand;\n"
            "# `python deploy/image/lock.py` updates it.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-url", default="https://pypi.org/simple", help="the index (default: %(default)s)")
    parser.add_argument("--cert", default=os.environ.get("PIP_CERT"), help="CA bundle (default: $PIP_CERT)")
    args = parser.parse_args(argv)
    try:
        write_locks(args.index_url, args.cert)
    except LockError as exc:
        print(f"lock: {exc}", file=sys.stderr)
        return 1
    return 0


def write_locks(index_url: str, cert: str | None) -> None:
    left_out = "".join(f"# Left out: {requirer} requires {name} for {why}.\n"
                       for (requirer, name), why in UNUSED.items())
    base = lock(project_requirements(), index_url, cert)
    LOCK.write_text(render(base, header("runtime dependencies", ARCHITECTURES) + left_out))
    print(f"{LOCK.relative_to(ROOT)}: {len(base)} distributions")
    for extra, architectures in IMAGE_EXTRAS.items():
        added = lock(project_requirements(extra), index_url, cert, architectures, base)
        path = HERE / f"requirements-{extra}.lock"
        path.write_text(render(added, header(f"'{extra}' extra's additions to requirements.lock", architectures)))
        print(f"{path.relative_to(ROOT)}: {len(added)} distributions")


if __name__ == "__main__":
    sys.exit(main())
