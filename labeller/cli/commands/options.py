"""Command-line plumbing every command shares: the one-line bad-input error, the node options
(--host-root, --simulate, --config, --config-dir, --config-name; --config-label, --node-name,
--kubeconfig), which reach the command as one ``NodeOptions``, and how an option's value is named in
an error: its flag, or the environment variable it was read from (``MIG_STRATEGY=bogus``)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar, overload

import click
from click.core import ParameterSource

from labeller.cli.commands.completion import complete_node_names, complete_profiles
from labeller.cli.commands.params import Duration
from labeller.base.errors import InputError
from labeller.host.machine import NodeOptions
from labeller.model.namedconfigs import CONFIG_LABEL

F = TypeVar("F", bound=Callable[..., Any])


class BadInput(click.ClickException):
    """Bad user input (config, profile, flag value): one line on stderr, exit code 2."""

    exit_code = 2


def parent_must_exist(directory: Path, param_name: str) -> None:
    """BadInput naming ``directory``'s parent when it is missing: a socket directory is created when it
    is not there (the kubelet may not have made it yet), but a whole missing tree is a wrong path. The
    option is named as it was given (``--socket-dir /x`` or ``DP_SOCKET_DIR=/x``)."""
    if not directory.parent.is_dir():
        raise BadInput(f"{given_as(param_name, directory)}: directory {directory.parent} does not exist")


# --- an option's value in an error: its flag, or the environment variable it came from -----------

def environment_variable(ctx: click.Context, param: click.Parameter) -> str | None:
    """The environment variable ``param`` was read from in ``ctx`` (as click looks: its envvar names in
    order, then the automatic GPU_LABELLER_<COMMAND>_<NAME>); None when it was not read from one."""
    if param.name is None or ctx.get_parameter_source(param.name) is not ParameterSource.ENVIRONMENT:
        return None
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    if isinstance(param, click.Option) and param.allow_from_autoenv and ctx.auto_envvar_prefix:
        names.append(f"{ctx.auto_envvar_prefix}_{param.name.upper()}")
    return next((name for name in names if os.environ.get(name)), None)


def from_environment(exc: click.BadParameter) -> BadInput | None:
    """A bad value read from an environment variable, as one line naming the variable and its value
    (``MIG_STRATEGY=bogus (for --mig-strategy): ...``) instead of click's usage error about the
    option the user never typed; None when the value did not come from the environment."""
    if exc.ctx is None or exc.param is None or (name := environment_variable(exc.ctx, exc.param)) is None:
        return None
    flag = exc.param.opts[0] if exc.param.opts else exc.param.name
    return BadInput(f"{name}={os.environ.get(name, '')} (for {flag}): {exc.message}")


def given_as(param_name: str, value: object) -> str:
    """How the running command was given ``value`` of its option ``param_name``, for an error about
    it: ``--socket-dir /x``, or ``DP_SOCKET_DIR=/x`` when it was read from that environment variable."""
    ctx = click.get_current_context()
    param = next(p for p in ctx.command.params if p.name == param_name)
    variable = environment_variable(ctx, param)
    return f"{variable}={value}" if variable else f"{param.opts[0] if param.opts else param_name} {value}"


def _named_from_environment(exc: InputError, given: dict[str, Any]) -> InputError:
    """``exc`` with a leading ``<value>: `` of a node option read from the environment shown as
    ``<VARIABLE>=<value>: `` (a profile, config file or config directory that cannot be used)."""
    ctx = click.get_current_context(silent=True)
    message = str(exc)
    for param in ctx.command.params if ctx is not None else ():
        value = given.get(param.name or "")
        if value is not None and message.startswith(f"{value}: ") and ctx is not None \
                and (name := environment_variable(ctx, param)) is not None:
            return InputError(f"{name}={message}")
    return exc


# --- the node options ----------------------------------------------------------------------------

NODE_OPTIONS = frozenset(f.name for f in fields(NodeOptions))


def _as_node_options(func: F) -> F:
    """The command gets the node options it was given as one ``node_options: NodeOptions``."""
    if getattr(func, "__gathers_node_options__", False):
        return func

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in NODE_OPTIONS & kwargs.keys()}
        try:
            return func(*args, node_options=NodeOptions(**given), **kwargs)
        except InputError as exc:
            raise _named_from_environment(exc, given) from None

    command.__gathers_node_options__ = True  # type: ignore[attr-defined]
    return command  # type: ignore[return-value]


def discovery_options(func: F) -> F:
    """``--host-root``, ``--simulate``, ``--config``, ``--config-dir``, ``--config-name``; the command
    gets them (and any other node option it declares) as ``node_options``."""
    func = _as_node_options(func)
    func = click.option(
        "--config-name", metavar="NAME", envvar="CONFIG_NAME",
        help="With --config-dir: the config a node without the config label gets (default: the one called "
             "'default', else the only one); on a dry run, what a node labelled NAME gets. [env: CONFIG_NAME]",
    )(func)
    func = click.option(
        "--config-dir", type=click.Path(path_type=Path, file_okay=False), envvar="CONFIG_DIR",
        help="Directory of named configs, one file per name (a mounted ConfigMap), instead of --config. "
             "[env: CONFIG_DIR]",
    )(func)
    func = click.option(
        "--config", "--config-file", "config_path", type=click.Path(path_type=Path, dir_okay=False),
        envvar="CONFIG_FILE",
        help="Config file (NVIDIA device-plugin config v1 format plus a 'labeller' section); --config-file is "
             "NVIDIA's name for it. [env: CONFIG_FILE]",
    )(func)
    func = click.option(
        "--simulate", metavar="PROFILE|FILE", envvar="GPU_LABELLER_SIMULATE", shell_complete=complete_profiles,
        help="Replay a built-in profile (see 'gpu-labeller profiles') or a profile file instead of this machine. "
             "[env: GPU_LABELLER_SIMULATE]",
    )(func)
    func = click.option(
        "--host-root", type=click.Path(path_type=Path, file_okay=False), default=Path("/"), show_default=True,
        envvar="HOST_ROOT",
        help="Where the host's filesystem is mounted (a DaemonSet mounts it at e.g. /host). [env: HOST_ROOT]",
    )(func)
    return func


def config_label_option(func: F) -> F:
    """``--config-label``, for the commands that follow a node (``run``, ``device-plugin``)."""
    func = _as_node_options(func)
    return click.option(
        "--config-label", metavar="KEY", default=CONFIG_LABEL, show_default=True, envvar="GPU_LABELLER_CONFIG_LABEL",
        help="With --config-dir: the node label whose value names this node's config (NVIDIA's config-manager "
             "label); '' follows none. [env: GPU_LABELLER_CONFIG_LABEL]")(func)


def node_name_option(help: str, envvar: tuple[str, ...] = ("NODE_NAME",)) -> Callable[[F], F]:
    """``--node-name`` (completing the Node names the credentials reach), a node option; ``help`` says
    what the command needs it for, and ends with its ``[env: ...]``."""

    def decorate(func: F) -> F:
        func = _as_node_options(func)
        return click.option("--node-name", envvar=list(envvar), shell_complete=complete_node_names,
                            help=help)(func)

    return decorate


KUBECONFIG_HELP = ("Kubeconfig file. Default, as kubectl: the files KUBECONFIG lists (':'-separated, merged), "
                   "else ~/.kube/config, else the pod's service account.")


@overload
def kubeconfig_option(func: F) -> F: ...


@overload
def kubeconfig_option(*, when: str) -> Callable[[F], F]: ...


def kubeconfig_option(func: F | None = None, *, when: str = "") -> F | Callable[[F], F]:
    """``--kubeconfig FILE``: every command that talks to the cluster takes it, and finds its credentials
    by the one rule of labeller.cluster.connect (KUBECONFIG is read there, not by click). ``when``: the
    help's leading condition, for a command that talks to the cluster only sometimes
    (``@kubeconfig_option(when="With --cluster (which it implies)")``)."""

    def decorate(func: F) -> F:
        return click.option("--kubeconfig", type=click.Path(dir_okay=False), metavar="FILE",
                            help=f"{when}: {KUBECONFIG_HELP}" if when else KUBECONFIG_HELP)(func)

    return decorate(func) if func is not None else decorate


def own_node_options(node_name_help: str) -> Callable[[F], F]:
    """``--config-label``, ``--node-name`` and ``--kubeconfig``, for the processes on a node that follow
    its config label without writing labels (``device-plugin``, ``dra-plugin``, ``mps-control-daemon``);
    ``node_name_help`` as ``node_name_option``'s."""

    def decorate(func: F) -> F:
        func = kubeconfig_option(func)
        func = node_name_option(node_name_help)(func)
        return config_label_option(func)

    return decorate


