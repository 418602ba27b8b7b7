"""MPS: the readiness file, the limits, and the control daemons run against the stand-in
``nvidia-cuda-mps-control`` and ``nvidia-smi`` (tests/fakes/bin), which record what they are told."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labeller.model.config import parse_config
from labeller.apps.mps.supervisor import Supervisor, Wanted, plans
from tests.builders import config_map_volume, mps_ready, nvidia, nvidia_gpu, offer_of, promptly, wait_for
from tests.core.cli import gpu_labeller
from tests.processes import LoggedProcess
from vendors import RESOURCE_NAMES
from vendors.nvidia import mps
from vendors.nvidia.model import MpsServed
from vendors.nvidia.mpscontrol import Tools

FAKES = Path(__file__).resolve().parents[1] / "fakes" / "bin"
TOOLS = Tools(mps_control=str(FAKES / "nvidia-cuda-mps-control"), nvidia_smi=str(FAKES / "nvidia-smi"))
GPU = "nvidia.com/gpu"
FAKES_FIRST = {"PATH": f"{FAKES}:{os.environ['PATH']}"}  # the stand-ins before any real tool


def mps_config(root: Path, **entry: object) -> dict[str, object]:
    return {"flags": {"mpsRoot": str(root)}, "sharing": {"mps": {"resources": [{"name": GPU, "replicas": 4, **entry}]}}}


@pytest.fixture
def root() -> Iterator[Path]:
    """A short MPS root (the daemons' unix sockets live under it); every fake daemon is killed after."""
    path = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    yield path
    for pid_file in path.glob("**/nvidia-cuda-mps-control.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    shutil.rmtree(path, ignore_errors=True)


def commands(root: Path, resource: str = GPU) -> list[str]:
    """What the resource's daemons were told, in order (START for each daemon started)."""
    log = Path(mps.log_dir(str(root), resource)) / "control.log"
    return [line.split("] ", 1)[1] for line in log.read_text().splitlines()] if log.exists() else []


def served_now(root: Path) -> tuple[MpsServed, ...]:
    return mps.read_readiness(str(root)).served


# --- limits and the readiness file ---------------------------------------------------------------

def test_limits_are_memory_and_threads_divided_by_the_replicas(root: Path) -> None:
    inventory = nvidia(nvidia_gpu(0), nvidia_gpu(1))
    (held,) = offer_of(inventory, mps_config(root, replicas=3)).held
    assert held.waiting and "readiness was not read" in held.reason  # a hand-made inventory, not probed
    assert mps.pinned_memory_limits(held.resource) == {0: 40 * 1024 // 3, 1: 40 * 1024 // 3}
    assert mps.active_thread_percentage(held.resource) == 33


@pytest.mark.parametrize(("text", "problem"), [
    ("not json", "unreadable"),
    ('{"kind": "something-else"}', "unreadable: not a gpu-labeller/mps-ready document"),
    ('{"kind": "gpu-labeller/mps-ready", "heartbeat": 1000, "staleAfterSeconds": 30, "served": [{"resource": 1}]}',
     "unreadable: a served entry lacks"),
    ('{"kind": "gpu-labeller/mps-ready", "heartbeat": 1000, "staleAfterSeconds": 30, "served": []}',
     "stale: last heartbeat 70s ago"),
])
def test_a_bad_or_stale_readiness_file_serves_nothing(text: str, problem: str) -> None:
    readiness = mps.parse_ready(text, now=1070)
    assert readiness.served == () and readiness.problem is not None and readiness.problem.startswith(problem)


def test_replicas_are_advertised_only_for_exactly_what_the_daemon_serves(root: Path) -> None:
    inventory = nvidia(nvidia_gpu(0), nvidia_gpu(1))
    config = parse_config(mps_config(root), RESOURCE_NAMES)
    ready = mps_ready(inventory, config)
    (resource,) = offer_of(ready, config).resources
    assert resource.strategy == "mps" and len(resource.devices) == 8
    # a daemon serving other replicas (an older config) does not count
    other = parse_config(mps_config(root, replicas=2), RESOURCE_NAMES)
    (held,) = offer_of(mps_ready(inventory, other), config).held
    assert held.waiting and "with other devices or replicas" in held.reason


def test_a_gpu_before_volta_takes_16_clients(root: Path) -> None:
    from dataclasses import replace
    old = replace(nvidia_gpu(0), compute_capability=(6, 1))
    (held,) = offer_of(nvidia(old), mps_config(root, replicas=20)).held
    assert not held.waiting and "accepts 16 clients" in held.reason


# --- the control daemons -------------------------------------------------------------------------

def supervisor_for(root: Path, config: dict[str, object], tools: Tools = TOOLS) -> tuple[Supervisor, list[Wanted]]:
    inventory = nvidia(nvidia_gpu(0), nvidia_gpu(1))
    wanted = plans(offer_of(inventory, config))
    supervisor = Supervisor(str(root), tools, interval_s=0.2)
    supervisor.want(wanted)
    return supervisor, wanted


def test_a_daemon_is_started_configured_and_declared_ready(root: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVIDIA_SMI_LOG", str(tmp_path / "smi.log"))
    supervisor, (plan,) = supervisor_for(root, mps_config(root))
    assert not supervisor.ready
    promptly(supervisor.round)
    assert supervisor.ready
    # NVIDIA's sequence: limits per GPU (MiB = memory / replicas), then the thread percentage
    assert commands(root)[:4] == ["START", "CMD: set_default_device_pinned_mem_limit 0 10240M",
                                  "CMD: set_default_device_pinned_mem_limit 1 10240M",
                                  "CMD: set_default_active_thread_percentage 25"]
    assert (tmp_path / "smi.log").read_text().split("\n")[:2] == ["GPU-0 EXCLUSIVE_PROCESS", "GPU-1 EXCLUSIVE_PROCESS"]
    assert served_now(root) == (plan.served,)
    assert Path(mps.pipe_dir(str(root), GPU)).is_dir() and Path(mps.shm_dir(str(root))).is_dir()
    promptly(supervisor.stop)
    assert commands(root)[-2:] == ["CMD: quit", "QUIT"]
    assert (tmp_path / "smi.log").read_text().split("\n")[-3:-1] == ["GPU-0 DEFAULT", "GPU-1 DEFAULT"]
    assert not mps.ready_file(str(root)).exists()


def test_a_daemon_that_dies_is_taken_out_of_the_readiness_file_and_started_again(root: Path) -> None:
    supervisor, (plan,) = supervisor_for(root, mps_config(root))
    promptly(supervisor.round)
    pid_file = Path(mps.pipe_dir(str(root), GPU)) / "nvidia-cuda-mps-control.pid"
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    written: list[tuple[MpsServed, ...]] = []
    original = supervisor._write

    def spy() -> None:
        original()
        written.append(served_now(root))

    supervisor._write = spy  # type: ignore[method-assign]
    promptly(supervisor.round)
    assert written[0] == ()  # out before the restart
    assert written[-1] == (plan.served,)
    assert commands(root).count("START") == 2
    assert commands(root)[-5:] == ["START", "CMD: set_default_device_pinned_mem_limit 0 10240M",
                                   "CMD: set_default_device_pinned_mem_limit 1 10240M",
                                   "CMD: set_default_active_thread_percentage 25",
                                   "CMD: get_default_active_thread_percentage"]
    promptly(supervisor.stop)


def test_a_daemon_that_lost_its_settings_is_configured_again_without_a_restart(root: Path) -> None:
    supervisor, _ = supervisor_for(root, mps_config(root))
    promptly(supervisor.round)
    subprocess.run([TOOLS.mps_control], input="set_default_active_thread_percentage 100\n", text=True, check=True,
                   env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": mps.pipe_dir(str(root), GPU),
                        "CUDA_MPS_LOG_DIRECTORY": mps.log_dir(str(root), GPU)})
    promptly(supervisor.round)
    assert supervisor.ready and commands(root).count("START") == 1
    assert commands(root)[-2:] == ["CMD: set_default_active_thread_percentage 25",
                                   "CMD: get_default_active_thread_percentage"]
    promptly(supervisor.stop)


def test_a_compute_mode_that_cannot_be_set_is_not_ready(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVIDIA_SMI_FAIL", "1")
    supervisor, _ = supervisor_for(root, mps_config(root))
    promptly(supervisor.round)
    (daemon,) = supervisor.daemons.values()
    assert not supervisor.ready and daemon.problem is not None and "Insufficient Permissions" in daemon.problem
    assert served_now(root) == () and commands(root) == []
    missing = Tools(mps_control="/nonexistent/nvidia-cuda-mps-control", nvidia_smi=TOOLS.nvidia_smi)
    monkeypatch.delenv("FAKE_NVIDIA_SMI_FAIL")
    supervisor, _ = supervisor_for(root, mps_config(root), missing)
    promptly(supervisor.round)
    (daemon,) = supervisor.daemons.values()
    assert daemon.problem is not None and daemon.problem.startswith("/nonexistent/nvidia-cuda-mps-control: not found")


def test_a_subset_gets_its_own_daemon_under_its_own_name(root: Path) -> None:
    supervisor, (plan,) = supervisor_for(root, mps_config(root, devices=[1], rename="gpu-mps"))
    assert plan.resource == "nvidia.com/gpu-mps" and plan.uuids == ("GPU-1",)
    promptly(supervisor.round)
    assert commands(root, "nvidia.com/gpu-mps")[1:3] == ["CMD: set_default_device_pinned_mem_limit 1 10240M",
                                                          "CMD: set_default_active_thread_percentage 25"]
    promptly(supervisor.stop)


def test_the_command_runs_daemons_until_sigterm(root: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"version": "v1", **mps_config(root)}))
    with LoggedProcess("mps-control-daemon", "--simulate", "l40s-x4-mps", "--config", str(config),
                       "--check-interval", "0.2", "--metrics-port", "0", env=FAKES_FIRST) as process:
        (served,) = wait_for(lambda: served_now(root))
        assert (served.resource, served.replicas, len(served.devices)) == (GPU, 4, 4)
        # what the labeller and the plugin derive from it, through the real CLI
        labels = gpu_labeller("labels", "--simulate", "l40s-x4-mps", "--config", str(config))
        assert "nvidia.com/mps.capable=true" in labels.stdout and "nvidia.com/gpu.replicas=4" in labels.stdout
        assert process.stop() == 0, process.log
    assert process.count("MPS daemon ready") >= 1
    assert not mps.ready_file(str(root)).exists() and commands(root)[-1] == "QUIT"
    labels = gpu_labeller("labels", "--simulate", "l40s-x4-mps", "--config", str(config))
    assert "nvidia.com/mps.capable=false" in labels.stdout


def test_the_command_follows_the_named_config_and_its_edits(root: Path, tmp_path: Path) -> None:
    # A ConfigMap whose config turns MPS on, then off again: the daemons start and stop with it,
    # with no restart, as the plugin and the labeller follow the same directory.
    configs = tmp_path / "configs"
    whole = {"version": "v1", "flags": {"mpsRoot": str(root)}}
    config_map_volume(configs, {"default": whole})
    with LoggedProcess("mps-control-daemon", "--simulate", "l40s-x4-mps", "--config-dir", str(configs),
                       "--config-label", "", "--check-interval", "30s", "--metrics-port", "0",
                       env=FAKES_FIRST) as process:
        wait_for(lambda: mps.ready_file(str(root)).exists())
        assert served_now(root) == ()  # no config asks for MPS: no daemon
        config_map_volume(configs, {"default": {"version": "v1", **mps_config(root)}})
        changed = time.monotonic()
        wait_for(lambda: len(served_now(root)) == 1)
        # The directory is polled every second; starting the daemon runs a dozen stand-in tool processes,
        # seconds on a loaded machine. Either way, before the 30 s check interval would have come.
        assert time.monotonic() - changed < 25
        config_map_volume(configs, {"default": whole})
        wait_for(lambda: served_now(root) == ())  # withdrawn first, then the daemon quits
        wait_for(lambda: commands(root)[-1] == "QUIT")
        assert process.stop() == 0, process.log  # SIGTERM ends the 30 s wait at once
    assert process.count("config directory changed") >= 1 and process.count("MPS daemon ready") >= 1
