"""The reference pages of the docs site (docs/reference/) are generated from the code by docs/gen/reference.py and
cannot drift from it: a committed page that differs from what the code gives now fails here, and each page holds
every label key, command, option and config key there is."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

import click
import pytest

from labeller.cli.root import main
from labeller.model.config import config_keys
from labeller.host.explain import catalog, find
from tests.deploy import ROOT
from vendors import RESOURCE_NAMES, VENDORS

DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    """docs/gen/reference.py, imported from its path (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpu_labeller_docs_reference", DOCS / "gen" / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def section(page: str, heading: str) -> str:
    start = page.index(f"\n## {heading}\n")
    end = page.find("\n## ", start + 1)
    return page[start:end if end > 0 else None]


def test_the_committed_pages_are_what_the_code_gives(generator: ModuleType) -> None:
    """Run `python docs/gen/reference.py` after changing a label's docs, a command or a config key."""
    assert set(generator.PAGES) == {"reference/labels.md", "reference/cli.md", "reference/config.md"}
    assert generator.stale() == []
    assert generator.main(["--check"]) == 0


def test_a_changed_option_makes_the_cli_page_stale(generator: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    labels = main.get_command(click.Context(main), "labels")
    assert labels is not None
    option = next(p for p in labels.params if isinstance(p, click.Option) and p.name == "min_memory")
    monkeypatch.setattr(option, "help", "A help text the committed page does not have.")
    assert generator.stale() == ["reference/cli.md"]
    assert generator.main(["--check"]) == 1
    assert "docs/reference/cli.md: stale; run python docs/gen/reference.py" in capsys.readouterr().err


def test_every_label_key_has_a_meaning_and_a_row() -> None:
    page = (DOCS / "reference" / "labels.md").read_text()
    entries = catalog(VENDORS)
    ours = [e.doc for e in entries if e.doc.writer == "gpu-labeller"]
    assert len(ours) > 80
    assert [doc.pattern for doc in ours if not doc.meaning] == []
    rows = set(re.findall(r"^\| `([^`]+)` \|", page, re.MULTILINE))
    assert {e.doc.pattern for e in entries} <= rows


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-a100-mig-mixed", "mi300x-x8-cpx-mixed", "mi25-firmware",
                                     "t4-x4-gpushare", "mixed-l40s-mi210"])
def test_every_label_a_profile_prints_is_described_with_a_meaning(profile: str) -> None:
    """A labeler that writes a key without a KeyDoc (or one without a meaning) would leave it out of the reference."""
    from labeller.cli.commands.selectors import profile_labels

    entries = catalog(VENDORS)
    labels = profile_labels(profile)
    undescribed = [key for key in labels if (entry := find(key, entries)) is None or not entry.doc.meaning]
    assert labels and undescribed == []


def test_every_command_and_option_is_on_the_cli_page() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    root = click.Context(main)
    for name in main.list_commands(root):
        command = main.get_command(root, name)
        assert command is not None
        text = section(page, name)
        options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
        missing = [p.opts[0] for p in options if f"`{p.opts[0]}`" not in text]
        assert missing == [], name
        assert text.count("\n| `-") == len(options), name  # hidden (upstream) aliases are not listed


def test_every_config_key_is_on_the_config_page() -> None:
    page = (DOCS / "reference" / "config.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \|", page, re.MULTILINE)
    assert rows == [key.path for key in config_keys(RESOURCE_NAMES)]
    assert "`flags.migStrategy` | one of `none`, `single`, `mixed` | `none` |" in page
