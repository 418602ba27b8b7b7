"""The errors the domain and the cluster layer raise for the command line to report.

They import no command-line library: only ``labeller.cli`` turns them into one line and an exit code.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input the user can fix (a flag, a file, missing credentials). ``str()`` is one line; the
    command line prints it as ``Error: <line>`` and exits 2."""
