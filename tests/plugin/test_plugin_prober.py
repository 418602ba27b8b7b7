"""A driver that is not ready: the plugin probes again on its own, with capped jittered backoff."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from labeller.host.machine import Host, NodeOptions, open_host
from labeller.model.inventory import Inventory, ProbeError
from labeller.apps.plugin.prober import carried_forward, failed_vendors, not_ready
from labeller.base.backoff import Backoff
from tests.fakes.kubelet import FakeKubelet
from tests.builders import offer_of
from tests.plugin.conftest import probing_plugin, simulated
from tests.plugin.profile_files import l40s_node, mi210_node, write_yaml

GPU = "nvidia.com/gpu"
AMD = "amd.com/gpu"
KFD_TOPOLOGY = "sys/class/kfd/kfd/topology"


def _waits(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "driver not ready; probing again"]


@dataclass
class FlakyHost(Host):
    """A node whose next ``failures`` probes fail as a whole (an empty /sys/bus/pci/devices)."""

    failures: int = 0

    def probe(self) -> Inventory:
        if self.failures > 0:
            self.failures -= 1
            raise ProbeError("/sys/bus/pci/devices is empty: is the host's /sys mounted?")
        return super().probe()


@pytest.mark.parametrize(("nvml_error", "reason"), [
    ("driver_not_loaded", "nvidia: NVIDIA driver not loaded"),
    ("library_not_found", "nvidia: NVML library not found"),
    ("unknown", "nvidia: NVML initialisation failed: Unknown Error"),  # nvmlInit itself fails
])
def test_not_ready_gives_the_probe_reports_reason(tmp_path: Path, nvml_error: str, reason: str) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(2, nvml_error=nvml_error))
    with simulated(str(profile)) as (inventory, config, _, _):
        found = not_ready(inventory, list(offer_of(inventory, config).resources))
        assert failed_vendors(inventory) == {"nvidia"}
    assert found is not None and found.startswith(reason)


def test_not_ready_when_nothing_can_be_served() -> None:
    with simulated("dgx-a100-mig-mixed", {"flags": {"migStrategy": "single"}}) as (inventory, config, _, _):
        assert not_ready(inventory, list(offer_of(inventory, config).resources)) == \
            "8 GPU(s) on the PCI bus but none the plugin can serve with this config"
    assert not_ready(Inventory(), []) == "no GPU found"
    with simulated("dgx-h100") as (inventory, config, _, _):
        assert not_ready(inventory, list(offer_of(inventory, config).resources)) is None
        assert failed_vendors(inventory) == set()


def test_a_failed_vendor_keeps_what_it_served() -> None:
    with simulated("mixed-l40s-mi210") as (inventory, config, _, _):
        served = list(offer_of(inventory, config).resources)
    nvidia, amd = served
    assert carried_forward(served, [amd], {"nvidia"}) == [amd, nvidia]
    assert carried_forward(served, [amd], set()) == [amd]  # a vendor that answered: as probed


def test_waits_for_the_kfd_topology_then_serves(sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, mi210_node(2))
    with open_host(NodeOptions(simulate=str(profile))) as node:
        topology = node.host_root / KFD_TOPOLOGY
        hidden = topology.with_name("not-yet")
        topology.rename(hidden)  # amdgpu loaded, KFD still initialising
        with structlog.testing.capture_logs() as logs, probing_plugin(sock_dir, node) as run:
            assert kubelet.wait_for(lambda: len(_waits(logs)) >= 2)
            assert "KFD topology is missing" in _waits(logs)[0]["detail"]
            assert not run.plugin.ready and kubelet.registrations == []
            hidden.rename(topology)
            assert kubelet.wait_for(lambda: kubelet.allocatable(AMD) == 2)
            assert kubelet.wait_for(lambda: run.plugin.ready)
            assert not run.sighup_pending and any(e["event"] == "driver ready; serving" for e in logs)


def test_a_probe_that_fails_as_a_whole_serves_nothing_then_changes_nothing(
        sock_dir: Path, kubelet: FakeKubelet) -> None:
    with open_host(NodeOptions(simulate="dgx-h100")) as opened:
        node = FlakyHost(opened.host_root, opened.config, opened.handles, failures=2)
        with structlog.testing.capture_logs() as logs, probing_plugin(sock_dir, node) as run:
            assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
            assert [e["detail"]
                    for e in _waits(logs)] == ["/sys/bus/pci/devices is empty: is the host's /sys mounted?"] * 2
            since = time.monotonic()
            node.failures = 1
            run.sighup()  # the SIGHUP's probe fails: keep serving, probe again later
            assert kubelet.wait_for(lambda: len(_waits(logs)) == 3)
            assert kubelet.wait_for(lambda: sum(e["event"] == "driver ready; serving" for e in logs) == 2)
            assert kubelet.seen(GPU, since) == [] and kubelet.registration_count(GPU) == 1


def test_a_vendor_that_stops_answering_keeps_its_devices(sock_dir: Path, kubelet: FakeKubelet,
                                                         tmp_path: Path) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(2, amd_gpus=2))
    with open_host(NodeOptions(simulate=str(profile))) as node, \
            structlog.testing.capture_logs() as logs, probing_plugin(sock_dir, node) as run:
        assert kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2 and kubelet.allocatable(AMD) == 2)
        write_yaml(profile, l40s_node(2, amd_gpus=2, nvml_error="driver_not_loaded"))  # a driver upgrade
        run.sighup()
        assert kubelet.wait_for(lambda: _waits(logs) != [])
        assert "NVIDIA driver not loaded" in _waits(logs)[0]["detail"]
        applied = run.plugin.applied
        assert kubelet.wait_for(lambda: run.plugin.applied > applied)  # what that probe found is served
        assert [r.name for r in run.plugin.resources] == [AMD, GPU]
        write_yaml(profile, l40s_node(2, amd_gpus=2))  # the new driver is up: found without a SIGHUP
        assert kubelet.wait_for(lambda: any(e["event"] == "driver ready; serving" for e in logs))
        assert kubelet.registration_count(GPU) == 1 and kubelet.registration_count(AMD) == 1
        assert all(o.allocatable == 2 for o in kubelet.seen(GPU) + kubelet.seen(AMD) if o.event == "devices")


def test_retries_back_off_with_jitter_up_to_the_cap(sock_dir: Path, kubelet: FakeKubelet) -> None:
    base, cap = 0.02, 0.08
    with open_host(NodeOptions(simulate="dgx-h100")) as opened:
        node = FlakyHost(opened.host_root, opened.config, opened.handles, failures=10**6)
        with structlog.testing.capture_logs() as logs, \
                probing_plugin(sock_dir, node, backoff=Backoff(base, cap, random.Random(7))):
            assert kubelet.wait_for(lambda: len(_waits(logs)) >= 10)
    waits = _waits(logs)[:10]
    assert [e["attempt"] for e in waits] == list(range(1, 11))
    for n, event in enumerate(waits):
        assert base / 2 - 0.005 <= event["retry_in_s"] <= min(cap, base * 2 ** n) + 0.005
    assert len({e["retry_in_s"] for e in waits[3:]}) > 1  # jittered, not a fixed period
    assert kubelet.registrations == []


@pytest.mark.parametrize("fail_on_init_error", [True, False])
def test_fail_on_init_error_decides_between_exit_1_and_waiting(sock_dir: Path, kubelet: FakeKubelet,
                                                               tmp_path: Path, fail_on_init_error: bool) -> None:
    profile = tmp_path / "node.yaml"
    write_yaml(profile, l40s_node(2, nvml_error="library_not_found",
                                  config={"version": "v1", "flags": {"failOnInitError": fail_on_init_error}}))
    with open_host(NodeOptions(simulate=str(profile))) as node, \
            structlog.testing.capture_logs() as logs, probing_plugin(sock_dir, node) as run:
        if fail_on_init_error:
            assert kubelet.wait_for(lambda: run.exit_code == [1])
            assert [e["detail"] for e in logs if e.get("reason") == "driver-not-ready"] == [
                "nvidia: NVML library not found: NVML Shared Library Not Found; 2 NVIDIA GPU(s) on the PCI bus; "
                "GPU detail labels omitted; nvidia.com/gpu.present still set from PCI"]
        else:
            assert kubelet.wait_for(lambda: len(_waits(logs)) >= 2)
            assert run.exit_code == []
