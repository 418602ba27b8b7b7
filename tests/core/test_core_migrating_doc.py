"""docs/migrating.md cannot drift: every flag and env var its tables list is taken by the gpu-labeller
command the row names, and every upstream flag gpu-labeller takes is in a table of its tool's section."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from labeller.cli.root import main
from labeller.model.config import upstream_flags
from tests.core.test_core_upstream import sample
from vendors import RESOURCE_NAMES

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"
COMMANDS = ("run", "labels", "device-plugin", "resources", "dra-plugin", "scheduler-extender", "inspect")
# One section per upstream binary (the DRA drivers' klog flags are listed once, under NVIDIA's)
SECTIONS = ("GPU Feature Discovery", "NVIDIA device plugin", "AMD device plugin", "AMD k8s-node-labeller",
            "gpushare device plugin", "gpushare scheduler extender", "NVIDIA DRA driver", "AMD DRA driver")
TICKED = re.compile(r"`([^`]+)`")


def rows() -> list[tuple[str, list[str], list[str], list[str]]]:
    """(the table's section, its upstream flags, env vars, gpu-labeller commands) per table row."""
    found, section = [], ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:]
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 5 or set(cells[1]) == {"-"} or cells[2] == "gpu-labeller":
            continue
        commands = [name for name in TICKED.findall(cells[2]) if name in COMMANDS]
        found.append((section, TICKED.findall(cells[0]), TICKED.findall(cells[1]), commands))
    return found


ROWS = rows()
UPSTREAM_FLAGS = upstream_flags(RESOURCE_NAMES)


def command(name: str) -> click.Command:
    found = main.get_command(click.Context(main), name)
    assert found is not None
    return found


def test_the_tables_have_every_upstream_tool_and_every_row_names_a_command() -> None:
    sections = {section for section, *_ in ROWS}
    assert len(sections) == len(SECTIONS) and len(ROWS) >= 100
    assert all(any(section.startswith(name) for section in sections) for name in SECTIONS)
    assert all(commands for _, _, _, commands in ROWS)


def read_by_the_command(env: str, command_name: str) -> bool:
    """Whether ``command_name`` reads ``env``: an option's, an upstream env var the command reads itself
    (gpushare's LOG_LEVEL), or KUBECONFIG, which every command with --kubeconfig reads by the
    credentials rule (labeller.cluster.connect)."""
    params = [p for p in command(command_name).params if isinstance(p, click.Option)]
    if any(env in ([p.envvar] if isinstance(p.envvar, str) else p.envvar or []) for p in params):
        return True
    if env == "KUBECONFIG":
        return any("--kubeconfig" in p.opts for p in params)
    return any(not f.names and env in f.env and command_name in f.commands for f in UPSTREAM_FLAGS)


@pytest.mark.parametrize(("section", "flags", "envs", "commands"), ROWS, ids=[" ".join(r[1] or r[2]) for r in ROWS])
def test_every_flag_and_env_var_in_the_tables_is_taken(section: str, flags: list[str], envs: list[str],
                                                      commands: list[str]) -> None:
    known = {name: flag for flag in UPSTREAM_FLAGS if flag.alias_of is None for name in flag.names}
    for name in commands:
        params = [p for p in command(name).params if isinstance(p, click.Option)]
        for flag in flags:
            option = next((p for p in params if flag in p.opts or flag in p.secondary_opts), None)
            assert option is not None, f"{section}: {name} does not take {flag}"
            upstream = known.get(flag)
            if upstream is not None and upstream.dest == option.name:
                args, value = sample(upstream)
                args = [args[0].replace(upstream.names[0], flag, 1), *args[1:]]
                assert command(name).make_context(name, args).params[option.name] == value
        for env in envs:
            assert read_by_the_command(env, name), f"{section}: {name} does not read {env}"


def test_every_upstream_flag_and_env_var_is_in_a_table() -> None:
    listed = {(name, command) for _, flags, _, commands in ROWS for name in flags for command in commands}
    listed_env = {(env, command) for _, _, envs, commands in ROWS for env in envs for command in commands}
    for flag in UPSTREAM_FLAGS:
        for name in flag.commands:
            # AMD's Go switches also take two dashes (-vram, --vram): the page says so once
            names = {n for n in flag.names if n != "-" + flag.names[0]}
            assert {(n, name) for n in names} <= listed, f"{flag.names} on {name} is not in {DOC.name}"
            assert {(e, name) for e in flag.env} <= listed_env, f"{flag.env} on {name} is not in {DOC.name}"
