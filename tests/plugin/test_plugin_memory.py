"""Memory sharing served to the kubelet emulator, with the pods in the fake API server: Allocate gives
each container the GPU the scheduler extender chose for its pod (the annotations), and marks the pod
assigned; a request no pod waits for fails the pod with a clear error."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from labeller.model import gpushare
from labeller.cluster.kube import Kube
from labeller.model.namedconfigs import CONFIG_LABEL
from labeller.apps.plugin.app import DevicePlugin, PluginSettings
from tests.builders import config_map_volume, offer_of
from tests.fakes.apiserver import FakeApiServer, Fault
from tests.fakes.kubelet import AdmissionError, FakeKubelet
from tests.plugin.conftest import simulated
from tests.plugin.test_plugin_cli import PluginProcess

NODE = "gpu-node-1"
MEM, COUNT = gpushare.RESOURCE_MEM, gpushare.RESOURCE_COUNT
PROFILE = "t4-x4-gpushare"  # 4 x T4, 14 GiB each
UNITS_PER_GPU = 14
_clock = itertools.count(1_764_000_000_000_000_000, 1_000_000_000)


@dataclass
class Node:
    plugin: DevicePlugin
    api: FakeApiServer
    kubelet: FakeKubelet
    uuids: list[str]  # the GPUs in NVML order
    nvml: Any  # the simulated pynvml, with inject_xid

    def place(self, name: str, gpu: int, containers: dict[str, dict[str, str]], *, node: str = NODE,
              assume_time: int | None = None) -> Any:
        """A pod as the extender leaves it: bound to ``node`` with its choice of GPU annotated."""
        units = sum(int(limits.get(MEM, 0)) for limits in containers.values())
        annotations = gpushare.placement_annotations(gpu, units, UNITS_PER_GPU, assume_time or next(_clock))
        return self.api.create_pod(name, node=node, containers=containers, annotations=annotations)

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.api.pod(name)["metadata"].get("annotations") or {})

    def admit(self, *units: int) -> list[dict[str, str]]:
        responses, _ = self.kubelet.admit_each(MEM, list(units))
        return [dict(r.envs) for r in responses]


@contextmanager
def memory_node(sock_dir: Path, tmp_path: Path, config: dict[str, Any] | None = None, *,
                node_name: str = NODE) -> Iterator[Node]:
    cfg = {"version": "v1", "sharing": {"memory": {"unit": "GiB"}}, **(config or {})}
    with FakeApiServer() as api, FakeKubelet(sock_dir) as kubelet, simulated(PROFILE, cfg) as (inv,
                                                                                               config_, root, handles):
        api.create_node(NODE)
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        settings = PluginSettings(sock_dir, recovery_seconds=0, health_poll_seconds=0.05, tick_seconds=0.05,
                                  health_env={}, node_name=node_name, pod_api=lambda: Kube(kubeconfig))
        plugin = DevicePlugin(settings)
        plugin.serve(offer_of(inv, config_).resources, config_, root, handles)
        with plugin:
            assert kubelet.wait_for(lambda: kubelet.allocatable(MEM) == 4 * UNITS_PER_GPU
                                    and kubelet.allocatable(COUNT) == 4)
            uuids = [p.health_key for p in offer_of(inv, config_).resources[0].physical_devices]
            yield Node(plugin, api, kubelet, uuids, handles["nvidia"])


def cuda(units: int) -> dict[str, str]:
    return {MEM: str(units), "cpu": "500m", "memory": "2Gi"}


def test_each_pod_gets_the_gpu_chosen_at_bind_and_is_marked_assigned(sock_dir: Path, tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path) as node:
        # as gpu-labeller's extender binds: one assumed pod per node at a time, equal requests on
        # different GPUs; the earlier ones stay Pending (ASSIGNED) while the next is admitted
        for name, gpu in (("a", 2), ("b", 0), ("c", 3), ("d", 2)):
            node.place(name, gpu, {"main": cuda(4)})
            (envs,) = node.admit(4)
            assert envs == {"NVIDIA_VISIBLE_DEVICES": node.uuids[gpu], "ALIYUN_COM_GPU_MEM_IDX": str(gpu),
                            "ALIYUN_COM_GPU_MEM_POD": "4", "ALIYUN_COM_GPU_MEM_CONTAINER": "4",
                            "ALIYUN_COM_GPU_MEM_DEV": str(UNITS_PER_GPU)}
            annotations = node.annotations(name)
            assert annotations[gpushare.ANN_ASSIGNED] == "true"
            assert int(annotations[gpushare.ANN_ASSIGN_TIME]) >= int(annotations[gpushare.ANN_ASSUME_TIME])
            assert node.api.pod(name)["status"]["phase"] == "Pending"
        # the kubelet's accounting follows the real GPUs (preferred allocation): 8 units of GPU 2 in use
        in_use = node.kubelet.allocated[MEM]
        assert sorted(sum(1 for i in in_use if i.startswith(u)) for u in node.uuids) == [0, 4, 4, 8]
        assert sum(1 for i in in_use if i.startswith(node.uuids[2])) == 8


def test_assumed_pods_with_different_requests_match_whatever_the_admission_order(sock_dir: Path,
                                                                                  tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path) as node:
        node.place("small", 1, {"main": cuda(2)})
        node.place("large", 3, {"main": cuda(6)})
        assert node.admit(6)[0]["NVIDIA_VISIBLE_DEVICES"] == node.uuids[3]  # the kubelet admits "large" first
        assert node.admit(2)[0]["NVIDIA_VISIBLE_DEVICES"] == node.uuids[1]
        assert [node.annotations(pod)[gpushare.ANN_ASSIGNED] for pod in ("small", "large")] == ["true", "true"]


def test_with_several_equal_candidates_the_oldest_assume_time_wins(sock_dir: Path, tmp_path: Path) -> None:
    """gpushare's own extender has no per-node lock: two assumed pods ask for the same amount."""
    with memory_node(sock_dir, tmp_path) as node:
        node.place("newer", 0, {"main": cuda(3)}, assume_time=2_000)
        node.place("older", 2, {"main": cuda(3)}, assume_time=1_000)
        assert node.admit(3)[0]["NVIDIA_VISIBLE_DEVICES"] == node.uuids[2]
        assert node.annotations("older")[gpushare.ANN_ASSIGNED] == "true"
        assert node.annotations("newer")[gpushare.ANN_ASSIGNED] == "false"
        assert node.admit(3)[0]["NVIDIA_VISIBLE_DEVICES"] == node.uuids[0]


