"""Talking to one MPS control daemon and to the GPUs' compute mode, as NVIDIA's
``cmd/mps-control-daemon/mps/daemon.go`` does: ``nvidia-cuda-mps-control -d`` starts it, and every
command is one run of ``nvidia-cuda-mps-control`` with the command on stdin, in the environment
that names the daemon's pipe and log directories. ``nvidia-smi -i <UUID> -c EXCLUSIVE_PROCESS``
before a start (only the MPS server may then use the GPU), ``DEFAULT`` after a stop."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from vendors.nvidia import mps


class CommandFailed(Exception):
    """A command that failed, timed out or could not be run; the message is one line."""


@dataclass(frozen=True)
class Tools:
    mps_control: str = "nvidia-cuda-mps-control"
    nvidia_smi: str = "nvidia-smi"
    timeout_s: float = 10.0


def daemon_env(root: str, resource: str) -> dict[str, str]:
    return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": mps.pipe_dir(root, resource),
            "CUDA_MPS_LOG_DIRECTORY": mps.log_dir(root, resource)}


def run(argv: list[str], tools: Tools, env: Mapping[str, str] | None = None, stdin: str | None = None) -> str:
    """Run ``argv``; its stdout, or CommandFailed naming the command and what it said."""
    shown = " ".join(argv) + (f" <<< {stdin.strip()}" if stdin else "")
    try:
        result = subprocess.run(argv, input=stdin, env=dict(env) if env is not None else None, capture_output=True,
                                text=True, timeout=tools.timeout_s, check=False)
    except FileNotFoundError:
        raise CommandFailed(f"{argv[0]}: not found (the NVIDIA container toolkit provides it with "
                            "NVIDIA_DRIVER_CAPABILITIES compute,utility)") from None
    except subprocess.TimeoutExpired:
        raise CommandFailed(f"{shown}: no answer within {tools.timeout_s:g}s") from None
    except OSError as exc:
        raise CommandFailed(f"{shown}: {exc.strerror or exc}") from None
    if result.returncode != 0:
        said = " ".join((result.stderr or result.stdout).split())[:300]
        raise CommandFailed(f"{shown}: exit code {result.returncode}" + (f": {said}" if said else ""))
    return result.stdout


def command(root: str, resource: str, line: str, tools: Tools) -> str:
    """Send one command to the control daemon of ``resource``; its answer, stripped."""
    return run([tools.mps_control], tools, daemon_env(root, resource), line + "\n").strip()


def start(root: str, resource: str, tools: Tools) -> None:
    for directory in (mps.pipe_dir(root, resource), mps.log_dir(root, resource)):
        os.makedirs(directory, mode=0o755, exist_ok=True)
    run([tools.mps_control, "-d"], tools, daemon_env(root, resource))


def compute_mode(uuids: list[str], mode: str, tools: Tools) -> None:
    for uuid in uuids:
        run([tools.nvidia_smi, "-i", uuid, "-c", mode], tools)
