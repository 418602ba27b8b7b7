"""Per-node named configs in ``gpu-labeller run``: a real process against the fake API server, whose
watch delivers the node label ``nvidia.com/device-plugin.config`` as a user sets, changes and
removes it, and a config directory laid out and updated as the kubelet does a ConfigMap volume."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from labeller.cli.root import main

from labeller.model.namedconfigs import APPLIED_LABEL, CONFIG_LABEL, STATE_LABEL
from tests.builders import PATIENCE_S, config_map_volume, stays_true, wait_for
from tests.daemon.conftest import NODE, OTHERS
from tests.daemon.test_daemon_cli import free_port, run_args, run_options
from tests.fakes.apiserver import FakeApiServer, Fault
from tests.processes import LoggedProcess


PROFILE = "dgx-a100-mig-mixed"  # 8 A100: 0-3 whole, 4-5 all 1g.5gb, 6-7 balanced
WHOLE = {"version": "v1"}
TS4 = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
MIXED = {"version": "v1", "flags": {"migStrategy": "mixed"}}
BROKEN = "version: v1\nflags:\n  migStrategy: sometimes\n"
# The issue allows 5 s from a label change to the new labels; it takes milliseconds on a quiet machine.
# Asserted with room for a loaded CI box: still far from the 3600 s probe interval these runs use.
SWITCH_S = 20.0


def ts(replicas: int) -> dict[str, Any]:
    return {"version": "v1",
            "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}


class Labeller(LoggedProcess):
    """``gpu-labeller run --config-dir`` as a process; its JSON log lines are read as they come."""

    def __init__(self, kubeconfig: Path, configs: Path, *extra: str) -> None:
        self.metrics_port = free_port()
        super().__init__(*run_options(kubeconfig, "--interval", "3600", "--config-dir", str(configs), "--metrics-port",
                                      str(self.metrics_port), *extra, profile=PROFILE))

    def metric(self, name: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=PATIENCE_S) as answer:
            text = answer.read().decode()
        return next(line.split()[-1] for line in text.splitlines() if line.startswith(name))


@pytest.fixture
def labellers() -> Iterator[list[Labeller]]:
    started: list[Labeller] = []
    yield started
    for labeller in started:
        labeller.__exit__()


def switched(api: FakeApiServer, expected: dict[str, str | None]) -> dict[str, str]:
    """Wait (at most SWITCH_S) until the Node's labels have these values (None: absent)."""

    def now() -> dict[str, str] | None:
        labels = api.labels(NODE)
        return labels if all(labels.get(k) == v for k, v in expected.items()) else None

    found: dict[str, str] = wait_for(now, timeout=SWITCH_S)
    return found


def state(api: FakeApiServer) -> tuple[str | None, str | None]:
    labels = api.labels(NODE)
    return labels.get(STATE_LABEL), labels.get(APPLIED_LABEL)


def test_a_sigterm_while_run_reads_its_config_label_at_start_is_a_clean_stop(
        api: FakeApiServer, kubeconfig: Path, tmp_path: Path, labellers: list[Labeller]) -> None:
    """A pod deleted as it starts: ``run`` gets SIGTERM while it reads its Node's config label (held
    here for 5 s by the API). It stops cleanly once it serves, as the plugins do (exit 0, "stopped"),
    instead of dying by the signal (exit -15)."""
    api.create_node(NODE, OTHERS)
    configs = config_map_volume(tmp_path / "configs", {"default": WHOLE})
    api.faults.add(Fault(verb="get", resource="nodes", delay_s=5.0, times=1))
    labellers.append(run := Labeller(kubeconfig, configs))
    wait_for(lambda: api.log.count(verb="get", resource="nodes") >= 1)  # the read is held now
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(PATIENCE_S) == 0, run.log
    assert run.event("stopped", reason="stop")["node"] == NODE
    assert run.count("signal received", signal="SIGTERM") == 1 and "Traceback" not in run.log


