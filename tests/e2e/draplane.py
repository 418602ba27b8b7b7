"""The real Kubernetes v1.34 DRA plane (shared/k8s-dra) for the e2e scripts that drive it: the control
plane (``Cluster``), one drakubelet and one ``gpu-labeller dra-plugin`` per simulated node (``Node``),
drakubelet's events (``JsonLines``) and the checks and figures each script prints. Not a test.

The control plane runs with ``DRA_STATE`` and the ports of ``DRA_API_PORT``, ``DRA_ETCD_PORT``,
``DRA_ETCD_PEER_PORT``, ``DRA_SCHED_PORT`` and ``DRA_KCM_PORT`` when set (``up.sh`` reads them), so
that two copies can run side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.e2e_plugin import JsonLines as PluginJsonLines  # noqa: E402
from tests.e2e.e2e_plugin import named  # noqa: E402

Event = dict[str, Any]
results: list[tuple[bool, str]] = []
figures: list[str] = []

CHART_MANIFEST = ROOT / "deploy" / "manifests" / "kubelet-dra-plugin.yaml"  # rendered from the chart
DEFAULT_K8S_DRA = Path("/work/shared/k8s-dra")


def k8s_dra_default() -> Path:
    """``$K8S_DRA_DIR``, else ``shared/k8s-dra`` beside the checkout or in it, else /work/shared/k8s-dra."""
    if os.environ.get("K8S_DRA_DIR"):
        return Path(os.environ["K8S_DRA_DIR"])
    for candidate in (ROOT.parent / "shared" / "k8s-dra", ROOT / "shared" / "k8s-dra"):
        if (candidate / "up.sh").exists():
            return candidate
    return DEFAULT_K8S_DRA


def add_k8s_dra_argument(parser: argparse.ArgumentParser) -> None:
    """``--k8s-dra DIR``: the folder with the DRA plane (up.sh, down.sh, dra-bin.sh)."""
    parser.add_argument("--k8s-dra", type=Path, default=k8s_dra_default(),
                        help="the k8s-dra folder (default: $K8S_DRA_DIR, else %(default)s)")


def open_plane(parser: argparse.ArgumentParser, prefix: str) -> tuple[argparse.Namespace, Cluster, Path] | None:
    """The script's arguments (``--k8s-dra`` added), the plane's ``Cluster`` (its state in ``$DRA_STATE``,
    else in the work folder) and a fresh work folder in /tmp (unix socket paths stay short there); None,
    said on stderr, when there is no plane at ``--k8s-dra``: the script then exits 2."""
    add_k8s_dra_argument(parser)
    args = parser.parse_args()
    if not (args.k8s_dra / "up.sh").exists():
        print(f"{Path(sys.argv[0]).stem}: no k8s-dra folder at {args.k8s_dra} (give --k8s-dra DIR or set "
              "K8S_DRA_DIR)", file=sys.stderr)
        return None
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    return args, Cluster(args.k8s_dra, Path(os.environ.get("DRA_STATE") or work / "state")), work


def verdict(work: Path) -> int:
    """Print how many checks passed and where the logs are; the exit code: 1 when one failed."""
    failed = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed)} checks passed, {len(failed)} failed; logs in {work}")
    return 1 if failed else 0


def check(ok: bool, what: str) -> bool:
    results.append((ok, what))
    print(f"  {'PASS' if ok else 'FAIL'}  {what}", flush=True)
    return ok


def figure(text: str) -> None:
    figures.append(text)
    print(f"  figure: {text}", flush=True)


def wait(predicate: Callable[[], Any], timeout: float = 60, step: float = 0.05) -> float | None:
    """Seconds until ``predicate()`` held, or None after ``timeout``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if predicate():
                return time.monotonic() - began
        except (subprocess.CalledProcessError, ValueError, KeyError):
            pass
        time.sleep(step)
    return None


