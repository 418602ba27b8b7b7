"""GFD's settings on ``gpu-labeller run`` and ``cleanup --format json``, as real processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.daemon.conftest import NODE, OTHERS
from tests.daemon.test_daemon_cli import GPU_PROFILE, cleanup, cli, finished, run_once
from tests.fakes.apiserver import FakeApiServer


def no_cluster_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    return {**env, "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"), "HOME": str(tmp_path)}


def test_gfd_oneshot_and_output_file_in_the_config_file_make_run_label_once_and_exit(tmp_path: Path) -> None:
    features = tmp_path / "features.d" / "gfd"
    config = tmp_path / "config.yaml"
    config.write_text(f"version: v1\nflags:\n  gfd: {{oneshot: true, noTimestamp: true, sleepInterval: 10s, "
                      f"outputFile: {features}}}\n")
    result = finished(cli("run", "--node-name", NODE, "--simulate", GPU_PROFILE, "--config", str(config),
                          "--output", "features-file", "--start-jitter", "0", "--metrics-port", "0"),
                      env=no_cluster_env(tmp_path))
    assert result.returncode == 0, result.stderr  # without oneshot honoured, run would never exit
    assert "amd.com/gpu.present=true" in features.read_text().splitlines()


def test_gfds_oneshot_and_output_file_flags_and_env_vars(tmp_path: Path) -> None:
    features = tmp_path / "features"
    base = ["run", "--node-name", NODE, "--simulate", GPU_PROFILE, "--output", "features-file",
            "--start-jitter", "0", "--metrics-port", "0"]
    flag = finished(cli(*base, "--oneshot", "-o", str(features)), env=no_cluster_env(tmp_path))
    assert flag.returncode == 0, flag.stderr
    assert "amd.com/gpu.present=true" in features.read_text().splitlines()
    features.unlink()
    env = finished(cli(*base), env={**no_cluster_env(tmp_path), "GFD_ONESHOT": "true",
                                    "GFD_OUTPUT_FILE": str(features)})
    assert env.returncode == 0, env.stderr
    assert features.exists()


def test_cleanup_json_lists_each_nodes_keys_with_their_managers(api: FakeApiServer, kubeconfig: Path) -> None:
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, {"nvidia.com/gpu.imex-domain": "x"}, manager="kubectl-label")
    assert run_once(kubeconfig, profile="dgx-h100").returncode == 0
    result = cleanup(kubeconfig, "--node", NODE, "--node", "no-such-node", "--dry-run", "--format", "json")
    assert result.returncode == 1  # one node could not be cleaned
    [done, missing] = json.loads(result.stdout)
    assert done["node"] == NODE and done["cleaned"] and done["dry_run"]
    assert {"key": "nvidia.com/gpu.present", "managers": ["gpu-labeller"]} in done["removed"]
    assert done["left"] == [{"key": "nvidia.com/gpu.imex-domain", "managers": ["kubectl-label"]}]
    assert done["released"] == []
    assert missing == {"node": "no-such-node", "cleaned": False, "dry_run": True, "removed": [], "released": [],
                       "left": []}
