"""``gpu-labeller nodes`` and ``match --kubeconfig`` against the fake API server (one list per kind),
and shell completion through click's completion protocol (in this process), with and without a cluster."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from labeller.cli.root import main
from labeller.host.fleet import fleet_text, node_row, pod_requests
from tests.core.cli import error_line, in_process
from tests.fakes.apiserver import FakeApiServer


def profile_labels(profile: str) -> dict[str, str]:
    result = in_process("labels", "--simulate", profile, "--format", "json")
    assert result.returncode == 0, result.stderr
    labels: dict[str, str] = json.loads(result.stdout)
    return labels


def cluster(api: FakeApiServer) -> None:
    """An H100 node sharing half its GPUs, an MI300X node, a node whose plugin runs without the
    labeller, a node whose named config failed, and a CPU node; pods in every state."""
    api.create_node("h100-0", profile_labels("dgx-h100-4of8-shared"))
    api.set_node_status("h100-0", {"cpu": "224", "nvidia.com/gpu": "4", "nvidia.com/gpu.shared": "16"},
                        {"cpu": "220", "nvidia.com/gpu": "3", "nvidia.com/gpu.shared": "16"})
    api.create_node("mi300x-0", profile_labels("mi300x-x8-spx"))
    api.set_node_status("mi300x-0", {"amd.com/gpu": "8"})
    api.create_node("unlabelled-0", {"kubernetes.io/hostname": "unlabelled-0"})
    api.set_node_status("unlabelled-0", {"nvidia.com/gpu": "2"})
    api.create_node("t4-0", {**profile_labels("t4-time-slicing"), "nvidia.com/device-plugin.config.state": "failed"})
    api.create_node("cpu-0", {"kubernetes.io/os": "linux"})
    api.set_node_status("cpu-0", {"cpu": "8"})
    api.create_pod("train", node="h100-0", containers={"a": {"nvidia.com/gpu": "1"}, "b": {"nvidia.com/gpu": "1"}},
                   phase="Running")
    api.create_pod("notebook", node="h100-0", containers={"main": {"nvidia.com/gpu.shared": "3"}}, phase="Running")
    api.create_pod("starting", node="mi300x-0", containers={"main": {"amd.com/gpu": "4"}}, phase="Pending")
    api.create_pod("done", node="h100-0", containers={"main": {"nvidia.com/gpu": "2"}}, phase="Succeeded")
    api.create_pod("failed", node="mi300x-0", containers={"main": {"amd.com/gpu": "2"}}, phase="Failed")
    api.create_pod("unbound", containers={"main": {"nvidia.com/gpu": "8"}})


def test_nodes_one_line_per_gpu_node_with_use_and_readiness(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        cluster(api)
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        before = len(api.log.requests)
        result = in_process("nodes", "--kubeconfig", kubeconfig, "--format", "json")
        assert result.returncode == 0, result.stderr
        requests = [(r.verb, r.resource) for r in api.log.requests[before:]]
        text = in_process("nodes", "--kubeconfig", kubeconfig)
    assert sorted(requests) == [("list", "nodes"), ("list", "pods")]
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert sorted(rows) == ["h100-0", "mi300x-0", "t4-0", "unlabelled-0"]
    h100 = rows["h100-0"]
    assert (h100["vendors"], h100["model"], h100["count"], h100["memory"]) == (
        ["nvidia"], "NVIDIA-H100-80GB-HBM3", "8", "81559MiB")
    assert h100["sharing"] == "time-slicing x4 on 4" and h100["mig"] == "capable, off"
    assert h100["resources"] == [{"name": "nvidia.com/gpu", "capacity": 4, "allocatable": 3, "used": 2},
                                 {"name": "nvidia.com/gpu.shared", "capacity": 16, "allocatable": 16, "used": 3}]
    assert (h100["labeller"], h100["plugin"]) == ("ready", "ready")
    mi300x = rows["mi300x-0"]
    assert (mi300x["model"], mi300x["count"], mi300x["memory"]) == ("AMD_Instinct_MI300X_OAM", "8", "192G")
    assert mi300x["resources"] == [{"name": "amd.com/gpu", "capacity": 8, "allocatable": 8, "used": 4}]
    assert (rows["unlabelled-0"]["labeller"], rows["unlabelled-0"]["plugin"]) == ("no labels", "ready")
    assert (rows["t4-0"]["labeller"], rows["t4-0"]["plugin"]) == ("config failed", "no capacity: nvidia")
    lines = text.stdout.splitlines()
    assert lines[0].split()[:3] == ["NODE", "VENDOR", "MODEL"] and len(lines) == 5
    assert "nvidia.com/gpu 4/3/2 nvidia.com/gpu.shared 16/16/3" in lines[1]


def test_nodes_bad_credentials_and_unknown_node_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("not: [a kubeconfig")
    result = in_process("nodes", "--kubeconfig", str(bad))
    assert result.returncode == 2 and str(bad) in error_line(result)
    with FakeApiServer() as api:
        cluster(api)
        result = in_process("nodes", "--kubeconfig", str(api.write_kubeconfig(tmp_path / "k")), "nope")
    assert result.returncode == 2 and "no GPU node named nope" in error_line(result)


def test_match_on_live_nodes_is_one_list_call(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        cluster(api)
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        before = len(api.log.requests)
        result = in_process("match", "nvidia.com/gpu.product=NVIDIA-H100-80GB", "--kubeconfig", kubeconfig)
        requests = [(r.verb, r.resource) for r in api.log.requests[before:]]
        found = in_process("match", "nvidia.com/gpu.present,nvidia.com/gpu.memory>15000", "--kubeconfig", kubeconfig)
    assert requests == [("list", "nodes")]
    assert result.returncode == 1
    assert "near   h100-0: nvidia.com/gpu.product=NVIDIA-H100-80GB: has nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" \
        in result.stdout.splitlines()
    assert found.returncode == 0 and found.stdout.splitlines()[:2] == ["match  h100-0", "match  t4-0"]


def test_pod_requests_default_to_limits_and_count_init_containers() -> None:
    pod = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}},
                                   {"resources": {"requests": {"nvidia.com/gpu": "1"},
                                                  "limits": {"nvidia.com/gpu": "1"}}}],
                    "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    assert pod_requests(pod) == {"nvidia.com/gpu": 4}


def test_a_memory_sharing_node_is_nvidia_served_by_its_plugin() -> None:
    """gpushare's aliyun.com/gpu-mem and gpu-count are how the device plugin serves NVIDIA GPUs on a
    memory-sharing node: the plugin is ready, the vendor is nvidia, and the sharing is said once."""
    labels = {"gpushare": "true", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "4",
              "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15109",
              "nvidia.com/gpu.replicas": "14", "nvidia.com/gpu.sharing-strategy": "memory"}
    node = {"metadata": {"name": "t4-0", "labels": labels},
            "status": {"capacity": {"aliyun.com/gpu-mem": "56", "aliyun.com/gpu-count": "4"},
                       "allocatable": {"aliyun.com/gpu-mem": "56", "aliyun.com/gpu-count": "4"}}}
    row = node_row(node, {"aliyun.com/gpu-mem": 10})
    assert row is not None
    assert (row.vendors, row.labeller, row.plugin) == (("nvidia",), "ready", "ready")
    assert row.sharing == "memory: aliyun.com/gpu-mem, 14 units per GPU"
    line = fleet_text([row]).splitlines()[1]
    assert line.split()[:2] == ["t4-0", "nvidia"] and line.count("gpushare") == 0


# --- completion ---------------------------------------------------------------------------------

def complete(*words: str, env: dict[str, str] | None = None) -> list[str]:
    """What bash completion offers for the last of ``words`` (click's bash_complete protocol)."""
    line = ["gpu-labeller", *words]
    environment = {"_GPU_LABELLER_COMPLETE": "bash_complete", "COMP_WORDS": " ".join(line),
                   "COMP_CWORD": str(len(line) - 1), **(env or {})}
    # as the installed entry point runs it: click names the variable after the program
    result = CliRunner().invoke(main, [], env=environment, prog_name="gpu-labeller")
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    lines = [line for line in result.stdout.splitlines() if line]
    assert all(line.startswith(("plain,", "file,", "dir,")) for line in lines), result.stdout  # nothing else on stdout
    return [item.split(",", 1)[1] for item in lines if item.startswith("plain,")]


def test_completion_offers_profiles_label_keys_and_node_names(tmp_path: Path) -> None:
    assert complete("labels", "--simulate", "dgx") == ["dgx-a100-mig-dynamic", "dgx-a100-mig-mixed", "dgx-h100",
                                                      "dgx-h100-4of8-shared"]
    assert complete("match", "x", "--simulate", "mi300x-x8-c") == ["mi300x-x8-cpx", "mi300x-x8-cpx-mixed"]
    keys = complete("explain", "nvidia.com/gpu.sh")
    assert keys == ["nvidia.com/gpu.shared-count", "nvidia.com/gpu.sharing-strategy"]
    assert "amd.com/gpu.vram" in complete("explain", "amd.com/gpu.v")
    # with a profile on the line, its own keys too (a MIG profile's mig-<profile>.* keys)
    assert "nvidia.com/mig-1g.5gb.count" in complete("explain", "--simulate", "dgx-a100-mig-mixed", "nvidia.com/mig-1g")
    assert complete("explain", "--simulate", "l40s-x4-mps", "nvidia.com/mps") == ["nvidia.com/mps.capable"]  # it logs
    with FakeApiServer() as api:
        cluster(api)
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        assert complete("nodes", "--kubeconfig", kubeconfig, "h") == ["h100-0"]
        assert complete("nodes", "m", env={"KUBECONFIG": kubeconfig}) == ["mi300x-0"]
        assert complete("cleanup", "--kubeconfig", kubeconfig, "--node", "t") == ["t4-0"]
        assert complete("run", "--node-name", "u", env={"KUBECONFIG": kubeconfig}) == ["unlabelled-0"]


def test_completion_without_a_cluster_offers_nothing_quietly(tmp_path: Path) -> None:
    assert complete("nodes", "", env={"KUBECONFIG": str(tmp_path / "missing")}) == []
    refused = tmp_path / "kubeconfig"
    with FakeApiServer() as api:
        api.write_kubeconfig(refused)
    assert complete("nodes", "--kubeconfig", str(refused), "") == []  # the server is gone: connection refused
    assert complete("labels", "--simulate", "no-such") == []
