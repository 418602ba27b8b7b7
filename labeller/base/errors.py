"""The errors the domain and the cluster layer raise for the command line to report.

They import no command-line library: only ``labeller.cli.root`` turns them into one line and an exit code
(the table: 0 ok, 1 runtime or cluster failure, 2 bad input, 130 interrupted).
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input the user can fix (a flag, a file, missing credentials). ``str()`` is one line; the
    command line prints it as ``Error: <line>`` and exits 2."""


class ClusterError(Exception):
    """The cluster failed at run time, not the user's input: its API server cannot be reached, or it
    refused or failed a request. ``str()`` is one line; the command line prints it as
    ``Error: <line>`` and exits 1."""
