"""The ``gpu-labeller`` program's entry point: Ctrl-C ends it with exit code 130 and no traceback.

It installs the SIGINT handler before anything else is imported (loading the kubernetes client takes
a while), so an interrupt at any time is the same: exit 130, nothing printed. The long-running
commands take SIGINT over while they serve (``labeller.process.signals.run_until_signalled``: a clean stop).
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import NoReturn

INTERRUPTED = 130  # the exit code of a program interrupted by SIGINT (128 + 2), as shells report it


def _interrupted(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(INTERRUPTED)  # unwinds like an exception (finally blocks run); click lets it through


def exit_on_interrupt() -> None:
    """From now on SIGINT ends the program: exit code 130, no traceback, no ``Aborted!``."""
    signal.signal(signal.SIGINT, _interrupted)


def main() -> None:
    exit_on_interrupt()
    from labeller.cli.root import main as cli

    cli()


if __name__ == "__main__":  # pragma: no cover
    main()