def test_the_node_label_switches_labels_live_and_a_bad_name_changes_nothing(
        api: FakeApiServer, kubeconfig: Path, tmp_path: Path, labellers: list[Labeller]) -> None:
    api.create_node(NODE, OTHERS)
    configs = config_map_volume(tmp_path / "configs", {"default": WHOLE, "ts4": TS4, "mig-mixed": MIXED})
    labellers.append(run := Labeller(kubeconfig, configs, "--events"))
    wait_for(lambda: state(api) == ("success", "default"))
    labels = api.labels(NODE)
    assert labels["nvidia.com/gpu.replicas"] == "1" and "nvidia.com/mig.strategy" not in labels

    api.set_labels(NODE, {CONFIG_LABEL: "ts4"})  # kubectl label node ... nvidia.com/device-plugin.config=ts4
    labels = switched(api, {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"
    assert state(api) == ("success", "ts4")

    api.set_labels(NODE, {CONFIG_LABEL: "mig-mixed"})
    labels = switched(api, {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.replicas": "1"})
    assert labels["nvidia.com/mig-1g.5gb.count"] == "18" and labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"

    api.set_labels(NODE, {CONFIG_LABEL: "ts-typo"})
    wait_for(lambda: state(api) == ("failed", "mig-mixed"), timeout=SWITCH_S)
    assert api.labels(NODE)["nvidia.com/mig.strategy"] == "mixed"  # the last good config stays in force
    assert run.metric("gpu_labeller_config_failed") == "1.0"
    warning = next(e for e in api.events() if e["reason"] == "GPUConfigFailed")
    assert warning["type"] == "Warning"
    assert warning["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE}
    assert f"{CONFIG_LABEL}=ts-typo: no config named 'ts-typo'" in warning["message"]

    api.set_labels(NODE, {CONFIG_LABEL: None})  # the label removed: the default
    labels = switched(api, {"nvidia.com/mig.strategy": None, "nvidia.com/gpu.replicas": "1"})
    assert state(api) == ("success", "default") and run.metric("gpu_labeller_config_failed") == "0.0"
    assert api.labels(NODE).get(CONFIG_LABEL) is None

    assert run.stop() == 0
    assert [e["asked"] for e in run.matching(reason="config-failed")] == ["ts-typo"]  # one line
    assert [e["config"] for e in run.matching("named config applied")] == ["ts4", "mig-mixed", "default"]


def test_the_first_write_already_has_the_labelled_config_and_config_map_edits_reload_it(
        api: FakeApiServer, kubeconfig: Path, tmp_path: Path, labellers: list[Labeller]) -> None:
    api.create_node(NODE, {**OTHERS, CONFIG_LABEL: "shared"})
    configs = config_map_volume(tmp_path / "configs", {"default": WHOLE, "shared": TS4, "broken": BROKEN})
    labellers.append(run := Labeller(kubeconfig, configs))
    wait_for(lambda: state(api) == ("success", "shared"))
    (first,) = api.log.writes()  # never the default first, then the node's config
    assert first.body["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "4"

    config_map_volume(configs, {"default": WHOLE, "shared": ts(2), "broken": BROKEN})  # kubectl edit configmap
    switched(api, {"nvidia.com/gpu.replicas": "2"})

    config_map_volume(configs, {"default": WHOLE, "shared": BROKEN, "broken": BROKEN})  # an edit that breaks it
    wait_for(lambda: state(api) == ("failed", "shared"), timeout=SWITCH_S)
    assert api.labels(NODE)["nvidia.com/gpu.replicas"] == "2"

    api.set_labels(NODE, {CONFIG_LABEL: "broken"})  # a name whose file does not load
    run.event(reason="config-failed", asked="broken")  # taken in, and refused
    stays_true(lambda: state(api) == ("failed", "shared") and api.labels(NODE)["nvidia.com/gpu.replicas"] == "2")

    config_map_volume(configs, {"default": WHOLE, "shared": ts(2), "broken": ts(8)})  # fixed
    switched(api, {"nvidia.com/gpu.replicas": "8"})
    assert state(api) == ("success", "broken")
    assert run.proc.poll() is None  # all of it without a restart
    assert run.stop() == 0


def test_with_the_features_file_output_the_labeller_watches_the_label_itself(
        api: FakeApiServer, kubeconfig: Path, tmp_path: Path, labellers: list[Labeller]) -> None:
    api.create_node(NODE, OTHERS)
    configs = config_map_volume(tmp_path / "configs", {"default": WHOLE, "ts4": TS4})
    features = tmp_path / "features.d" / "gpu-labeller"
    features.parent.mkdir()
    labellers.append(Labeller(kubeconfig, configs, "--output", "features-file", "--features-file", str(features)))

    def lines() -> list[str]:
        return features.read_text().splitlines() if features.exists() else []

    wait_for(lambda: f"{APPLIED_LABEL}=default" in lines())
    api.set_labels(NODE, {CONFIG_LABEL: "ts4"})
    wait_for(lambda: "nvidia.com/gpu.replicas=4" in lines() and f"{APPLIED_LABEL}=ts4" in lines(), timeout=SWITCH_S)
    assert api.log.writes() == []  # the Node is only read


def test_bad_config_flags_are_one_line_and_exit_2(kubeconfig: Path, tmp_path: Path) -> None:
    configs = config_map_volume(tmp_path / "configs", {"ts4": TS4, "mig-mixed": MIXED})

    def error(*extra: str) -> str:
        result = CliRunner().invoke(main, run_args(kubeconfig, "--once", *extra, profile=PROFILE)[3:])
        lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
        return lines[0]

    assert "--config FILE or --config-dir DIR, not both" in error("--config-dir", str(configs), "--config",
                                                                    str(configs / "ts4"))
    assert "--config-name needs --config-dir" in error("--config-name", "ts4")
    assert "not a label key" in error("--config-dir", str(configs), "--config-label", "not a key!")
    assert "gpu-labeller writes itself" in error("--config-dir", str(configs), "--config-label", STATE_LABEL)
    # no label to read (no such node) and no default among two configs: nothing can be in force
    assert "no default config among 2 (mig-mixed, ts4)" in error("--config-dir", str(configs))
