"""The ``gpu-labeller`` command line: the root group and its commands.

Commands that talk to a cluster or serve gRPC are imported only when invoked (``LAZY_COMMANDS``),
so the dry-run path (``labels``, ``resources``, ``resourceslices``, ``probe``, ``profiles``) never loads the
kubernetes client or grpc. A domain error (``labeller.base.errors.InputError``) raised by any command
is printed here as one line, with exit code 2; a cluster failure (``labeller.base.errors.ClusterError``:
the API server cannot be reached or failed) as one line with exit code 1.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from labeller.cli.commands import dryrun
from labeller.cli.commands.options import BadInput, from_environment
from labeller.base.errors import ClusterError, InputError
from labeller.base.log import LEVELS, configure

# name -> ("module:attribute" of a click command loaded on first use, short help for --help)
LAZY_COMMANDS = {
    "run": ("labeller.cli.commands.run:run", "Keep this node's labels true on the cluster (the DaemonSet's job)."),
    "cleanup": ("labeller.cli.commands.cleanup:cleanup", "Remove the labels gpu-labeller set (for uninstall)."),
    "device-plugin": ("labeller.cli.commands.device_plugin:device_plugin",
                      "Serve this node's GPUs to the kubelet (device plugin API v1beta1)."),
    "dra-plugin": ("labeller.cli.commands.dra_plugin:dra_plugin",
                   "Publish this node's GPUs as ResourceSlices and prepare their claims (kubelet DRA plugin)."),
    "mps-control-daemon": ("labeller.cli.commands.mps:mps_control_daemon",
                           "Run and watch the NVIDIA MPS control daemons sharing.mps needs."),
    "scheduler-extender": ("labeller.cli.commands.extender:scheduler_extender",
                           "Schedule pods by GPU memory (aliyun.com/gpu-mem), gpushare-compatible."),
    "inspect": ("labeller.cli.commands.extender:inspect",
                "Per node and GPU: total, used and free GPU memory and its pods."),
    "explain": ("labeller.cli.commands.selectors:explain",
                "Say where each label comes from, or why a key is not produced."),
    "match": ("labeller.cli.commands.selectors:match",
              "Which nodes a label selector or a node affinity would land on."),
    "nodes": ("labeller.cli.commands.selectors:nodes",
              "The GPU nodes of a cluster at a glance: models, resources, use, readiness."),
}


def _as_click_error(exc: InputError | ClusterError) -> click.ClickException:
    """``Error: <line>``: exit 2 for bad input, 1 for a cluster that failed (click's default)."""
    return BadInput(str(exc)) if isinstance(exc, InputError) else click.ClickException(str(exc))


def _visible_suggestions(exc: click.NoSuchOption) -> click.NoSuchOption:
    """click's "No such option" with "did you mean" drawn from the options --help shows: never one of
    the hidden upstream flags (``--fromat`` suggests ``--format``, not AMD's ``--firmware``)."""
    if not exc.possibilities or exc.ctx is None:
        return exc
    visible = [name for param in exc.ctx.command.get_params(exc.ctx)
               if isinstance(param, click.Option) and not param.hidden
               for name in (*param.opts, *param.secondary_opts)]
    return click.NoSuchOption(exc.option_name, possibilities=visible, ctx=exc.ctx)


# A link to gpu-labeller by one of these names runs that command: kubectl finds plugins by name on PATH.
KUBECTL_PLUGINS = {"kubectl-inspect-gpushare": ("inspect", "kubectl inspect gpushare")}


class LazyGroup(click.Group):
    """The root command: loads the commands that need the cluster or grpc on first use, and is the
    one place where the domain's InputError becomes click's one line (``Error: ...``, exit code 2), a
    bad value from an environment variable a line naming it, and "did you mean" offers only options
    --help shows."""

    def main(self, args: Any = None, prog_name: str | None = None, *rest: Any, **extra: Any) -> Any:
        plugin = KUBECTL_PLUGINS.get(os.path.basename(sys.argv[0]))
        if args is None and plugin is not None:
            name, prog = plugin
            command = self.get_command(click.Context(self), name)
            assert command is not None
            configure("warning", json_output=False)
            try:
                return command.main(sys.argv[1:], prog, *rest, **extra)
            except (InputError, ClusterError) as exc:  # the command ran outside this group's invoke
                error = _as_click_error(exc)
                error.show()
                sys.exit(error.exit_code)
        return super().main(args, prog_name, *rest, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (InputError, ClusterError) as exc:
            raise _as_click_error(exc) from None
        except click.NoSuchOption as exc:
            raise _visible_suggestions(exc) from None
        except click.BadParameter as exc:
            raise from_environment(exc) or exc from None

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.BadParameter as exc:  # the root's own options (GPU_LABELLER_LOG_LEVEL)
            raise from_environment(exc) or exc from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing must not import the lazy commands (that would load kubernetes and grpc).
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS:
                rows.append((name, LAZY_COMMANDS[name][1]))
            elif (command := super().get_command(ctx, name)) is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module_name, attribute = LAZY_COMMANDS[cmd_name][0].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup,
             context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "GPU_LABELLER"})
@click.version_option(package_name="gpu-labeller", prog_name="gpu-labeller")
@click.option("--log-level", type=click.Choice(LEVELS), default="info", show_default=True, help="Log verbosity.")
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto", show_default=True,
              help="auto: JSON inside Kubernetes or when stderr is not a terminal.")
def main(log_level: str, log_format: str) -> None:
    """Label Kubernetes nodes with their NVIDIA and AMD GPUs, and serve those GPUs to pods."""
    configure(log_level, None if log_format == "auto" else log_format == "json")


for _command in (dryrun.labels, dryrun.probe, dryrun.resources, dryrun.resourceslices, dryrun.profiles,
                 dryrun.completion):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
