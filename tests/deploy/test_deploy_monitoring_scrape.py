"""The metrics the alerts and the dashboard use, as the real processes serve them: every long-running
command runs (``run``, ``device-plugin``, ``mps-control-daemon``, ``dra-plugin``, ``scheduler-extender``) on a
simulated node against the fake API server, and its /metrics is scraped as Prometheus would.

test_deploy_monitoring.py checks the rules against the metrics classes; this checks that those classes
are what the processes serve: every family in the catalog is on some process's /metrics, of its type,
and no process serves a gpu-labeller family the catalog lacks.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path


from tests.builders import PATIENCE_S, config_map_volume, wait_for
from tests.deploy.monitoring import families
from tests.extender.conftest import mem_pod, share_node
from tests.fakes.apiserver import FakeApiServer
from tests.processes import LoggedProcess


NODE = "gpu-node-1"
# Where each metrics class is served: the package of the class (tests.deploy.monitoring) -> the command.
COMMANDS = {"daemon": "run", "plugin": "device-plugin", "mps": "mps-control-daemon", "draplugin": "dra-plugin",
            "extender": "scheduler-extender"}
# The named-config metrics (package "process") are served by each command that follows a config, by prefix.
CONFIG_PREFIXES = {"gpu_labeller_config": "run", "gpu_labeller_plugin_config": "device-plugin",
                   "gpu_labeller_mps_config": "mps-control-daemon", "gpu_labeller_dra_config": "dra-plugin"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE_S) as answer:
            return str(answer.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return None


def exposed_families(text: str) -> dict[str, str]:
    """Family name -> type, from the exposition's # TYPE lines (there even for a labelled metric with no child;
    a counter's is named with _total, and prometheus_client adds its own _created series)."""
    return {name: kind for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)
            if not name.endswith("_created")}


def exposed_name(name: str, kind: str) -> str:
    return f"{name}_total" if kind == "counter" else name


@contextmanager
def every_process(api: FakeApiServer, tmp_path: Path, sock_dir: Path) -> Iterator[dict[str, int]]:
    """Each command running on a simulated node: command -> its metrics port."""
    api.create_node(NODE)
    share_node(api, "share-1")
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    ports = {command: free_port() for command in COMMANDS.values()}
    extender_port = free_port()
    (sock_dir / "reg").mkdir()
    (sock_dir / "plugins").mkdir()
    # As the chart runs them: named configs from a ConfigMap's directory (here one, whose DRA vendors the
    # DRA plugin needs), no config label to follow.
    configs = tmp_path / "configs"
    config_map_volume(configs, {"default": {"version": "v1", "labeller": {"dra": {"vendors": ["nvidia"]}}}})
    node = ["--node-name", NODE, "--kubeconfig", kubeconfig, "--config-dir", str(configs), "--config-label", ""]
    commands = {
        "run": [*node, "--simulate", "dgx-h100", "--start-jitter", "0"],
        "device-plugin": ["--simulate", "dgx-h100", "--socket-dir", str(sock_dir), "--config-dir", str(configs),
                          "--config-label", ""],
        "mps-control-daemon": ["--simulate", "dgx-h100", "--config-dir", str(configs), "--config-label", ""],
        "dra-plugin": [*node, "--simulate", "dgx-h100", "--registry-dir",
                       str(sock_dir / "reg"), "--plugins-dir", str(sock_dir / "plugins"), "--cdi-spec-dir",
                       str(tmp_path / "cdi")],
        "scheduler-extender": ["--kubeconfig", kubeconfig, "--port", str(extender_port)],
    }
    with ExitStack() as stack:
        processes = {command: stack.enter_context(LoggedProcess(
            command, *args, "--metrics-port", str(ports[command]), "--metrics-bind", "127.0.0.1"))
            for command, args in commands.items() if command != "scheduler-extender"}
        processes["scheduler-extender"] = stack.enter_context(LoggedProcess(  # no --metrics-bind: it binds loopback
            "scheduler-extender", *commands["scheduler-extender"], "--metrics-port", str(ports["scheduler-extender"])))
        for port in ports.values():
            wait_for(lambda port=port: scrape(port) is not None)  # type: ignore[misc]
        # the calls whose verbs the alerts select (GpuLabellerExtenderSlow: filter and prioritize)
        pod = mem_pod(api, "shares-a-gpu", 4)
        for verb in ("filter", "prioritize"):
            request = urllib.request.Request(f"http://127.0.0.1:{extender_port}/gpushare-scheduler/{verb}",
                                             data=json.dumps({"Pod": pod, "NodeNames": ["share-1"]}).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
            wait_for(lambda request=request: _answers(request))  # type: ignore[misc]
        yield ports
        for command, process in processes.items():
            assert process.stop() == 0, f"{command}:\n{process.log}"


def _answers(request: urllib.request.Request) -> bool:
    try:
        with urllib.request.urlopen(request, timeout=PATIENCE_S) as answer:
            return int(answer.status) == 200
    except urllib.error.HTTPError:
        return False  # not ready: its first list of pods and nodes is not in


def served_by(family_name: str, package: str) -> str:
    if package == "process":
        return next(command for prefix, command in CONFIG_PREFIXES.items() if family_name.startswith(prefix))
    return COMMANDS[package]


def test_every_metric_of_the_catalog_is_served_by_its_process(api: FakeApiServer, tmp_path: Path,
                                                                sock_dir: Path) -> None:
    with every_process(api, tmp_path, sock_dir) as ports:
        texts = {command: scrape(port) or "" for command, port in ports.items()}
    served = {command: exposed_families(text) for command, text in texts.items()}
    catalog = families()
    for family in catalog:
        command = served_by(family.name, family.package)
        if family.name == "gpu_labeller_api_requests" and command != "scheduler-extender":
            command = "run"  # the labeller's and the extender's own registries both have it
        name = exposed_name(family.name, family.type)
        assert served[command].get(name) == family.type, f"{name} ({family.type}) not on {command}"
    ours = {name for types in served.values() for name in types if name.startswith("gpu_labeller_")}
    assert ours == {exposed_name(family.name, family.type) for family in catalog}
    # the verbs GpuLabellerExtenderSlow selects are the ones the extender's histogram gets
    extender = texts["scheduler-extender"]
    for verb in ("filter", "prioritize"):
        assert f'gpu_labeller_extender_request_duration_seconds_bucket{{le="+Inf",verb="{verb}"}} 1.0' in extender
