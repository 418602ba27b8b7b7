"""The map of the code on docs/development.md (docs/img/map.svg) is drawn by docs/gen/map.py from the layout and
cannot drift from it: a committed picture that differs from what the code gives now fails here. It holds every
module in the box of its tier, draws an import that runs up a tier in red, and loads nothing."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from types import ModuleType

import pytest

from tests.core import test_core_architecture as architecture
from tests.deploy import ROOT


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    """docs/gen/map.py, imported from its path (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpu_labeller_docs_map", ROOT / "docs" / "gen" / "map.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_committed_map_is_what_the_code_gives(generator: ModuleType) -> None:
    """Run `python docs/gen/map.py` after adding, moving or removing a module or an import between packages."""
    assert generator.main(["--check"]) == 0
    assert "![" in (page := (ROOT / "docs" / "development.md").read_text()) and "(img/map.svg)" in page


def test_a_new_import_between_packages_makes_the_map_stale(generator: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    real = generator.read_layout()
    new = generator.Imports("labeller/cli/", "labeller/base/", (("labeller.cli.root", "labeller.base.ownfiles"),))
    assert new not in real.imports
    monkeypatch.setattr(generator, "read_layout",
                        lambda: generator.Layout(real.tiers, real.packages, (*real.imports, new)))
    assert generator.main(["--check"]) == 1
    assert "docs/img/map.svg: stale; run python docs/gen/map.py" in capsys.readouterr().err


def test_every_module_is_in_one_box_of_its_tier_and_no_arrow_runs_up(generator: ModuleType) -> None:
    """The boxes are the architecture test's tiers, read from the same paths (a package's bare docstring
    ``__init__`` has no room of its own)."""
    layout = generator.read_layout()
    drawn = [module for package in layout.packages for module in package.modules]
    assert len(drawn) == len(set(drawn)) > 100
    bare = {architecture.module_name(path) for path in architecture.sources()
            if generator._docstring_only(ast.parse(path.read_text()))}
    assert "labeller.apps" in bare and "vendors" not in bare  # a docstring alone; the vendors' registry
    assert set(drawn) == set(architecture.modules()) - bare
    assert all(architecture.tier(m) == p.tier for p in layout.packages for m in p.modules)
    assert [layout.tiers[p.tier] for p in layout.packages if p.label == "labeller/cli/commands/"] == ["cli"]
    assert generator.upward(layout) == []
    assert {"labeller/cluster/", "vendors/nvidia/", "labeller/apps/draplugin/"} <= {p.label for p in layout.packages}


def test_an_import_that_runs_up_is_drawn_in_red(generator: ModuleType) -> None:
    base = generator.Package("labeller/base/", 0, ("labeller.base.log",))
    model = generator.Package("labeller/model/", 1, ("labeller.model.labels",))
    down = generator.Imports("labeller/model/", "labeller/base/", (("labeller.model.labels", "labeller.base.log"),))
    up = generator.Imports("labeller/base/", "labeller/model/", (("labeller.base.log", "labeller.model.labels"),))
    picture = generator.svg(generator.Layout(("base", "model"), (base, model), (down, up)))
    red = re.findall(r'<path class="up"[^>]*stroke="#cf222e"[^>]*><title>([^<]*)</title>', picture)
    assert red == ["UPWARD: labeller/base/ imports labeller/model/ "
                   "(1 import: labeller.base.log → labeller.model.labels)"]
    assert len(re.findall(r'<path class="down"[^>]*stroke="#57606a"', picture)) == 1
    assert "2 arrows: 1 down, 0 within a tier, 1 up" in picture
    allowed = generator.svg(generator.Layout(("base", "model"), (base, model), (down,)))
    assert 'class="up"' not in allowed and "0 up" in allowed


def test_the_picture_loads_nothing(generator: ModuleType) -> None:
    """Self-contained: no script, no link, no font or image from anywhere (the SVG namespace is a name, not a load)."""
    picture = (ROOT / "docs" / "img" / "map.svg").read_text()
    assert picture.startswith('<svg xmlns="http://www.w3.org/2000/svg" ')
    assert re.findall(r"<script|href=|@import|url\((?!#)|https?://", picture) == ["http://"]
