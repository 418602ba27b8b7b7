"""Fixtures for the DRA plugin tests: the plugin on its process loop (as ``gpu-labeller dra-plugin``
runs it, in this process), the fake API server, and the kubelet DRA manager stand-in."""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from labeller.cluster.kube import Kube
from labeller.draplugin.app import DraPlugin, DraSettings, probe_inputs
from labeller.host import Host, NodeOptions, open_host
from labeller.process.configsource import ConfigSource
from labeller.process.loop import LoopOptions, ProcessLoop
from labeller.runtime import Backoff
from tests.builders import wait_for
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet
from tests.plugin.profile_files import write_yaml

NODE = "gpu-node-1"
NVIDIA = "gpu.nvidia.com"
AMD = "gpu.amd.com"
Obj = dict[str, Any]


def dra_config(*vendors: str) -> dict[str, Any]:
    """A config document that serves ``vendors`` through DRA (every vendor by default)."""
    return {"version": "v1", "labeller": {"dra": {"vendors": list(vendors or ("nvidia", "amd"))}}}


@dataclass(frozen=True)
class Dirs:
    registry: Path
    plugins: Path
    cdi: Path


@pytest.fixture
def dirs(sock_dir: Path) -> Dirs:
    return Dirs(sock_dir / "reg", sock_dir / "plugins", sock_dir / "cdi")


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
              shared: bool = False, admin: bool = False) -> Claim:
        """A ResourceClaim allocated to ``devices`` of ``driver`` (as the scheduler leaves it); ``shared``:
        each result with its own ``shareID``, as 1.34's consumable capacity allocates a device that
        allows multiple allocations; ``admin``: allocated for admin access."""
        results = [{"request": "gpu", "driver": driver, "pool": pool, "device": d,
                    **({"shareID": str(uuid.uuid4())} if shared else {}), **({"adminAccess": True} if admin else {})}
                   for d in devices]
        claim = self.api.create_resource_claim(name, namespace, results=results)
        return Claim(namespace, name, claim["metadata"]["uid"], driver)

    def writes(self, since: float = 0.0) -> int:
        """ResourceSlice writes the API server answered since ``since``."""
        return sum(self.api.log.count(verb, "resourceslices", since)
                   for verb in ("create", "update", "delete", "patch"))


@contextmanager
def running_plugin(api: FakeApiServer, kubelet: FakeDraKubelet, dirs: Dirs, host: Host, *,
                   config_path: Path | None = None, recovery_seconds: float = 0.3,
                   health_env: dict[str, str] | None = None, probe_interval: float = math.inf,
                   ready: bool = True, inputs_poll_s: float = 0.05, tick_seconds: float = 0.05,
                   health_poll_seconds: float = 0.05) -> Iterator[Running]:
    """The plugin as ``gpu-labeller dra-plugin`` runs it: its Service on the process loop, on a thread.
    With ``ready``, returns once it is registered and its slices are written. ``inputs_poll_s``,
    ``tick_seconds``, ``health_poll_seconds``: how often what cannot be watched is looked at (short,
    so that tests of other things need not wait; a test of a watch makes them hours)."""
    if NODE not in {n["metadata"]["name"] for n in api.store.list_nodes()[0]}:
        api.create_node(NODE)
    kube = Kube(str(api.write_kubeconfig(dirs.plugins.parent / "kubeconfig")))
    settings = DraSettings(NODE, dirs.plugins, dirs.registry, dirs.cdi, recovery_seconds=recovery_seconds,
                           health_poll_seconds=health_poll_seconds, tick_seconds=tick_seconds,
                           health_env=health_env or {})
    plugin = DraPlugin(host, settings, kube)
    loop = ProcessLoop(plugin, LoopOptions(interval_s=probe_interval, inputs_poll_s=inputs_poll_s),
                       retry=Backoff(0.05, 0.2), config=ConfigSource(host, config_path),
                       inputs=probe_inputs(host, plugin.board), inputs_polled=plugin.inputs_polled)
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(loop.run()), daemon=True)
    thread.start()
    try:
        if ready:
            wait_for(lambda: plugin.ready)
        yield Running(plugin, host, loop, api, kubelet, dirs, exit_code)
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