def test_a_multi_container_pod_mixing_gpu_mem_with_cpu_and_memory(sock_dir: Path, tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path) as node:
        node.place("mixed", 1, {"trainer": cuda(3), "logger": {"cpu": "100m", "memory": "128Mi"},
                                "evaluator": cuda(2)})
        first = node.admit(3)[0]  # the kubelet calls Allocate for the gpu-mem containers only, one by one
        assert node.annotations("mixed")[gpushare.ANN_ASSIGNED] == "false"  # one container to go
        second = node.admit(2)[0]
        for envs, units in ((first, "3"), (second, "2")):
            assert envs["NVIDIA_VISIBLE_DEVICES"] == node.uuids[1]
            assert envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == units and envs["ALIYUN_COM_GPU_MEM_POD"] == "5"
        assert node.annotations("mixed")[gpushare.ANN_ASSIGNED] == "true"


def test_containers_with_equal_requests_are_each_allocated_once(sock_dir: Path, tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path) as node:
        node.place("twins", 3, {"left": cuda(2), "right": cuda(2)})
        envs = node.admit(2, 2)
        assert [e["NVIDIA_VISIBLE_DEVICES"] for e in envs] == [node.uuids[3]] * 2
        assert node.annotations("twins")[gpushare.ANN_ASSIGNED] == "true"
        with pytest.raises(AdmissionError, match="no pod bound to this node waits"):
            node.admit(2)  # both containers are done: a third request of 2 has no pod


