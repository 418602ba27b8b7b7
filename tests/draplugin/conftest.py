"""Fixtures for the DRA plugin tests: the plugin on its process loop (as ``gpu-labeller dra-plugin``
runs it, in this process), the fake API server, the kubelet DRA manager stand-in, and NVIDIA's tools'
stand-ins (tests/fakes/bin: ``nvidia-smi`` and ``nvidia-cuda-mps-control``, their calls logged)."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from labeller.cluster.kube import Kube
from labeller.apps.draplugin.app import DraPlugin, probe_inputs
from labeller.apps.draplugin.settings import DraSettings
from labeller.apps.draplugin.taints import DEFAULT_HOLD_S
from labeller.host.machine import Host, NodeOptions, open_host
from labeller.process.configsource import ConfigSource
from labeller.process.loop import LoopOptions, ProcessLoop
from labeller.base.backoff import Backoff
from labeller.model.vendor.dra import ConfigSettings
from tests.builders import wait_for
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet
from tests.plugin.profile_files import write_yaml

FAKES = Path(__file__).resolve().parents[1] / "fakes" / "bin"
NODE = "gpu-node-1"
NVIDIA = "gpu.nvidia.com"
AMD = "gpu.amd.com"
Obj = dict[str, Any]


def dra_config(*vendors: str, memory_unit: str | None = None) -> dict[str, Any]:
    """A config document that serves ``vendors`` through DRA (every vendor by default); with
    ``memory_unit``, sharing GPUs by memory in that unit (``sharing.memory``)."""
    return {"version": "v1", "labeller": {"dra": {"vendors": list(vendors or ("nvidia", "amd"))}},
            **({"sharing": {"memory": {"unit": memory_unit}}} if memory_unit else {})}


@dataclass(frozen=True)
class Dirs:
    registry: Path
    plugins: Path
    cdi: Path
    mps: Path  # --mps-root: short, the daemons' unix sockets live under it


@pytest.fixture
def dirs(sock_dir: Path) -> Iterator[Dirs]:
    """The plugin's directories; every stand-in MPS daemon left under the MPS root is killed after."""
    yield Dirs(sock_dir / "reg", sock_dir / "plugins", sock_dir / "cdi", sock_dir / "mps")
    for pid_file in (sock_dir / "mps").glob("*/pipe/nvidia-cuda-mps-control.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@dataclass(frozen=True)
class ToolLogs:
    """What the stand-ins were told: ``nvidia-smi``'s calls, and every MPS daemon's lines
    (``<daemon ID>: START CUDA_VISIBLE_DEVICES=...``, ``<daemon ID>: CMD: ...``, ``<daemon ID>: QUIT``)."""

    smi_path: Path
    mps_path: Path

    def smi(self) -> list[str]:
        return self.smi_path.read_text().splitlines() if self.smi_path.exists() else []

    def mps(self) -> list[str]:
        return [line.split("] ", 1)[1] for line in self.mps_path.read_text().splitlines()] \
            if self.mps_path.exists() else []


@pytest.fixture
def tool_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ToolLogs:
    logs = ToolLogs(tmp_path / "nvidia-smi.log", tmp_path / "mps-control.log")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_LOG", str(logs.smi_path))
    monkeypatch.setenv("FAKE_MPS_CONTROL_LOG", str(logs.mps_path))
    return logs


@pytest.fixture
def drakubelet(dirs: Dirs) -> Iterator[FakeDraKubelet]:
    with FakeDraKubelet(dirs.registry) as fake:
        yield fake


@dataclass
class Running:
    plugin: DraPlugin
    host: Host
    loop: ProcessLoop
    api: FakeApiServer
    kubelet: FakeDraKubelet
    dirs: Dirs
    exit_code: list[int]

    @property
    def nvml(self) -> ModuleType:
        """The simulated pynvml, with its test hooks (inject_xid, set_lost)."""
        module = self.host.handles["nvidia"]
        assert isinstance(module, ModuleType)
        return module

    def sighup(self) -> None:
        """What SIGHUP does; returns once the loop has probed again."""
        probes = self.plugin.probes
        self.loop.request_reload()
        wait_for(lambda: self.plugin.probes > probes)

    def slices(self, driver: str | None = None) -> list[Obj]:
        return self.api.slices(NODE, driver)

    def devices(self, driver: str = NVIDIA) -> list[str]:
        """The names of the devices published for ``driver`` on this node."""
        return [d["name"] for s in self.slices(driver) for d in s["spec"]["devices"]]

    def device(self, name: str, driver: str = NVIDIA) -> Obj:
        return next(d for s in self.slices(driver) for d in s["spec"]["devices"] if d["name"] == name)

    def claim(self, name: str, *devices: str, driver: str = NVIDIA, pool: str = NODE, namespace: str = "default",
              shared: bool = False, admin: bool = False, requests: list[str] | None = None,
              config: list[Obj] | None = None, consumed: dict[str, str] | None = None) -> Claim:
        """A ResourceClaim allocated to ``devices`` of ``driver`` (as the scheduler leaves it), each for
        its request in ``requests`` (default "gpu"); ``shared``: each result with its own ``shareID``,
        as 1.34's consumable capacity allocates a device that allows multiple allocations; ``consumed``:
        shared, each result consuming that of its device (``consumedCapacity``, ``{"memory": "4Gi"}``);
        ``admin``: allocated for admin access; ``config``: ``status.allocation.devices.config``."""
        results = [{"request": (requests or ["gpu"] * len(devices))[i], "driver": driver, "pool": pool, "device": d,
                    **({"shareID": str(uuid.uuid4())} if shared or consumed is not None else {}),
                    **({"consumedCapacity": dict(consumed)} if consumed is not None else {}),
                    **({"adminAccess": True} if admin else {})}
                   for i, d in enumerate(devices)]
        claim = self.api.create_resource_claim(name, namespace, results=results, config=config)
        return Claim(namespace, name, claim["metadata"]["uid"], driver)

    def uuid(self, name: str, driver: str = NVIDIA) -> str:
        """The GPU or MIG UUID of device ``name``."""
        return self.plugin.drivers[driver].snapshot.by_name[name].health_key

    def writes(self, since: float = 0.0) -> int:
        """ResourceSlice writes the API server answered since ``since``."""
        return sum(self.api.log.count(verb, "resourceslices", since)
                   for verb in ("create", "update", "delete", "patch"))

    def writes_while_idle(self) -> int:
        """ResourceSlice writes, once in sync, across three probes that find the same node and a broken
        watch (the slices listed again and compared with what is published)."""
        wait_for(lambda: self.plugin.publisher.in_sync)
        since = time.monotonic()
        for _ in range(3):
            self.sighup()
        lists = self.plugin.publisher.reflector.lists
        self.api.drop_watches.set()
        wait_for(lambda: self.plugin.publisher.reflector.lists > lists)
        self.api.drop_watches.clear()
        wait_for(lambda: self.plugin.publisher.in_sync)
        return self.writes(since)


@contextmanager
def running_plugin(api: FakeApiServer, kubelet: FakeDraKubelet, dirs: Dirs, host: Host, *,
                   config_path: Path | None = None, recovery_seconds: float = 0.3,
                   health_env: dict[str, str] | None = None, probe_interval: float = math.inf,
                   gone_hold_seconds: float = DEFAULT_HOLD_S, ready: bool = True, inputs_poll_s: float = 0.05,
                   tick_seconds: float = 0.05, health_poll_seconds: float = 0.05) -> Iterator[Running]:
    """The plugin as ``gpu-labeller dra-plugin`` runs it: its Service on the process loop, on a thread.
    With ``ready``, returns once it is registered and its slices are written. ``inputs_poll_s``,
    ``tick_seconds``, ``health_poll_seconds``: how often what cannot be watched is looked at (short,
    so that tests of other things need not wait; a test of a watch makes them hours)."""
    if NODE not in {n["metadata"]["name"] for n in api.store.list_nodes()[0]}:
        api.create_node(NODE)
    kubeconfig = api.write_kubeconfig(dirs.plugins.parent / "kubeconfig")
    with plugin_on_loop(host, kubeconfig, NODE, dirs, config_path=config_path, recovery_seconds=recovery_seconds,
                        health_env=health_env, probe_interval=probe_interval, gone_hold_seconds=gone_hold_seconds,
                        ready=ready, inputs_poll_s=inputs_poll_s, tick_seconds=tick_seconds,
                        health_poll_seconds=health_poll_seconds) as (plugin, loop, exit_code):
        yield Running(plugin, host, loop, api, kubelet, dirs, exit_code)


@contextmanager
def plugin_on_loop(host: Host, kubeconfig: Path, node: str, dirs: Dirs, *, config_path: Path | None = None,
                   recovery_seconds: float = 0.3, health_env: dict[str, str] | None = None,
                   probe_interval: float = math.inf, gone_hold_seconds: float = DEFAULT_HOLD_S,
                   ready: bool = True, inputs_poll_s: float = 0.05, tick_seconds: float = 0.05,
                   health_poll_seconds: float = 0.05) -> Iterator[tuple[DraPlugin, ProcessLoop, list[int]]]:
    """The plugin of ``node`` on its process loop, on a thread, against the API server of ``kubeconfig``
    (the fake one, or a real one: tests/e2e/e2e_dra_taints.py); stopped and closed on the way out."""
    kube = Kube(str(kubeconfig))
    settings = DraSettings(node, dirs.plugins, dirs.registry, dirs.cdi, recovery_seconds=recovery_seconds,
                           gone_hold_seconds=gone_hold_seconds, health_poll_seconds=health_poll_seconds,
                           tick_seconds=tick_seconds, health_env=health_env or {},
                           configs=ConfigSettings(dirs.mps, mps_control=str(FAKES / "nvidia-cuda-mps-control"),
                                                  nvidia_smi=str(FAKES / "nvidia-smi")))
    plugin = DraPlugin(host, settings, kube)
    loop = ProcessLoop(plugin, LoopOptions(interval_s=probe_interval, inputs_poll_s=inputs_poll_s),
                       retry=Backoff(0.05, 0.2), config=ConfigSource(host, config_path),
                       inputs=probe_inputs(host, plugin.board, plugin.gone_due), inputs_polled=plugin.inputs_polled)
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(loop.run()), daemon=True)
    thread.start()
    try:
        if ready:
            wait_for(lambda: plugin.ready)
        yield plugin, loop, exit_code
    finally:
        loop.stop()
        thread.join(30)
        plugin.close()
        kube.close()


@contextmanager
def simulated_plugin(api: FakeApiServer, kubelet: FakeDraKubelet, dirs: Dirs, profile: str, *,
                     config_path: Path | None = None, **options: Any) -> Iterator[Running]:
    """The plugin on a simulated node (a built-in profile or a profile file), with ``config_path``, else
    a config that serves every vendor through DRA."""
    if config_path is None:
        config_path = dirs.plugins.parent / "dra-config.yaml"
        write_yaml(config_path, dra_config())
    with open_host(NodeOptions(simulate=profile, config_path=config_path)) as host, \
            running_plugin(api, kubelet, dirs, host, config_path=config_path, **options) as run:
        yield run
