"""Live reloads: a SIGHUP that keeps a resource's name updates the open ListAndWatch stream.

Every check reads the kubelet emulator's observations: what the Node reported after each
registration, each ListAndWatch update and each stream end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog.testing

from labeller.host.machine import NodeOptions, open_host
from tests.builders import stays_true, wait_for
from tests.fakes.kubelet import FakeKubelet
from tests.plugin.conftest import Probing, probing_plugin
from tests.plugin.profile_files import l40s_node, time_slicing, write_yaml

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"


@contextmanager
def two_gpus_two_replicas(sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path,
                          recovery_seconds: float = 0.3) -> Iterator[tuple[Probing, Path, Path]]:
    """The plugin serving 2 GPUs x 2 time-slicing replicas as nvidia.com/gpu; its profile and config files."""
    profile, config = tmp_path / "node.yaml", tmp_path / "config.yaml"
    write_yaml(profile, l40s_node(2))
    write_yaml(config, time_slicing(2))
    with open_host(NodeOptions(simulate=str(profile), config_path=config)) as node, \
            probing_plugin(sock_dir, node, config, recovery_seconds=recovery_seconds) as run:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4)
        yield run, profile, config


def test_more_replicas_under_the_same_name_reach_the_open_stream(sock_dir: Path, kubelet: FakeKubelet,
                                                                 tmp_path: Path) -> None:
    with two_gpus_two_replicas(sock_dir, kubelet, tmp_path) as (run, _, config):
        endpoint, since = kubelet.endpoint(GPU), time.monotonic()
        write_yaml(config, time_slicing(4))
        run.sighup()
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
        assert kubelet.registration_count(GPU) == 1 and kubelet.endpoint(GPU) is endpoint
        assert [(o.event, o.allocatable) for o in kubelet.seen(GPU, since)] == [("devices", 8)]
        uuids = {i.split("::")[0] for i in kubelet.devices(GPU)}
        assert sorted(kubelet.devices(GPU)) == sorted(f"{u}::{n}" for u in uuids for n in range(4))
        _, (ids,) = kubelet.admit(GPU, [1])  # the new replica IDs are served by Allocate too
        assert ids[0].endswith(("::0", "::1", "::2", "::3"))


def test_a_gpu_appearing_joins_the_open_stream(sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(1))
    with open_host(NodeOptions(simulate=str(profile))) as node, probing_plugin(sock_dir, node) as run:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 1)
        since = time.monotonic()
        write_yaml(profile, l40s_node(2))  # the profile file is read again at the next probe
        run.sighup()
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2)
        assert kubelet.registration_count(GPU) == 1
        assert all(o.event == "devices" and o.allocatable > 0 for o in kubelet.seen(GPU, since))


def test_a_renamed_resource_registers_anew_and_the_old_stream_ends(sock_dir: Path, kubelet: FakeKubelet,
                                                                   tmp_path: Path) -> None:
    with two_gpus_two_replicas(sock_dir, kubelet, tmp_path) as (run, _, config):
        since = time.monotonic()
        write_yaml(config, time_slicing(2, rename=True))
        run.sighup()
        assert kubelet.wait_for(lambda: kubelet.allocatable(SHARED) == 4)
        assert kubelet.registration_count(SHARED) == 1 and kubelet.registration_count(GPU) == 1
        assert kubelet.wait_for(lambda: [o.event for o in kubelet.seen(GPU, since)] == ["stream-ended"])
        assert kubelet.allocatable(GPU) == 0 and kubelet.capacity(GPU) == 4  # the kubelet's grace period
        assert not (sock_dir / "nvidia-gpu.sock").exists() and (sock_dir / "nvidia-gpu.shared.sock").exists()


def test_an_unhealthy_gpu_stays_unhealthy_across_a_reload(sock_dir: Path, kubelet: FakeKubelet,
                                                          tmp_path: Path) -> None:
    with two_gpus_two_replicas(sock_dir, kubelet, tmp_path, recovery_seconds=60) as (run, _, config):
        sick = sorted(kubelet.devices(GPU))[0].split("::")[0]
        run.node.handles["nvidia"].inject_xid(sick, 79)
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2)
        write_yaml(config, time_slicing(4))
        run.sighup()
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8)
        health = kubelet.devices(GPU)
        assert {h for i, h in health.items() if i.startswith(sick)} == {"Unhealthy"}
        assert kubelet.allocatable(GPU) == 4


def test_a_config_that_fails_to_load_keeps_the_served_devices(sock_dir: Path, kubelet: FakeKubelet,
                                                              tmp_path: Path) -> None:
    with two_gpus_two_replicas(sock_dir, kubelet, tmp_path) as (run, profile, config):
        since = time.monotonic()
        write_yaml(profile, l40s_node(3))  # a probe would show a third GPU
        config.write_text("version: v1\nsharing: {timeSlicing: {replicas: 3}}\n")
        with structlog.testing.capture_logs() as logs:
            run.sighup()
            wait_for(lambda: any(e["event"] == "config reload failed, keeping the old config" for e in logs))
        stays_true(lambda: kubelet.seen(GPU, since) == [] and kubelet.allocatable(GPU) == 4)
