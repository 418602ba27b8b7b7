"""The command line below ``labeller.cli.root``'s root: the options every command shares (``options``,
``params``, ``completion``), the dry-run commands (``dryrun``) and the selector tools
(``selectors``). Only this layer, the root and each process's ``cli`` module import click; the
domain raises ``labeller.base.errors.InputError`` and the root prints it as one line, exit code 2."""
