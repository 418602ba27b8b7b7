"""Running ``gpu-labeller``: as a user does (a real process, its exit code, stdout and stderr), or in this
process through click's runner, with the same result, where a test only checks what a command prints
and its exit code: no interpreter to start, so it stays in the unit tier."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from tests.builders import PATIENCE_S

COMMAND = [sys.executable, "-m", "labeller.cli"]


def gpu_labeller(*args: str, **popen: Any) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion; ``popen`` overrides the defaults (output captured, PATIENCE_S timeout)."""
    options: dict[str, Any] = {"capture_output": True, "text": True, "timeout": PATIENCE_S}
    if "stdout" in popen or "stderr" in popen:
        options.pop("capture_output")
        options.setdefault("stderr", subprocess.PIPE)
    options.update(popen)
    return subprocess.run([*COMMAND, *args], check=False, **options)


def in_process(*args: str, env: dict[str, str] | None = None, input: str | None = None,
               cwd: Path | str | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI run here by click's runner, as ``gpu_labeller`` would run it: ``env`` is the whole environment
    (a variable it lacks is unset), ``input`` standard input, ``cwd`` the working directory. An exception
    that escapes the command (a traceback, for a user) is raised here, so a test cannot pass on it."""
    from labeller.cli.root import main

    changes: dict[str, str | None] = {}
    if env is not None:
        changes = {name: None for name in os.environ if name not in env}
        changes.update(env)
    with _working_directory(cwd):
        result = CliRunner().invoke(main, list(args), env=changes, input=input, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["gpu-labeller", *args], result.exit_code, result.stdout, result.stderr)


@contextmanager
def _working_directory(cwd: Path | str | None) -> Iterator[None]:
    if cwd is None:
        yield
        return
    before = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failure prints on stderr; fails the test if there is more, or a traceback."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), result.stderr
    return lines[0]