def chart_device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses the chart ships, as its rendered manifest holds them."""
    documents = yaml.safe_load_all(CHART_MANIFEST.read_text())
    return [d for d in documents if isinstance(d, dict) and d.get("kind") == "DeviceClass"]


class KubectlFailed(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}: {str(self.stderr).strip()[:2000]}"


class JsonLines(PluginJsonLines):
    """drakubelet's events (e2e_plugin's reader), looked up by name: None rather than an error when absent."""

    def find(self, name: str, since: int = 0, **fields: Any) -> Event | None:
        return next((e for e in self.since(since) if named(name, **fields)(e)), None)

    def wait(self, name: str, since: int = 0, timeout: float = 60, **fields: Any) -> Event | None:  # type: ignore[override]
        try:
            return super().wait(named(name, **fields), since, timeout)
        except TimeoutError:
            return None


class Cluster:
    def __init__(self, k8s_dra: Path, state: Path) -> None:
        self.k8s_dra, self.state = k8s_dra, state
        self.env = {**os.environ, "DRA_STATE": str(state)}
        self.kubectl_bin = str(k8s_dra.parent / "k8s" / "bin" / "kubectl")
        self._context: ssl.SSLContext | None = None  # the admin user's, made on first use (up.sh writes the pki)

    def up(self) -> None:
        """The plane started; a start that fails is said on stderr, and the plane is stopped, wiped and started
        once more (on a loaded machine ``up.sh`` once said the API server it had just started had exited,
        with that server's log still empty)."""
        first = subprocess.run([str(self.k8s_dra / "up.sh")], env=self.env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        if first.returncode:
            print(f"the DRA plane's up.sh failed (exit {first.returncode}): {first.stderr.strip()[-600:]!r}; "
                  "stopped, wiped and started once more", file=sys.stderr, flush=True)
            self.down()
            subprocess.run([str(self.k8s_dra / "up.sh")], env=self.env, check=True, stdout=subprocess.DEVNULL)
        values = dict(line.removeprefix("export ").split("=", 1)
                      for line in (self.state / "env").read_text().splitlines()
                      if "=" in line and not line.startswith("#"))
        self.kubeconfig = values.get("KUBECONFIG", str(self.state / "kubeconfig")).strip("'\"")
        self.bin = Path(values.get("DRA_BIN", "/tmp/gpu-labeller-dra-bin").strip("'\""))
        self.api_port = int(values.get("DRA_API_PORT", "7443").strip("'\""))
        # /readyz (what up.sh waits for) is not yet "kubectl serves resource.k8s.io" on a loaded box
        if wait(lambda: self.kubectl("get", "deviceclasses", "-o", "name") is not None, 60) is None:
            self.kubectl("get", "deviceclasses", "-o", "name")  # raises, saying what kubectl said

    def down(self) -> None:
        subprocess.run([str(self.k8s_dra / "down.sh"), "--wipe"], env=self.env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """kubectl's output; KubectlFailed (which says what kubectl said) when it fails and ``check``."""
        done = subprocess.run([self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args], input=stdin, text=True,
                              capture_output=True)
        if check and done.returncode:
            raise KubectlFailed(done.returncode, done.args, done.stdout, done.stderr)
        return done.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def raw(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """One request as the admin user, with what the server answered: its status code and body."""
        if self._context is None:
            pki = self.state / "pki"
            self._context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            self._context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"https://127.0.0.1:{self.api_port}{path}", data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self._context, timeout=30) as answer:
                return int(answer.status), json.loads(answer.read())
        except urllib.error.HTTPError as refused:
            return int(refused.code), json.loads(refused.read())

    def get(self, path: str) -> dict[str, Any]:
        """One GET as the admin user (no kubectl process: cheap enough to poll); an error when refused."""
        code, body = self.raw("GET", path)
        if code != 200:
            raise ValueError(f"GET {path}: {code} {body.get('message')}")
        return body

    def resource_slices(self) -> list[dict[str, Any]]:
        """Every ResourceSlice, each whole (a list's items lack their apiVersion and kind)."""
        return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **item}
                for item in self.get("/apis/resource.k8s.io/v1/resourceslices")["items"]]

    def slices(self, node: str) -> list[dict[str, Any]]:
        return [s for s in self.resource_slices() if s["spec"].get("nodeName") == node]

    def devices(self, node: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for s in self.slices(node):
            found.setdefault(s["spec"]["driver"], []).extend(d["name"] for d in s["spec"].get("devices", []))
        return found


class Node:
    """One drakubelet and one dra-plugin for ``name``, replaying the simulated ``profile`` and serving
    ``vendors`` through DRA. ``plugin_args`` and ``plugin_env`` go to the plugin besides its usual flags."""

    def __init__(self, cluster: Cluster, name: str, work: Path, profile: str, vendors: Sequence[str], *,
                 prepare_retry: str = "20s", plugin_args: Sequence[str] = (),
                 plugin_env: Mapping[str, str] | None = None) -> None:
        self.cluster, self.name, self.profile = cluster, name, profile
        self.prepare_retry, self.plugin_args, self.plugin_env = prepare_retry, list(plugin_args), dict(plugin_env or {})
        self.dir = work / name
        for sub in ("reg", "plugins", "cdi", "state"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "config.yaml"
        self.config.write_text(json.dumps({"version": "v1", "labeller": {"dra": {"vendors": list(vendors)}}}))
        self.kubelet: subprocess.Popen[str] | None = None
        self.plugin: subprocess.Popen[str] | None = None
        self.plugin_kubeconfig = cluster.kubeconfig  # the plugin's credentials (e2e_policy: its ServiceAccount's token)

    def start_kubelet(self) -> int:
        self.kubelet = subprocess.Popen(
            [str(self.cluster.bin / "drakubelet"), "--node-name", self.name, "--kubeconfig", self.cluster.kubeconfig,
             "--registry-dir", str(self.dir / "reg"), "--plugins-dir", str(self.dir / "plugins"),
             "--state-dir", str(self.dir / "state"), "--prepare-retry", self.prepare_retry],
            stdout=subprocess.PIPE, stderr=(self.dir / "drakubelet.err").open("a"), text=True)
        assert self.kubelet.stdout is not None
        self.events = JsonLines(self.kubelet.stdout, self.dir / "drakubelet.jsonl")
        return 0

    def start_plugin(self) -> float:
        self.plugin = subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "dra-plugin", "--simulate", self.profile,
             "--config", str(self.config), "--node-name", self.name, "--kubeconfig", self.plugin_kubeconfig,
             "--registry-dir", str(self.dir / "reg"), "--plugins-dir", str(self.dir / "plugins"),
             "--cdi-spec-dir", str(self.dir / "cdi"), "--metrics-port", "0", "--metrics-bind", "127.0.0.1",
             *self.plugin_args],
            cwd=ROOT, env={**os.environ, **self.plugin_env}, stdout=subprocess.DEVNULL,
            stderr=(self.dir / "plugin.log").open("a"), text=True)
        return time.monotonic()

    def stop(self, process: subprocess.Popen[str] | None, signum: int = signal.SIGTERM) -> None:
        if process is not None and process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def log(self) -> list[Event]:
        """The plugin's log lines (every run of it on this node)."""
        lines = (self.dir / "plugin.log").read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def ready(self) -> bool:
        """The plugin's /readyz (on the port its latest run logged) answers 200."""
        port = [e["port"] for e in self.log() if e.get("event") == "metrics server listening"][-1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
                return int(answer.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def metric(self, name: str) -> float:
        """The sum of a metric's samples on the plugin's /metrics (the port its latest run logged)."""
        port = [e["port"] for e in self.log() if e.get("event") == "metrics server listening"][-1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((name + "{", name + " ")))

    def spec_files(self) -> list[Path]:
        return sorted((self.dir / "cdi").glob("*.json"))

    def checkpoints(self) -> list[Path]:
        return sorted((self.dir / "plugins").glob("*/claims/*.json"))

    def cdi_names(self) -> set[str]:
        """Every fully qualified CDI device name the spec files define."""
        names = set()
        for path in self.spec_files():
            spec = json.loads(path.read_text())
            names.update(f"{spec['kind']}={d['name']}" for d in spec.get("devices", []))
        return names


def start_nodes(cluster: Cluster, nodes: Sequence[Node], timeout: float = 90) -> None:
    """Each node's drakubelet, then its plugin, all side by side; a check per node that it registered
    and published every driver it serves (a figure: plugin start to slices published, and how many devices)."""
    for node in nodes:
        node.start_kubelet()
    for node in nodes:
        check(node.events.wait("kubelet_started", 0, 60) is not None, f"{node.name}: drakubelet started")
    started = {node.name: node.start_plugin() for node in nodes}
    drivers = {node.name: len(json.loads(node.config.read_text())["labeller"]["dra"]["vendors"]) for node in nodes}
    published: dict[str, float] = {}

    def all_published() -> bool:
        found: dict[str, set[str]] = {}
        for item in cluster.resource_slices():
            found.setdefault(item["spec"].get("nodeName", ""), set()).add(item["spec"]["driver"])
        for name, want in drivers.items():
            if name not in published and len(found.get(name, ())) == want:
                published[name] = time.monotonic()
        return len(published) == len(nodes)

    wait(all_published, timeout, step=0.2)
    for node in nodes:
        registered = node.events.wait("plugin_registered", 0, 30)
        check(registered is not None and node.name in published, f"{node.name}: registered and published")
        if node.name in published:
            figure(f"{node.name} ({node.profile}): plugin start -> slices published in "
                   f"{published[node.name] - started[node.name]:.2f} s, "
                   f"{sum(map(len, cluster.devices(node.name).values()))} devices")


def stop_nodes(nodes: Sequence[Node]) -> None:
    for node in nodes:
        node.stop(node.plugin)
    for node in nodes:
        node.stop(node.kubelet)