def endpoint_options(port: int, ready: str = "") -> Callable[[F], F]:
    """``--metrics-port`` (default ``port``) and ``--metrics-bind`` of a long-running process's health
    and metrics endpoints, which reach the command as one ``endpoint`` (labeller.process.serve.Endpoint);
    ``ready`` says when /readyz answers 200, where that needs saying."""
    readyz = f"/readyz ({ready})" if ready else "/readyz"

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def command(*args: Any, metrics_port: int, metrics_bind: str, **kwargs: Any) -> Any:
            from labeller.process.serve import Endpoint  # the process layer: never on a dry run's path

            return func(*args, endpoint=Endpoint(metrics_port, metrics_bind), **kwargs)

        decorated: F = click.option("--metrics-bind", default="0.0.0.0", show_default=True,
                                    help="Address the metrics server binds.")(command)  # type: ignore[assignment]
        return click.option("--metrics-port", type=click.IntRange(0, 65535), default=port, show_default=True,
                            help=f"Port for /healthz, {readyz} and /metrics (0: any free port).")(decorated)

    return decorate


def health_recovery_option(then: str) -> Callable[[F], F]:
    """``--health-recovery-seconds`` of the plugins; ``then``: what becomes of a device that recovered."""
    return click.option(
        "--health-recovery-seconds", type=Duration(), default="60s", show_default=True,
        envvar="DP_HEALTH_RECOVERY_SECONDS",
        help=f"An Unhealthy device that answers normally, with no new error, for this long (60, 90s, 2m) is {then}. "
             "[env: DP_HEALTH_RECOVERY_SECONDS]")


def mps_tools_options(nvidia_smi_sets: str) -> Callable[[F], F]:
    """``--mps-control`` and ``--nvidia-smi``, the NVIDIA tools of the commands that run MPS control
    daemons; ``nvidia_smi_sets``: what the command sets with nvidia-smi."""

    def decorate(func: F) -> F:
        func = click.option("--nvidia-smi", default="nvidia-smi", show_default=True, envvar="NVIDIA_SMI",
                            help=f"The nvidia-smi binary that sets {nvidia_smi_sets}. [env: NVIDIA_SMI]")(func)
        return click.option("--mps-control", default="nvidia-cuda-mps-control", show_default=True,
                            envvar="MPS_CONTROL",
                            help="The nvidia-cuda-mps-control binary (looked up on PATH). [env: MPS_CONTROL]")(func)

    return decorate


def format_option(*choices: str, help: str | None = None) -> Callable[[F], F]:
    """``--format`` among ``choices`` (default: the first; text and json when none are given), as
    ``fmt``."""
    names = list(choices or ("text", "json"))
    return click.option("--format", "fmt", type=click.Choice(names), default=names[0], show_default=True, help=help)
