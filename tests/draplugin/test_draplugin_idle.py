"""What wakes an idle DRA plugin. Nothing looks at anything on a schedule that could be told instead,
so each test sets the schedules that must not matter to an hour (the sockets' tick, the inputs' poll,
the health poll, the probe interval) and awaits the plugin's reaction to one change:

- the kubelet deleting the registration socket (inotify on the registry directory);
- the simulated profile file edited to drop a GPU (inotify on its directory);
- an XID, and a GPU falling off the bus (NVML's events);
- a MIG reconfiguration (NVML's MIG configuration change event): a probe;
- a KFD topology change (its ``generation_id``, read each health poll: sysfs tells no one): a probe.

The bound is ``AT_ONCE_S``: milliseconds here, seconds on a loaded box, never the hour."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

import labeller.base.inotify
from labeller.host.machine import NodeOptions, open_host
from labeller.process.health import POLL_SECONDS
from tests.builders import AT_ONCE_S, TOPOLOGY, kfd_node_goes, stays_true, wait_for
from tests.draplugin.conftest import AMD, NVIDIA, Dirs, Running, dra_config, running_plugin, simulated_plugin
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import FakeDraKubelet
from tests.plugin.profile_files import l40s_node, write_yaml

HOUR = 3600.0
NOTHING_SCHEDULED = {"tick_seconds": HOUR, "inputs_poll_s": HOUR, "health_poll_seconds": HOUR}


def reacts(what: Any, since: float) -> None:
    """``what()`` becomes true, and did so at once (see the module docstring)."""
    wait_for(what)
    assert time.monotonic() - since < AT_ONCE_S


def test_a_deleted_registration_socket_is_seen_at_once(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                       dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", **NOTHING_SCHEDULED):
        removed = time.monotonic()
        (dirs.registry / f"{NVIDIA}-reg.sock").unlink()  # the kubelet restarts
        reacts(lambda: drakubelet.seen("registered", NVIDIA, since=removed), removed)


def test_without_inotify_the_sockets_are_looked_at_every_tick(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                              dirs: Dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> None:
        raise OSError(24, "inotify_init1: Too many open files")

    monkeypatch.setattr(labeller.base.inotify, "Inotify", unavailable)
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", inputs_poll_s=HOUR, health_poll_seconds=HOUR,
                          tick_seconds=0.05) as run:
        assert run.plugin.watch is not None and not run.plugin.watch.available
        removed = time.monotonic()
        (dirs.registry / f"{NVIDIA}-reg.sock").unlink()
        reacts(lambda: drakubelet.seen("registered", NVIDIA, since=removed), removed)


@contextmanager
def profile_plugin(api: FakeApiServer, kubelet: FakeDraKubelet, dirs: Dirs, profile: Path,
                   **options: Any) -> Iterator[Running]:
    with open_host(NodeOptions(simulate=str(profile))) as host, \
            running_plugin(api, kubelet, dirs, host, **options) as run:
        yield run


def test_a_profile_edited_to_drop_a_gpu_is_published_at_once(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                             dirs: Dirs, tmp_path: Path) -> None:
    profile = tmp_path / "profiles" / "node.yaml"
    profile.parent.mkdir()
    write_yaml(profile, l40s_node(3, config=dra_config()))
    with profile_plugin(api, drakubelet, dirs, profile, **NOTHING_SCHEDULED) as run:
        assert run.devices() == ["gpu-0", "gpu-1", "gpu-2"]
        assert not run.plugin.inputs_polled()  # the profile is watched: nothing to look at on a schedule
        edited = time.monotonic()
        write_yaml(profile, l40s_node(2, config=dra_config()))
        reacts(lambda: run.devices() == ["gpu-0", "gpu-1"], edited)


def test_an_xid_takes_its_gpu_out_at_once(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    # recovery after 60 s, not 0.3 s: on a loaded machine gpu-3 answered normally again (and was Healthy)
    # before the publisher, still finding out that the server drops taints, wrote it out
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", recovery_seconds=60, **NOTHING_SCHEDULED) as run:
        injected = time.monotonic()
        run.nvml.inject_xid(run.nvml.state.gpus[3].uuid, 48)
        reacts(lambda: "gpu-3" not in run.devices() and len(run.devices()) == 7, injected)


def test_a_gpu_that_falls_off_the_bus_is_taken_out_at_once(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                           dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", **NOTHING_SCHEDULED) as run:
        lost = time.monotonic()
        run.nvml.set_lost(run.nvml.state.gpus[5].uuid, True)
        reacts(lambda: "gpu-5" not in run.devices() and len(run.devices()) == 7, lost)


def test_a_mig_reconfiguration_is_probed_at_once(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                 dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-a100-mig-mixed", **NOTHING_SCHEDULED) as run:
        probes = run.plugin.probes
        changed = time.monotonic()
        run.nvml.inject_mig_change(run.nvml.state.gpus[4].uuid)
        reacts(lambda: run.plugin.probes > probes, changed)


@pytest.fixture
def gated_api() -> Iterator[FakeApiServer]:
    """A fake API server that keeps device taints (DRADeviceTaints on): a device gone from the probe is
    published tainted a while, so the probe that found it gone shows."""
    with FakeApiServer(feature_gates={"DRADeviceTaints"}) as server:
        yield server


def test_a_kfd_topology_change_is_probed_at_once(gated_api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                 dirs: Dirs) -> None:
    """A partition goes and the driver bumps the topology's generation: the next health poll (as
    often as in production) sees the generation move, and the plugin probes again: the partition is
    gone from the node, not merely Unhealthy."""
    options = {**NOTHING_SCHEDULED, "health_poll_seconds": POLL_SECONDS}
    with simulated_plugin(gated_api, drakubelet, dirs, "mi300x-x8-cpx", **options) as run:
        assert len(run.devices(AMD)) == 63 and not run.plugin.inputs_polled()
        last = max(int(p.name) for p in (run.host.host_root / TOPOLOGY).iterdir())
        name = next(d.name for d in run.plugin.drivers[AMD].snapshot.by_name.values()
                    if d.physical.health_key == f"kfd:{last}")
        probes = run.plugin.probes
        changed = time.monotonic()
        kfd_node_goes(run.host.host_root, last)  # and the driver bumps the generation
        # gone from the probe, not merely Unhealthy: published tainted while its pods may still use it
        reacts(lambda: run.plugin.probes > probes and gone(run) == [name], changed)
        assert 'health="Healthy"} 62.0' in gauge(run, AMD)


def test_a_gpu_gone_from_the_probe_goes_as_soon_as_its_hold_is_over(
        gated_api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path) -> None:
    """Published tainted while its pods may still use it, then gone without waiting for a probe
    interval (an hour here): the loop looks every second, while such a device is kept, for the moment
    the next probe would drop it."""
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(3, config=dra_config()))
    with profile_plugin(gated_api, drakubelet, dirs, profile, gone_hold_seconds=1.0,
                        **{**NOTHING_SCHEDULED, "inputs_poll_s": 1.0}) as run:
        write_yaml(profile, l40s_node(2, config=dra_config()))
        wait_for(lambda: [d.name for _, d in run.plugin.gone.devices().get(NVIDIA, [])] == ["gpu-2"])
        assert run.devices() == ["gpu-0", "gpu-1", "gpu-2"] and run.plugin.inputs_polled()
        held_until = time.monotonic() + 1.0
        reacts(lambda: run.devices() == ["gpu-0", "gpu-1"], held_until)
        assert not run.plugin.gone.devices() and not run.plugin.inputs_polled()


def test_an_unchanged_topology_probes_nothing(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """Each health poll reads the generation; the same one is no reason to probe."""
    options = {**NOTHING_SCHEDULED, "health_poll_seconds": 0.01}
    with simulated_plugin(api, drakubelet, dirs, "mi300x-x8-cpx", **options) as run:
        probes = run.plugin.probes
        stays_true(lambda: run.plugin.probes == probes)


def gone(run: Running) -> list[str]:
    """The AMD devices the plugin found gone at its last probe (and publishes tainted a while)."""
    return [device.name for _, device in run.plugin.gone.devices().get(AMD, [])]


def gauge(run: Running, driver: str) -> str:
    """The plugin's device counts of ``driver``, as /metrics shows them."""
    text = generate_latest(run.plugin.metrics.registry).decode()
    return "\n".join(line for line in text.splitlines()
                     if line.startswith("gpu_labeller_dra_devices{") and driver in line)
