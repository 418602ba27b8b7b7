"""``gpu-labeller run`` and ``cleanup`` as real processes against the fake API server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from labeller.model.labels import FIELD_MANAGER
from tests.builders import PATIENCE_S, wait_for
from tests.core.cli import in_process
from tests.daemon.conftest import NODE, OTHERS
from tests.fakes.apiserver import FakeApiServer
from tests.processes import LoggedProcess


GPU_PROFILE = "mi210-x8"  # a built-in simulated node with 8 AMD GPUs


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "labeller.cli", "--log-format", "json", *args]


def run_options(kubeconfig: Path, *extra: str, profile: str = GPU_PROFILE) -> list[str]:
    return ["run", "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--simulate", profile, "--start-jitter", "0",
            "--metrics-port", "0", *extra]


def run_args(kubeconfig: Path, *extra: str, profile: str = GPU_PROFILE) -> list[str]:
    return cli(*run_options(kubeconfig, *extra, profile=profile))


def run_once(kubeconfig: Path, *extra: str, profile: str = GPU_PROFILE) -> subprocess.CompletedProcess[str]:
    """``gpu-labeller run --once`` to completion, in this process (the fake API server is here too)."""
    return in_process("--log-format", "json", *run_options(kubeconfig, "--once", *extra, profile=profile))


def finished(args: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=PATIENCE_S, check=False, **options)


def no_gpu_profile(tmp_path: Path) -> Path:
    path = tmp_path / "no-gpu.yaml"
    path.write_text("name: no-gpu\nmachine: PowerEdge R650\n")
    return path


def ours(api: FakeApiServer) -> dict[str, str]:
    return {k: v for k, v in api.labels(NODE).items() if k not in OTHERS}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=PATIENCE_S) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_run_labels_the_node_serves_metrics_and_exits_promptly_on_sigterm(api: FakeApiServer, kubeconfig: Path) -> None:
    api.create_node(NODE, OTHERS)
    port = free_port()
    options = run_options(kubeconfig, "--interval", "0.5", "--metrics-port", str(port))  # the last port wins
    with LoggedProcess(*options) as daemon:
        wait_for(lambda: "amd.com/gpu.present" in ours(api))
        # ready once the write's answer is back: milliseconds after the labels show on the Node
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE_S) as answer:
            assert b"gpu_labeller_labels_owned" in answer.read()
        assert daemon.stop() == 0
    daemon.event("stopped", reason="stop")
    assert {entry["node"] for entry in daemon.events} == {NODE} and all("reason" in entry for entry in daemon.events)


def test_a_daemon_stopped_by_ctrl_c_logs_sigint(tmp_path: Path) -> None:
    features = tmp_path / "features"
    with LoggedProcess("run", "--node-name", NODE, "--output", "features-file", "--features-file", str(features),
                       "--simulate", GPU_PROFILE, "--start-jitter", "0", "--metrics-port", "0") as daemon:
        daemon.event("labels updated")
        assert daemon.stop(signal.SIGINT) == 0  # a clean stop, as on SIGTERM; it awaits "signal received" SIGINT
    daemon.event("stopped", reason="stop")
    assert "sigterm" not in daemon.log.lower() and "Traceback" not in daemon.log


def test_sighup_reloads_and_reprobes(api: FakeApiServer, kubeconfig: Path, tmp_path: Path) -> None:
    api.create_node(NODE, OTHERS)
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    with LoggedProcess(*run_options(kubeconfig, "--interval", "3600", "--config", str(config))) as daemon:
        wait_for(lambda: "amd.com/gpu.present" in ours(api))
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.event("config reloaded", reason="sighup")  # the SIGHUP was taken: the config file read again
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0  # promptly, though the next probe is an hour away
    assert daemon.count("reloading config and probing again", reason="sighup") == 1


def test_once_with_no_such_node_says_so_in_one_error_line_and_waits_for_nothing(kubeconfig: Path) -> None:
    result = run_once(kubeconfig)
    assert result.returncode == 1
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(e["level"], e["event"]) for e in entries if e["level"] in ("warning", "error")] == [
        ("error", f"node {NODE} not found")]
    assert "waiting" not in result.stderr


def test_once_exit_codes(api: FakeApiServer, kubeconfig: Path) -> None:
    missing = run_once(kubeconfig)
    assert missing.returncode == 1 and f"node {NODE} not found" in missing.stderr
    api.create_node(NODE, OTHERS)
    done = run_once(kubeconfig)
    assert done.returncode == 0, done.stderr
    assert ours(api)["amd.com/gpu.present"] == "true"


def test_dry_run_logs_the_change_and_writes_nothing(api: FakeApiServer, kubeconfig: Path) -> None:
    api.create_node(NODE, OTHERS)
    result = run_once(kubeconfig, "--dry-run")
    assert result.returncode == 0, result.stderr
    line = next(json.loads(text) for text in result.stderr.splitlines() if "would apply" in text)
    assert "amd.com/gpu.present" in line["added"] and line["reason"] == "dry-run"
    assert api.log.writes() == [] and api.labels(NODE) == OTHERS


def test_no_gpu_node_ends_with_none_of_ours_and_keeps_a_users(api: FakeApiServer, kubeconfig: Path,
                                                              tmp_path: Path) -> None:
    api.create_node(NODE, OTHERS)
    assert run_once(kubeconfig).returncode == 0
    api.set_labels(NODE, {"nvidia.com/gpu.product": "by-hand"})  # under our prefix, but a user's
    result = run_once(kubeconfig, profile=str(no_gpu_profile(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert api.labels(NODE) == {**OTHERS, "nvidia.com/gpu.product": "by-hand"}


ADMIN = {"nvidia.com/vgpu.config": "A100-4C", "nvidia.com/vgpu.config.state": "success",
         "nvidia.com/gpu.imex-domain": "x"}
OPERATOR = {"nvidia.com/gpu.deploy.driver": "true", "nvidia.com/mig.config": "all-disabled",
            "nvidia.com/mig.config.state": "success", "nvidia.com/gpu.workload.config": "container",
            "nvidia.com/device-plugin.config": "default"}


def cleanup(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return in_process("--log-format", "json", "cleanup", "--kubeconfig", str(kubeconfig), *args)


def test_admin_labels_survive_run_and_cleanup(api: FakeApiServer, kubeconfig: Path) -> None:
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, {**ADMIN, **OPERATOR}, manager="kubectl-label")
    run = run_once(kubeconfig, profile="dgx-h100")
    assert run.returncode == 0, run.stderr
    assert api.labels(NODE)["nvidia.com/vgpu.present"] == "false"
    assert "foreign-labels" in run.stderr and "nvidia.com/gpu.imex-domain" in run.stderr
    done = cleanup(kubeconfig, "--node", NODE)
    assert done.returncode == 0, done.stderr
    assert api.labels(NODE) == {**OTHERS, **ADMIN, **OPERATOR}
    lines = done.stdout.splitlines()
    assert f"{NODE}: removed nvidia.com/vgpu.present (set by gpu-labeller)" in lines
    assert f"{NODE}: left nvidia.com/gpu.imex-domain (set by kubectl-label; --include-foreign removes it)" in lines
    assert lines[-1] == f"{NODE}: 26 removed, 0 released, 1 left"


def test_cleanup_removes_only_what_gpu_labeller_set(api: FakeApiServer, kubeconfig: Path) -> None:
    api.create_node(NODE, OTHERS)
    api.create_node("node-2", {"nvidia.com/gpu.present": "true", "team": "x"})  # set by whoever created the Node
    assert run_once(kubeconfig).returncode == 0
    api.apply_as(NODE, "other-applier", {"amd.com/gpu.present": "true"})  # co-owned: same value
    one = cleanup(kubeconfig, "--node", NODE)
    assert one.returncode == 0, one.stderr
    assert api.labels(NODE) == {**OTHERS, "amd.com/gpu.present": "true"}  # only our claim on it went
    assert f"{NODE}: released amd.com/gpu.present (also set by other-applier, so it stays)" in one.stdout.splitlines()
    every = cleanup(kubeconfig, "--all-nodes")
    assert every.returncode == 0, every.stderr
    assert api.labels("node-2") == {"nvidia.com/gpu.present": "true", "team": "x"}
    assert ("node-2: left nvidia.com/gpu.present (set by kubelet; --include-foreign removes it)"
            in every.stdout.splitlines())
    usage = cleanup(kubeconfig)
    assert usage.returncode == 2


def test_cleanup_include_foreign_removes_other_managers_keys_but_never_the_gpu_operators(
        api: FakeApiServer, kubeconfig: Path) -> None:
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, {**ADMIN, **OPERATOR, "nvidia.com/gpu.product": "old-gfd"}, manager="gpu-feature-discovery")
    dry = cleanup(kubeconfig, "--node", NODE, "--include-foreign", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        f"{NODE}: would remove nvidia.com/gpu.imex-domain (set by gpu-feature-discovery)",
        f"{NODE}: would remove nvidia.com/gpu.product (set by gpu-feature-discovery)",
        f"{NODE}: 2 to remove, 0 to release, 0 left"]
    assert api.log.writes() == []
    done = cleanup(kubeconfig, "--node", NODE, "--include-foreign")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == [
        f"{NODE}: removed nvidia.com/gpu.imex-domain (set by gpu-feature-discovery)",
        f"{NODE}: removed nvidia.com/gpu.product (set by gpu-feature-discovery)"]
    assert api.labels(NODE) == {**OTHERS, **OPERATOR, "nvidia.com/vgpu.config": "A100-4C",
                                "nvidia.com/vgpu.config.state": "success"}


def test_cleanup_names_the_missing_permission_once(api: FakeApiServer, kubeconfig: Path) -> None:
    api.create_node(NODE, OTHERS)
    api.create_node("node-2", OTHERS)
    api.forbid("get")
    result = cleanup(kubeconfig, "--node", NODE, "--node", "node-2")
    assert result.returncode == 1
    lines = [json.loads(line) for line in result.stderr.splitlines() if "permission missing" in line]
    assert [line["event"] for line in lines] == [
        "permission missing: grant verb 'get' on resource 'nodes' to user labeller"]


def test_the_dry_run_path_never_imports_kubernetes(tmp_path: Path) -> None:
    code = ("import sys; from click.testing import CliRunner; from labeller.cli.root import main; "
            f"r = CliRunner().invoke(main, ['labels', '--simulate', '{no_gpu_profile(tmp_path)}']); "
            "assert r.exit_code == 0, r.output; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'prometheus_client') "
            "or m in ('labeller.cluster.kube', 'labeller.apps.daemon', 'labeller.apps.daemon.sinks')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = finished([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_bad_profile_is_exit_2_and_touches_nothing(api: FakeApiServer, kubeconfig: Path,
                                                               tmp_path: Path) -> None:
    api.create_node(NODE, {**OTHERS, "amd.com/gpu.present": "true"})
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\namd:\n  sysfs: no-such-capture\n")
    result = run_once(kubeconfig, profile=str(broken))
    assert result.returncode == 2 and "no-such-capture" in result.stderr
    assert api.labels(NODE)["amd.com/gpu.present"] == "true" and api.log.writes() == []


def test_features_file_output_needs_no_cluster_credentials(tmp_path: Path) -> None:
    features = tmp_path / "features.d" / "gpu-labeller"
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    env["KUBECONFIG"] = str(tmp_path / "no-such-kubeconfig")
    env["HOME"] = str(tmp_path)  # no ~/.kube/config either
    result = finished(cli("run", "--node-name", NODE, "--simulate", GPU_PROFILE, "--start-jitter", "0",
                          "--metrics-port", "0", "--output", "features-file", "--features-file", str(features),
                          "--once"), env=env)
    assert result.returncode == 0, result.stderr
    assert "amd.com/gpu.present=true" in features.read_text().splitlines()


def test_a_memory_sharing_node_gets_gpushare_and_loses_it_when_sharing_stops(api: FakeApiServer, kubeconfig: Path,
                                                                              tmp_path: Path) -> None:
    api.create_node(NODE, {**OTHERS})
    assert run_once(kubeconfig, profile="t4-x4-gpushare").returncode == 0
    labels = ours(api)
    assert (labels["gpushare"], labels["nvidia.com/gpu.sharing-strategy"], labels["nvidia.com/gpu.replicas"]) == \
        ("true", "memory", "14")
    assert api.managers_of(NODE, "gpushare") == {(FIELD_MANAGER, "Apply")}
    whole = tmp_path / "whole.yaml"
    whole.write_text("version: v1\n")
    assert run_once(kubeconfig, "--config", str(whole), profile="t4-x4-gpushare").returncode == 0
    assert "gpushare" not in api.labels(NODE) and ours(api)["nvidia.com/gpu.sharing-strategy"] == "none"
