"""The command line below ``labeller.cli.root``'s root: the options every command shares (``options``,
``params``, ``completion``), the dry-run commands (``dryrun``), the selector tools (``selectors``),
``cleanup``, and each long-running process's command (``run``, ``device_plugin``, ``dra_plugin``,
``extender``, ``mps``: its options and its ``Process`` for ``labeller.process.serve``). Only this
layer and the root import click; the domain raises ``labeller.base.errors.InputError`` and the root
prints it as one line, exit code 2."""
