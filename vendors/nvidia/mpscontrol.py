"""One MPS control daemon and the GPU settings around it, driven through NVIDIA's tools as NVIDIA's
``cmd/mps-control-daemon/mps/daemon.go`` and its DRA driver's ``sharing.go`` do:
``nvidia-cuda-mps-control -d`` starts a daemon, and every command is one run of
``nvidia-cuda-mps-control`` with the command on stdin, in the environment that names the daemon's
pipe and log directories. ``nvidia-smi -i <UUID> -c EXCLUSIVE_PROCESS`` before a start (only the
MPS server may then use the GPU), ``DEFAULT`` after a stop; ``nvidia-smi compute-policy -i <UUID>
--set-timeslice <0-3>`` sets a GPU's time slice.

``Daemon`` is the one supervision of a daemon, shared by ``gpu-labeller mps-control-daemon`` (a
daemon per MPS resource of the device plugin, ``labeller.apps.mps.supervisor``) and the DRA plugin (a
daemon per MPS config of a prepared claim, ``vendors.nvidia.draconfig``): whether it answers as
configured, starting and configuring it, stopping it.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from vendors.nvidia import mps
from labeller.base.log import get_logger

log = get_logger(__name__)

PID_FILE = "nvidia-cuda-mps-control.pid"  # what the control daemon writes into its pipe directory
DEFAULT_PERCENTAGE = 100  # what a daemon reports before it is told a percentage


class CommandFailed(Exception):
    """A command that failed, timed out or could not be run; the message is one line."""


@dataclass(frozen=True)
class Tools:
    mps_control: str = "nvidia-cuda-mps-control"
    nvidia_smi: str = "nvidia-smi"
    timeout_s: float = 10.0


def daemon_env(root: str, name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, **(extra or {}), "CUDA_MPS_PIPE_DIRECTORY": mps.pipe_dir(root, name),
            "CUDA_MPS_LOG_DIRECTORY": mps.log_dir(root, name)}


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


def command(root: str, name: str, line: str, tools: Tools) -> str:
    """Send one command to the control daemon named ``name``; its answer, stripped."""
    return run([tools.mps_control], tools, daemon_env(root, name), line + "\n").strip()


def start(root: str, name: str, tools: Tools, env: Mapping[str, str] | None = None) -> None:
    for directory in (mps.pipe_dir(root, name), mps.log_dir(root, name)):
        os.makedirs(directory, mode=0o755, exist_ok=True)
    run([tools.mps_control, "-d"], tools, daemon_env(root, name, env))


def compute_mode(uuids: list[str], mode: str, tools: Tools) -> None:
    for uuid in uuids:
        run([tools.nvidia_smi, "-i", uuid, "-c", mode], tools)


def set_timeslice(uuids: list[str], interval: int, tools: Tools) -> None:
    """Each GPU's time slice: 0 (Default), 1 (Short), 2 (Medium) or 3 (Long), as NVIDIA's DRA driver sets it."""
    for uuid in uuids:
        run([tools.nvidia_smi, "compute-policy", "-i", uuid, "--set-timeslice", str(interval)], tools)


@dataclass(frozen=True)
class Plan:
    """What one daemon must be: its name (its directories under the root: a resource name, or an
    MPS config's ID in a claim), the GPUs set to EXCLUSIVE_PROCESS around it, the limits each client
    gets, and what else its environment holds (``CUDA_VISIBLE_DEVICES``)."""

    name: str
    uuids: tuple[str, ...]  # whole GPUs whose compute mode it owns
    pinned_mib: tuple[tuple[str, int], ...] = ()  # (device as the daemon names it: an index or a UUID, MiB)
    percentage: int | None = None  # None: left at the daemon's default (100)
    env: tuple[tuple[str, str], ...] = ()

    @property
    def expected_percentage(self) -> float:
        return float(self.percentage if self.percentage is not None else DEFAULT_PERCENTAGE)


class Daemon:
    """One control daemon."""

    def __init__(self, plan: Plan, root: str, tools: Tools):
        self.plan, self.root, self.tools = plan, root, tools
        self.ready = False
        self.starts = 0
        self.problem: str | None = None

    @property
    def name(self) -> str:
        return self.plan.name

    def _command(self, line: str) -> str:
        return command(self.root, self.plan.name, line, self.tools)

    def _answers(self) -> bool:
        """The daemon answers with the percentage it was given."""
        try:
            return float(self._command("get_default_active_thread_percentage")) == self.plan.expected_percentage
        except (CommandFailed, ValueError):
            return False

    def _configure(self) -> None:
        for device, mib in self.plan.pinned_mib:
            self._command(f"set_default_device_pinned_mem_limit {device} {mib}M")
        if self.plan.percentage is not None:
            self._command(f"set_default_active_thread_percentage {self.plan.percentage}")

    def healthy(self) -> bool:
        """It answers as configured; marks it ready when it does."""
        if self._answers():
            self._settle(None)
            return True
        return False

    def repair(self) -> bool:
        """Start it (when it does not run) and configure it; ready afterwards?"""
        try:
            if not self._running():
                compute_mode(list(self.plan.uuids), "EXCLUSIVE_PROCESS", self.tools)
                start(self.root, self.plan.name, self.tools, dict(self.plan.env))
                self.starts += 1
            self._configure()
        except CommandFailed as exc:
            self._settle(str(exc))
            return False
        ok = self._answers()
        self._settle(None if ok else "the daemon does not report the thread percentage it was given")
        return ok

    def _running(self) -> bool:
        if not os.path.isdir(mps.pipe_dir(self.root, self.plan.name)):
            return False  # never started here: no need to ask
        try:
            self._command("get_default_active_thread_percentage")
            return True
        except CommandFailed:
            return False

    def _settle(self, problem: str | None) -> None:
        ready = problem is None
        if ready != self.ready or problem != self.problem:
            if ready:
                log.info("MPS daemon ready", daemon=self.plan.name, devices=len(self.plan.uuids),
                         thread_percentage=self.plan.percentage, starts=self.starts)
            else:
                log.warning("MPS daemon not ready", daemon=self.plan.name, reason=problem)
        self.ready, self.problem = ready, problem

    def stop(self) -> str | None:
        """Quit it and give its GPUs their DEFAULT compute mode back; what could not be done, or None."""
        pid = self._pid()
        try:
            self._command("quit")
        except CommandFailed as exc:
            log.info("MPS daemon did not take quit (gone already?)", daemon=self.plan.name, reason=str(exc))
        else:
            reap(pid)
        self.ready = False
        try:
            compute_mode(list(self.plan.uuids), "DEFAULT", self.tools)
        except CommandFailed as exc:
            log.warning("compute mode not restored", daemon=self.plan.name, reason=str(exc))
            return f"compute mode not restored: {exc}"
        return None

    def _pid(self) -> int | None:
        try:
            with open(os.path.join(mps.pipe_dir(self.root, self.plan.name), PID_FILE), encoding="ascii") as file:
                return int(file.read(32).strip())
        except (OSError, ValueError):
            return None


def reap(pid: int | None) -> None:
    """As PID 1 of its container, collect a daemon that ``-d`` left to us once it exits (on a thread:
    it quits in its own time). Anyone else's children are left to their own ``wait``."""
    if pid is None or os.getpid() != 1:
        return

    def wait() -> None:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    threading.Thread(target=wait, name=f"reap-{pid}", daemon=True).start()
