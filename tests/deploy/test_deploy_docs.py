"""The documentation: a short README, a MkDocs site under docs/ that builds without a broken link or
anchor, with every page in its nav and every command on the CLI page, and no internal issue numbers
in anything a user reads."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import yaml
from mkdocs.commands.build import build
from mkdocs.config import load_config

from labeller.cli.root import LAZY_COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CHART = ROOT / "deploy" / "helm" / "gpu-labeller"
# "issue 14", "issue #3", "issues 4 and 5", "issue 4's budget": the project's own tracker means nothing to a user.
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def pages() -> list[Path]:
    return sorted(DOCS.glob("**/*.md"))


def nav_files(nav: list[object]) -> set[str]:
    files: set[str] = set()
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            files |= nav_files(value)
        elif isinstance(value, str):
            files.add(value)
    return files


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 220


def test_no_internal_issue_numbers_in_what_users_read() -> None:
    texts = {ROOT / name: (ROOT / name).read_text() for name in ("README.md", "CHANGELOG.md")}
    texts |= {page: page.read_text() for page in pages()}
    texts |= {path: path.read_text() for path in CHART.rglob("*") if path.is_file()}
    found = [f"{path.relative_to(ROOT)}: {match.group(0)}"
             for path, text in texts.items() for match in ISSUE_NUMBER.finditer(text)]
    assert len(texts) > 20 and found == []


def test_no_internal_issue_numbers_in_the_cli_help() -> None:
    context = click.Context(main)
    names = main.list_commands(context)
    helps = [main.get_help(context)]
    for name in names:
        command = main.get_command(context, name)
        assert command is not None
        helps.append(command.get_help(click.Context(command, info_name=name, parent=context)))
    assert len(helps) == len(names) + 1 > 15
    assert [h for h in helps if ISSUE_NUMBER.search(h)] == []


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = nav_files(config["nav"])
    on_disk = {str(page.relative_to(DOCS)) for page in pages()}
    assert len(on_disk) >= 15
    assert on_disk - in_nav == set()
    assert in_nav - on_disk == set()


def test_every_command_is_on_the_cli_page() -> None:
    cli_page = (DOCS / "cli.md").read_text()
    commands = set(main.list_commands(click.Context(main)))
    assert set(LAZY_COMMANDS) <= commands and {"mps-control-daemon", "dra-plugin", "labels"} <= commands
    missing = [name for name in commands if not re.search(rf"^\| `{re.escape(name)}[ `]", cli_page, re.MULTILINE)]
    assert missing == []


def test_the_source_files_the_docs_name_exist() -> None:
    """The pages name source files as `labeller/...`, `vendors/...`, `tests/...`, `deploy/...` (code,
    not links: the site holds no sources). A file moved or renamed must be renamed here too."""
    named = {path for page in [*pages(), ROOT / "README.md"]
             for path in re.findall(r"`((?:labeller|vendors|tests|deploy|\.ci)/[\w./-]*)`", page.read_text())}
    assert len(named) > 50
    assert sorted(path for path in named if not (ROOT / path.rstrip("/")).exists()) == []


def test_the_site_builds_without_a_broken_link_or_anchor(tmp_path: Path) -> None:
    """mkdocs --strict: a link to a missing page or anchor is a warning, and a warning fails the build
    (.ci/run builds it too)."""
    config = load_config(config_file=str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    build(config)
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "operations" / "index.html").is_file()


@pytest.mark.parametrize("code", ["0", "1", "2", "130"])
def test_the_exit_code_table_has_each_code(code: str) -> None:
    page = (DOCS / "operations.md").read_text()
    table = page[page.index("## Exit codes"):page.index("## When discovery fails")]
    assert re.search(rf"^\| {code} \|", table, re.MULTILINE)
