"""A vendor the config serves through DRA (labeller.dra.vendors): the device plugin advertises none of
its GPUs (one owner per GPU), keeps serving the others, and serving nothing then is not a driver problem."""

from __future__ import annotations

from pathlib import Path

from labeller.apps.plugin.prober import not_ready
from tests.builders import offer_of
from tests.fakes.kubelet import FakeKubelet
from tests.plugin.conftest import running_plugin, simulated

DRA_NVIDIA = {"labeller": {"dra": {"vendors": ["nvidia"]}}}
DRA_AMD = {"labeller": {"dra": {"vendors": ["amd"]}}}


def test_a_node_whose_gpus_dra_serves_is_ready_with_nothing_advertised(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with simulated("dgx-h100", DRA_NVIDIA) as (inventory, config, _, _):
        resources = list(offer_of(inventory, config).resources)
        assert resources == []
        assert not_ready(inventory, resources, dra_serves=True) is None
        assert not_ready(inventory, resources) == ("8 GPU(s) on the PCI bus but none the plugin can serve "
                                                   "with this config")
    with running_plugin(sock_dir, "dgx-h100", DRA_NVIDIA) as running:
        assert kubelet.wait_for(lambda: running.plugin.applied >= 1)
        assert running.plugin.ready
        assert kubelet.registrations == [] and kubelet.allocatable("nvidia.com/gpu") == 0


def test_dra_serves_one_vendor_and_the_plugin_the_other(sock_dir: Path, kubelet: FakeKubelet) -> None:
    with running_plugin(sock_dir, "mixed-l40s-mi210", DRA_AMD) as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 2)
        assert kubelet.wait_for(lambda: running.plugin.ready)
        assert [r.resource for r in kubelet.registrations] == ["nvidia.com/gpu"]
        assert kubelet.allocatable("amd.com/gpu") == 0