def test_no_matching_pod_fails_the_pod_with_a_message_naming_node_request_and_pods(sock_dir: Path,
                                                                                   tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path) as node:
        with pytest.raises(AdmissionError) as nothing:
            node.admit(4)
        assert "FAILED_PRECONDITION" in str(nothing.value)
        assert (f"node {NODE}: no pod bound to this node waits to start a container of 4 GiB of {MEM}"
                in str(nothing.value))
        assert "scheduler extender" in str(nothing.value)
        node.place("waiting", 0, {"main": cuda(5)})
        node.place("elsewhere", 1, {"main": cuda(4)}, node="gpu-node-2")
        node.api.create_pod("unplaced", node=NODE, containers={"main": cuda(4)})  # no extender annotations
        node.place("done", 2, {"main": cuda(4)})
        node.api.set_pod_phase("done", "Succeeded")
        node.place("leaving", 2, {"main": cuda(4)})
        node.api.start_deleting_pod("leaving")
        with pytest.raises(AdmissionError) as wrong:
            node.admit(4)
        assert str(wrong.value).endswith("(assumed pods: default/waiting waits for [5])")
        assert "no-gpu-has" not in str(wrong.value)
        assert node.annotations("waiting")[gpushare.ANN_ASSIGNED] == "false"
        assert node.admit(5)[0]["NVIDIA_VISIBLE_DEVICES"] == node.uuids[0]


def test_index_strategy_and_a_conflicting_write_while_marking_assigned(sock_dir: Path, tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path, {"flags": {"plugin": {"deviceIDStrategy": "index"}}}) as node:
        node.place("p", 2, {"main": cuda(1)})
        node.api.faults.add(Fault(verb="patch", resource="pods", status=409, times=1))
        assert node.admit(1)[0]["NVIDIA_VISIBLE_DEVICES"] == "2"
        assert node.annotations("p")[gpushare.ANN_ASSIGNED] == "true"  # read again and written
        assert node.api.log.count("patch", "pods") == 2 and node.api.log.count("get", "pods") == 1


def test_gpu_count_cannot_be_allocated(sock_dir: Path, tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path) as node:
        assert node.kubelet.allocatable(COUNT) == 4
        with pytest.raises(AdmissionError, match=f"request {MEM} instead"):
            node.kubelet.admit(COUNT, [1])


def test_without_a_node_name_every_allocation_says_why(sock_dir: Path, tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path, node_name="") as node:
        with pytest.raises(AdmissionError, match="cannot read this node's pods: this node's name is unknown"):
            node.admit(1)


def test_an_unhealthy_gpu_takes_all_its_units_away(sock_dir: Path, tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path) as node:
        node.nvml.inject_xid(node.uuids[1], 79)
        assert node.kubelet.wait_for(lambda: node.kubelet.allocatable(MEM) == 3 * UNITS_PER_GPU
                                     and node.kubelet.allocatable(COUNT) == 3)
        assert sum(1 for i, h in node.kubelet.devices(MEM).items() if h == "Unhealthy"
                   and i.startswith(node.uuids[1])) \
            == UNITS_PER_GPU
        node.place("p", 1, {"main": cuda(1)})
        assert node.admit(1)[0]["NVIDIA_VISIBLE_DEVICES"] == node.uuids[1]  # bound before the XID: still its GPU


