"""The image's lock files pin exactly the runtime dependencies of pyproject.toml, with hashes, as
deploy/image/lock.py writes them; and its resolution logic (markers, extras, left-out requirements)."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy import ROOT, load_lock_script
from tests.deploy.test_deploy_dockerfile import instructions

lock = load_lock_script()
PROJECT = "gpu-labeller"


def locked(path: str = "requirements.lock") -> dict[str, Any]:
    return dict(lock.parse((lock.HERE / path).read_text()))


def reachable(entries: dict[str, Any], roots: set[str]) -> set[str]:
    """The entries reached from ``roots`` following the lock's own `# via` annotations."""
    found, frontier = set(roots), set(roots)
    while frontier:
        frontier = {name for name, entry in entries.items() if entry.via & frontier} - found
        found |= frontier
    return found


@pytest.mark.parametrize("extra", [None, *lock.IMAGE_EXTRAS])
def test_lock_pins_exactly_the_runtime_dependencies(extra: str | None) -> None:
    entries = locked(f"requirements-{extra}.lock" if extra else "requirements.lock")
    requirements = {canonicalize_name(r.name): r for r in lock.project_requirements(extra)}
    # every requirement of pyproject.toml is pinned, at a version it accepts
    for name, requirement in requirements.items():
        assert name in entries, f"{requirement} is not in the lock: run python deploy/image/lock.py"
        assert requirement.specifier.contains(entries[name].version, prereleases=True), (requirement,
                                                                                         entries[name].version)
    # and nothing else is pinned for the project itself, or for what it no longer needs
    assert {name for name, entry in entries.items() if PROJECT in entry.via} == set(requirements)
    base = set(locked()) if extra else set()
    for name, entry in entries.items():
        assert entry.via <= set(entries) | base | {PROJECT}, f"{name} is required by {entry.via}, not in the lock"
    assert reachable(entries, {PROJECT}) == set(entries) | {PROJECT}
    assert all(entry.hashes for entry in entries.values())


def test_lock_leaves_out_the_kubernetes_aio_stack() -> None:
    entries = locked()
    for requirer, name in lock.UNUSED:
        assert requirer in entries and name not in entries
    assert "kubernetes" in entries and not {"aiohttp", "multidict", "yarl", "frozenlist"} & set(entries)


def test_lock_files_are_as_the_script_writes_them() -> None:
    """Hand edits (a line without hashes, another order, a lost `# via`) show: the file is not in its own form."""
    for path in sorted(lock.HERE.glob("requirements*.lock")):
        text = path.read_text()
        lines = text.splitlines(keepends=True)
        header = "".join(lines[:next(n for n, line in enumerate(lines) if not line.startswith("#"))])
        assert lock.render(lock.parse(text), header) == text, path.name


def test_every_image_extra_has_a_lock_the_dockerfile_copies() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert set(lock.IMAGE_EXTRAS) == extras - {"test"}
    copied = " ".join(rest for keyword, rest in instructions() if keyword == "COPY")
    for extra in lock.IMAGE_EXTRAS:
        assert f"deploy/image/requirements-{extra}.lock" in copied
    assert "deploy/image/requirements.lock" in copied


def report(environment: dict[str, str] | None = None, **packages: tuple[str, list[str]]) -> dict[str, Any]:
    """A pip installation report holding ``name=(version, requires_dist)``."""
    return {"environment": environment or {"python_version": "3.11", "sys_platform": "linux",
                                           "platform_machine": "x86_64", "implementation_name": "cpython"},
            "install": [{"metadata": {"name": name.replace("_", "-"), "version": version, "requires_dist": requires}}
                        for name, (version, requires) in packages.items()]}


def test_closure_follows_markers_and_extras_and_leaves_out_what_only_unused_requirements_need() -> None:
    resolved = report(
        kubernetes=("37.0.2", ["urllib3>=2", "aiohttp<4", "google-auth>=1; extra == 'google-auth'"]),
        urllib3=("2.8.0", ["pysocks>=1.5; extra == 'socks'", "brotli; platform_python_implementation == 'PyPy'"]),
        aiohttp=("3.14.5", ["multidict>=4.5"]), multidict=("7.2.1", []), pysocks=("1.7.1", []),
        requests=("2.34.2", ["urllib3[socks]>=1.21", "win-inet-pton; sys_platform == 'win32'"]),
    )
    roots = [Requirement("kubernetes>=37"), Requirement("requests")]
    result = lock.closure(resolved, roots, {("kubernetes", "aiohttp"): "kubernetes.aio only"})
    assert set(result) == {"kubernetes", "urllib3", "requests", "pysocks"}  # no aiohttp, no multidict
    assert result["urllib3"].via == {"kubernetes", "requests"}
    assert result["pysocks"].via == {"urllib3"}  # through requests' urllib3[socks]
    assert result["kubernetes"].via == {PROJECT}
    with_aio = lock.closure(resolved, roots, {})
    assert {"aiohttp", "multidict"} <= set(with_aio)


def test_closure_refuses_a_missing_requirement_or_a_version_outside_its_range() -> None:
    resolved = report(kubernetes=("37.0.2", ["urllib3>=2.8"]), urllib3=("2.7.0", []))
    with pytest.raises(lock.LockError, match=r"kubernetes requires urllib3>=2.8, not 2.7.0"):
        lock.closure(resolved, [Requirement("kubernetes")], {})
    with pytest.raises(lock.LockError, match="gpu-labeller requires click>=8, which is missing"):
        lock.closure(resolved, [Requirement("click>=8")], {})


def test_parse_refuses_a_line_without_a_pin_or_hashes() -> None:
    with pytest.raises(lock.LockError, match="not a pinned requirement with hashes: click>=8"):
        lock.parse("click>=8 \\\n    --hash=sha256:00\n")
    with pytest.raises(lock.LockError, match="click==8.5.1 --no-deps"):
        lock.parse("click==8.5.1 --no-deps\n")
    with pytest.raises(lock.LockError, match="with hashes: click==8.5.1$"):
        lock.parse("click==8.5.1\n")
