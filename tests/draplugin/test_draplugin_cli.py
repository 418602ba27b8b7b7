"""The real ``gpu-labeller dra-plugin`` process: flags, registering, publishing, preparing, metrics,
SIGTERM; and SIGKILL between prepare and unprepare, then a restart that cleans everything up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from labeller.cli.root import main
from labeller.model.namedconfigs import CONFIG_LABEL
from tests.builders import AT_ONCE_S, config_map_volume, wait_for
from tests.draplugin.conftest import NODE, NVIDIA, Dirs, dra_config, simulated_plugin
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet
from tests.plugin.profile_files import write_yaml
from tests.plugin.test_plugin_cli import PluginProcess


def test_help_lists_the_flags() -> None:
    result = CliRunner().invoke(main, ["dra-plugin", "--help"])
    assert result.exit_code == 0
    for flag in ("--host-root", "--simulate", "--config", "--config-dir", "--node-name", "--kubeconfig",
                 "--metrics-port", "--cdi-spec-dir", "--plugins-dir", "--registry-dir", "--health-recovery-seconds",
                 "--probe-interval", "--mps-root", "--mps-control", "--nvidia-smi"):
        assert flag in result.output
    assert "/var/lib/kubelet/plugins]" in result.output and "/var/lib/kubelet/plugins_registry]" in result.output
    assert "dra-plugin" in CliRunner().invoke(main, ["--help"]).output


def test_without_a_node_name_it_is_one_line_and_exit_2(dirs: Dirs) -> None:
    result = subprocess.run([sys.executable, "-m", "labeller.cli", "dra-plugin", "--simulate", "dgx-h100",
                             "--registry-dir", str(dirs.registry), "--plugins-dir", str(dirs.plugins)],
                            capture_output=True, text=True, timeout=30,
                            env={k: v for k, v in os.environ.items() if k != "NODE_NAME"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "Error: the DRA plugin publishes this Node's ResourceSlices: give --node-name NAME or set NODE_NAME"]


def test_a_relative_mps_root_is_one_line_and_exit_2(dirs: Dirs) -> None:
    result = subprocess.run([sys.executable, "-m", "labeller.cli", "dra-plugin", "--simulate", "dgx-h100",
                             "--node-name", NODE, "--registry-dir", str(dirs.registry), "--plugins-dir",
                             str(dirs.plugins), "--mps-root", "run/mps"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "Error: --mps-root run/mps: must be an absolute path (claims' containers mount from it)"]


BAD_DIRECTORIES = {
    "a regular file as the checkpoint": ("--plugins-dir", f"{NVIDIA}/claims", "a regular file"),
    "a symlink as the checkpoint": ("--plugins-dir", f"{NVIDIA}/claims", "a symlink"),
    "a symlink as the driver's directory": ("--plugins-dir", NVIDIA, "a symlink"),
    "a symlink as the CDI spec directory": ("--cdi-spec-dir", "", "a symlink"),
}


@pytest.mark.parametrize("kind", sorted(BAD_DIRECTORIES))
def test_a_directory_of_the_plugin_that_is_not_one_is_one_line_and_exit_2(api: FakeApiServer, dirs: Dirs,
                                                                          tmp_path: Path, kind: str) -> None:
    flag, below, what = BAD_DIRECTORIES[kind]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = dirs.plugins if flag == "--plugins-dir" else dirs.cdi
    path = base / below if below else base
    path.parent.mkdir(parents=True, exist_ok=True)
    if what == "a symlink":
        path.symlink_to(elsewhere)
    else:
        path.write_text("")
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.create_node(NODE)
    result = subprocess.run([sys.executable, "-m", "labeller.cli", "dra-plugin", "--simulate", "dgx-h100",
                             "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--registry-dir", str(dirs.registry),
                             "--plugins-dir", str(dirs.plugins), "--cdi-spec-dir", str(dirs.cdi)],
                            capture_output=True, text=True, timeout=60)
    real = Path(os.path.realpath(path.parent)) / path.name
    prefix = (f"{flag} {dirs.plugins}: cannot keep the prepared claims of {NVIDIA}: " if flag == "--plugins-dir"
              else f"{flag} {dirs.cdi}: ")
    assert (result.returncode, result.stderr.strip().splitlines()) == (
        2, [f"Error: {prefix}{real} is {what}, not a directory; left alone"])
    assert list(elsewhere.iterdir()) == [] and api.log.requests == []


def test_a_driver_whose_claims_cannot_be_kept_is_not_served_until_they_can(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    """Made bad while the plugin runs (the command line checked it at start): nothing published for
    that driver, not ready, probed again; served once the path is a directory again."""
    claims = dirs.plugins / NVIDIA / "claims"
    claims.parent.mkdir(parents=True)
    claims.write_text("")
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100", ready=False) as run:
        probes = run.plugin.probes
        wait_for(lambda: run.plugin.probes >= probes + 2)
        assert not run.plugin.ready and run.slices(NVIDIA) == [] and not drakubelet.registered(NVIDIA)
        claims.unlink()
        wait_for(lambda: run.plugin.ready)
        assert len(run.devices()) == 8 and claims.is_dir()


def dra_process(api: FakeApiServer, dirs: Dirs, *args: str) -> PluginProcess:
    """A real ``gpu-labeller dra-plugin`` process for node ``NODE`` on the fake API server."""
    kubeconfig = api.write_kubeconfig(dirs.plugins.parent / "kubeconfig")
    config = dirs.plugins.parent / "dra-config.yaml"
    write_yaml(config, dra_config("nvidia"))
    return PluginProcess("--node-name", NODE, "--kubeconfig", str(kubeconfig), "--config", str(config),
                         "--registry-dir", str(dirs.registry),
                         "--plugins-dir", str(dirs.plugins), "--cdi-spec-dir", str(dirs.cdi), *args,
                         command="dra-plugin")


def metrics(process: PluginProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{process.port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def test_registers_publishes_prepares_and_stops_on_sigterm(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                           dirs: Dirs) -> None:
    api.create_node(NODE)
    with dra_process(api, dirs, "--simulate", "dgx-h100") as plugin:
        assert drakubelet.wait_for(lambda: drakubelet.registered(NVIDIA))
        assert plugin.event("ResourceSlices published")["devices"] == 8
        assert drakubelet.wait_for(lambda: plugin.status("/readyz") == 200)
        uid = api.create_resource_claim("claim", results=[
            {"request": "gpu", "driver": NVIDIA, "pool": NODE, "device": "gpu-0"}])["metadata"]["uid"]
        claim = Claim("default", "claim", uid, NVIDIA)
        answer = drakubelet.prepare("pod-1", [claim])[uid]
        assert not answer.error and [d.device_name for d in answer.devices] == ["gpu-0"]
        text = metrics(plugin)
        assert 'gpu_labeller_dra_prepares_total{driver="gpu.nvidia.com",outcome="ok"} 1.0' in text
        assert 'gpu_labeller_dra_registered{driver="gpu.nvidia.com"} 1.0' in text
        assert 'gpu_labeller_dra_devices{driver="gpu.nvidia.com",health="Healthy"} 8.0' in text
        assert not drakubelet.unprepare("pod-1", [claim])[uid].error
        assert plugin.stop() == 0
    assert list(dirs.registry.iterdir()) == [] and list(dirs.cdi.iterdir()) == []
    assert "Traceback" not in "".join(plugin.stderr)


def test_a_driver_the_kubelet_never_registers_is_exported_as_unregistered(api: FakeApiServer, dirs: Dirs) -> None:
    """No kubelet watches the registry directory: gpu_labeller_dra_registered is 0 (not absent), so the
    GpuLabellerDraNotRegistered alert fires."""
    api.create_node(NODE)
    with dra_process(api, dirs, "--simulate", "dgx-h100") as plugin:
        plugin.event("serving")
        assert 'gpu_labeller_dra_registered{driver="gpu.nvidia.com"} 0.0' in metrics(plugin)
        assert plugin.stop() == 0


def test_sigkill_between_prepare_and_unprepare_leaks_nothing(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                             dirs: Dirs) -> None:
    api.create_node(NODE)
    uid = api.create_resource_claim("claim", results=[
        {"request": "gpu", "driver": NVIDIA, "pool": NODE, "device": "gpu-3"}])["metadata"]["uid"]
    claim = Claim("default", "claim", uid, NVIDIA)
    with dra_process(api, dirs, "--simulate", "dgx-h100") as first:
        assert drakubelet.wait_for(lambda: drakubelet.registered(NVIDIA))
        prepared = drakubelet.prepare("pod-1", [claim])[uid]
        assert not prepared.error
        first.proc.send_signal(signal.SIGKILL)
        assert first.proc.wait(10) == -signal.SIGKILL
    since = time.monotonic()
    with dra_process(api, dirs, "--simulate", "dgx-h100") as second:
        assert drakubelet.wait_for(lambda: drakubelet.seen("registered", NVIDIA, since=since))
        assert drakubelet.call_prepare(NVIDIA, [claim])[uid] == prepared  # still known
        assert not drakubelet.unprepare("pod-1", [claim])[uid].error
        assert list(dirs.cdi.iterdir()) == []
        assert list((dirs.plugins / NVIDIA / "claims").iterdir()) == []
        assert second.stop() == 0
    assert sorted(p.name for p in (dirs.plugins / NVIDIA).iterdir()) == ["claims"]


def test_the_node_label_moves_the_node_between_the_device_plugin_and_dra(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path) -> None:
    api.create_node(NODE)
    directory = config_map_volume(tmp_path / "configs", {"default": {"version": "v1"}, "dra": dra_config("nvidia")})
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    with PluginProcess("--simulate", "dgx-h100", "--config-dir", str(directory), "--node-name", NODE,
                       "--kubeconfig", str(kubeconfig), "--registry-dir", str(dirs.registry), "--plugins-dir",
                       str(dirs.plugins), "--cdi-spec-dir", str(dirs.cdi), command="dra-plugin") as plugin:
        assert plugin.event("no vendor is served through DRA on this node (labeller.dra.vendors); publishing nothing")
        assert drakubelet.wait_for(lambda: plugin.status("/readyz") == 200)  # idle is not a problem
        assert api.slices(NODE) == [] and drakubelet.seen("registered") == []
        labelled = time.monotonic()
        api.set_labels(NODE, {CONFIG_LABEL: "dra"})
        assert drakubelet.wait_for(lambda: len(api.slices(NODE, NVIDIA)) == 1)
        assert time.monotonic() - labelled < AT_ONCE_S
        assert drakubelet.wait_for(lambda: drakubelet.registered(NVIDIA))
        labelled = time.monotonic()
        api.set_labels(NODE, {CONFIG_LABEL: "default"})  # back to the device plugin
        assert drakubelet.wait_for(lambda: api.slices(NODE) == [])
        assert time.monotonic() - labelled < AT_ONCE_S
        assert drakubelet.wait_for(lambda: drakubelet.seen("deregistered", NVIDIA))
        # ready again once the publisher has seen its own deletes come back, not at the same instant
        assert drakubelet.wait_for(lambda: plugin.status("/readyz") == 200)
        assert plugin.count("nothing to publish yet; probing again") == 0
        assert plugin.stop() == 0
