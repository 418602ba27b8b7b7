"""Running ``gpu-labeller`` as a user does: a real process, its exit code, stdout and stderr."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

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


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failure prints on stderr; fails the test if there is more, or a traceback."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), result.stderr
    return lines[0]