def test_a_gpu_index_this_node_does_not_share_fails_the_pod(sock_dir: Path, tmp_path: Path) -> None:
    with memory_node(sock_dir, tmp_path) as node:
        node.place("off-the-end", 4, {"main": cuda(1)})  # 4 GPUs: indices 0-3
        with pytest.raises(AdmissionError,
                           match=r"default/off-the-end was bound to GPU index 4 \(ALIYUN_COM_GPU_MEM_IDX\), "
                                                 r"but this node shares 4 GPU\(s\) by memory"):
            node.admit(1)
        assert node.annotations("off-the-end")[gpushare.ANN_ASSIGNED] == "false"


def test_a_pod_larger_than_its_gpu_fails_with_both_sizes(sock_dir: Path, tmp_path: Path) -> None:
    """An extender that took gpu-mem / gpu-count for every GPU can overshoot one GPU of a node with
    mixed sizes; the plugin says so instead of handing out memory the GPU does not have."""
    with memory_node(sock_dir, tmp_path) as node:
        node.place("too-big", 3, {"a": cuda(10), "b": cuda(6)})
        with pytest.raises(AdmissionError, match=r"pod default/too-big asks for 16 GiB of aliyun.com/gpu-mem on GPU 3 "
                                                 r"\(GPU-[0-9a-f-]+\), which has 14 GiB"):
            node.admit(10)


def test_the_device_plugin_process_serves_memory_sharing_with_its_node_and_kubeconfig(
        sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path) -> None:
    with FakeApiServer() as api:
        api.create_node(NODE)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        with PluginProcess("--simulate", PROFILE, "--socket-dir", str(sock_dir), "--node-name", NODE,
                           "--kubeconfig", str(kubeconfig)) as plugin:
            assert kubelet.wait_for(lambda: kubelet.allocatable(MEM) == 4 * UNITS_PER_GPU)
            annotations = gpushare.placement_annotations(3, 6, UNITS_PER_GPU, next(_clock))
            api.create_pod("p", node=NODE, containers={"main": cuda(6)}, annotations=annotations)
            responses, (ids,) = kubelet.admit_each(MEM, [6])
            assert dict(responses[0].envs)["ALIYUN_COM_GPU_MEM_IDX"] == "3"
            assert api.pod("p")["metadata"]["annotations"][gpushare.ANN_ASSIGNED] == "true"
            allocated = plugin.event("allocated by memory")
            assert (allocated["node"], allocated["pod"], allocated["units"], allocated["index"]) == (NODE,
                                                                                                     "default/p", 6, 3)
            assert plugin.stop() == 0


def test_a_node_labelled_into_a_memory_sharing_pool_switches_without_a_restart(
        sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path) -> None:
    """Per-node named configs: memory sharing is one more config block, followed like any other."""
    with FakeApiServer() as api:
        api.create_node(NODE)
        configs = config_map_volume(tmp_path / "configs", {"default": {"version": "v1"},
                                                           "gpushare": {"version": "v1", "sharing": {"memory": {}}}})
        with PluginProcess("--simulate", PROFILE, "--config-dir", str(configs), "--socket-dir", str(sock_dir),
                           "--node-name", NODE, "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig"))) \
                as plugin:
            assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 4)
            api.set_labels(NODE, {CONFIG_LABEL: "gpushare"})
            assert kubelet.wait_for(lambda: kubelet.allocatable(MEM) == 4 * UNITS_PER_GPU
                                    and kubelet.allocatable(COUNT) == 4)
            assert kubelet.wait_for(lambda: kubelet.seen("nvidia.com/gpu")[-1].event == "stream-ended")
            api.create_pod("p", node=NODE, containers={"main": cuda(2)},
                           annotations=gpushare.placement_annotations(1, 2, UNITS_PER_GPU, next(_clock)))
            responses, _ = kubelet.admit_each(MEM, [2])
            assert dict(responses[0].envs)["ALIYUN_COM_GPU_MEM_IDX"] == "1"
            api.set_labels(NODE, {CONFIG_LABEL: None})  # back to whole GPUs
            assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 4)
            assert plugin.proc.poll() is None and plugin.stop() == 0
