"""Every time option shows and names its values as durations, the way it takes them (60s, 500ms, 2m):
in --help, in its errors, from the command line and from its environment variable."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from labeller.cli.root import main
from labeller.cli.commands.params import Duration, format_duration, parse_duration


def duration_options() -> list[tuple[str, click.Option]]:
    found = []
    for name in main.list_commands(click.Context(main)):
        command = main.get_command(click.Context(main), name)
        assert command is not None
        found += [(name, p) for p in command.params if isinstance(p, click.Option) and isinstance(p.type, Duration)]
    return found


DURATIONS = duration_options()


def help_of(name: str, option: click.Option) -> str:
    """The option's entry in ``gpu-labeller NAME --help``, on one line."""
    text = " ".join(CliRunner().invoke(main, [name, "--help"], terminal_width=200).stdout.split())
    start = text.index(option.opts[0] + " DURATION")
    following = re.search(r" --?[a-z][a-z-]* ", text[start + len(option.opts[0]):])
    return text[start:start + len(option.opts[0]) + (following.start() if following else len(text))]


def test_the_time_options_are_found() -> None:
    names = {(name, option.opts[0]) for name, option in DURATIONS}
    assert {("device-plugin", "--health-recovery-seconds"), ("dra-plugin", "--health-recovery-seconds"),
            ("run", "--interval"), ("scheduler-extender", "--request-timeout")} <= names


@pytest.mark.parametrize(("name", "option"), DURATIONS, ids=[f"{n}:{o.opts[0]}" for n, o in DURATIONS])
def test_every_time_option_shows_its_default_as_a_duration_it_takes(name: str, option: click.Option) -> None:
    entry = help_of(name, option)
    if isinstance(option.show_default, str):  # run --interval: its default is the config's, said in words
        assert "[default: (flags.gfd.sleepInterval, else 60s)]" in entry
        return
    shown = re.search(r"\[default: ([^\]]+)\]", entry)
    assert shown is not None, entry
    assert re.fullmatch(r"\d+(ms|s)", shown.group(1)), entry  # 60s, not 60.0
    assert parse_duration(shown.group(1)) == option.type.convert(option.default, option, None)


def test_health_recovery_shows_60s_and_takes_2m_and_its_minimum_error_is_a_duration() -> None:
    command = main.get_command(click.Context(main), "device-plugin")
    assert command is not None
    assert command.make_context("device-plugin", ["--health-recovery-seconds", "2m"]).params[
        "health_recovery_seconds"] == 120.0
    mps = CliRunner().invoke(main, ["mps-control-daemon", "--check-interval", "10ms"])
    assert mps.exit_code == 2
    assert "'10ms' is shorter than the minimum of 50ms" in mps.stderr


@pytest.mark.parametrize(("seconds", "text"), [(0.01, "10ms"), (0.05, "50ms"), (0.5, "500ms"), (1, "1s"),
                                               (60, "60s"), (1.5, "1.5s"), (0, "0s")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
