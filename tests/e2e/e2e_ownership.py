"""End to end on a real kube-apiserver v1.24 (with etcd): whose labels gpu-labeller changes, and how
fast it recovers after faults. Prints every check and figure; exits 1 if a check failed. Not a test
(pytest does not collect e2e_*.py): run it by hand.

    python tests/e2e/e2e_ownership.py [--k8s DIR] [--state /tmp/k8s-a] [--keep]

It starts etcd and the API server with the k8s folder's up.sh (K8S_STATE, default ports
6443/2379/2380), creates a Node, sets other managers' labels with kubectl, runs the real
`gpu-labeller run --once` and `gpu-labeller run` as user `labeller` (its ClusterRoles are bound and
unbound with the admin kubeconfig), stops and starts etcd through its pid file, and runs
`gpu-labeller cleanup`. Then it stops the cluster with `down.sh --wipe` (unless --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.cluster.kube import Kube, KubeError  # noqa: E402

NODE = "e2e-node-1"
CANARY = "e2e-canary"  # a second Node the script writes to, to tell when the API server accepts writes
PROFILE = "dgx-h100"
KEY = "nvidia.com/gpu.product"  # a label gpu-labeller computes for dgx-h100
OURS = "NVIDIA-H100-80GB-HBM3"
# Other computed keys, one per scenario: a fight is per key, so the scenarios do not mix.
DRIFT_KEYS = ("nvidia.com/gpu.machine", "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor",
              "nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor")
OUTAGE_KEY, REVOKED_KEY, REVERTED_KEY = "nvidia.com/gpu.count", "nvidia.com/gpu.memory", "nvidia.com/gpu.family"
ADMIN = {"nvidia.com/vgpu.config": "A100-4C", "nvidia.com/vgpu.config.state": "success",
         "nvidia.com/gpu.imex-domain": "x", "nvidia.com/gpu.deploy.driver": "true"}
READ, PATCH = ("get", "list", "watch"), ("patch",)

results: list[tuple[bool, str]] = []
figures: list[str] = []


def add_k8s_argument(parser: argparse.ArgumentParser) -> None:
    """``--k8s DIR``: the folder with the real Kubernetes components and their up/down scripts."""
    parser.add_argument("--k8s", type=Path, default=Path(os.environ.get("K8S_DIR", ROOT.parent / "shared" / "k8s")),
                        help="the real Kubernetes components (default: $K8S_DIR, else shared/k8s beside the checkout)")


def check(ok: bool, what: str) -> bool:
    results.append((ok, what))
    print(f"  [{'PASS' if ok else 'FAIL'}] {what}", flush=True)
    return ok


def verdict() -> int:
    """Print how many checks passed; the exit code: 1 when one failed."""
    failed = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed)} checks passed, {len(failed)} failed")
    return 1 if failed else 0


def figure(text: str) -> None:
    figures.append(text)
    print(f"  figure: {text}", flush=True)


def wait(predicate: Callable[[], Any], timeout: float, step: float = 0.01) -> float | None:
    """Seconds until ``predicate`` held, or None after ``timeout``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if predicate():
                return time.monotonic() - began
        except KubeError:
            pass
        time.sleep(step)
    return None


class Cluster:
    """The real control plane: kubectl as admin, RBAC for user labeller, etcd stop/start."""

    def __init__(self, k8s: Path, state: Path) -> None:
        self.k8s, self.state = k8s, state
        self.env = {**os.environ, "K8S_STATE": str(state), "PATH": f"{k8s / 'bin'}:{os.environ['PATH']}",
                    "KUBECONFIG": str(state / "kubeconfig")}
        self.admin_kubeconfig, self.labeller_kubeconfig = state / "kubeconfig", state / "kubeconfig-labeller"

    def script(self, name: str, *args: str) -> str:
        done = subprocess.run([str(self.k8s / name), *args], env=self.env, capture_output=True, text=True, check=True)
        return done.stdout

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, check=check)

    def admin(self) -> Kube:
        return Kube(str(self.admin_kubeconfig))

    def labels(self) -> dict[str, str]:
        if not hasattr(self, "_kube"):
            self._kube = self.admin()
        return dict(self._kube.get_node(NODE)["metadata"].get("labels") or {})

    def grant(self, name: str, verbs: tuple[str, ...]) -> None:
        self.kubectl("create", "clusterrole", name, f"--verb={','.join(verbs)}", "--resource=nodes")
        self.kubectl("create", "clusterrolebinding", name, f"--clusterrole={name}", "--user=labeller")

    def revoke(self, name: str) -> None:
        self.kubectl("delete", "clusterrolebinding", name, "clusterrole", name, check=False)
        self.kubectl("delete", "clusterrole", name, check=False)

    def stop_etcd(self) -> None:
        pid = int((self.state / "etcd.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        while Path(f"/proc/{pid}").exists():
            time.sleep(0.05)

    def first_write_after(self, results: list[float]) -> None:
        """Append the monotonic time a write (a label on the canary Node) first succeeds."""
        kube = Kube(str(self.admin_kubeconfig), request_timeout=(1.0, 1.0))
        for tick in range(100000):
            try:
                kube._request("patch", "nodes", "PATCH", f"/api/v1/nodes/{CANARY}", None,
                              {"metadata": {"labels": {"e2e-tick": str(tick)}}}, "application/merge-patch+json")
                results.append(time.monotonic())
                return
            except KubeError:
                time.sleep(0.02)

    def start_etcd(self) -> float:
        """Start etcd again (up.sh restarts what is not running); the monotonic time it answered."""
        threading.Thread(target=self.script, args=("up.sh",), daemon=True).start()
        port = dict(line.removeprefix("export ").split("=", 1)  # up.sh writes ``export NAME=value`` lines
                    for line in (self.state / "env").read_text().splitlines() if "=" in line)["K8S_ETCD_PORT"]
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as answer:
                    if answer.status == 200:
                        return time.monotonic()
            except (OSError, urllib.error.URLError):
                time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "labeller.cli", "--log-format", "json", *args]


def run_args(kubeconfig: Path, *extra: str) -> list[str]:
    return cli("run", "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--start-jitter", "0", *extra)


class Daemon:
    """A real `gpu-labeller run` process; its JSON log lines and metrics."""

    def __init__(self, kubeconfig: Path, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.process = subprocess.Popen(run_args(kubeconfig, "--simulate", PROFILE, "--metrics-port", str(self.port)),
                                        cwd=ROOT, stderr=log_path.open("w"), stdout=subprocess.DEVNULL)

    def logs(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.startswith("{")]

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
        total = 0.0
        for match in re.finditer(rf"^{name}(?:{{(?P<labels>[^}}]*)}})? (?P<value>\S+)$", text, re.MULTILINE):
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels") or ""))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(match.group("value"))
        return total

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=10)


@contextmanager
def cluster_up(k8s: Path, state: Path, keep: bool) -> Iterator[Cluster]:
    cluster = Cluster(k8s, state)
    began = time.monotonic()
    cluster.script("up.sh")
    print(f"real kube-apiserver v1.24 up in {time.monotonic() - began:.1f} s (K8S_STATE={state})", flush=True)
    try:
        yield cluster
    finally:
        if not keep:
            print(cluster.script("down.sh", "--wipe").strip(), flush=True)


def managed_fields_of(cluster: Cluster) -> dict[str, list[str]]:
    node = cluster.admin().get_node(NODE)
    labelled = [entry for entry in node["metadata"]["managedFields"]
                if "f:labels" in entry.get("fieldsV1", {}).get("f:metadata", {})]
    return {f"{entry['manager']}/{entry['operation']}":
            sorted(k[2:] for k in entry["fieldsV1"]["f:metadata"]["f:labels"] if k.startswith("f:"))
            for entry in labelled}


def step_once(cluster: Cluster) -> None:
    print("\n1. foreign labels, then `gpu-labeller run --once --simulate dgx-h100` as user labeller", flush=True)
    cluster.kubectl("label", "node", NODE, *[f"{k}={v}" for k, v in ADMIN.items()], f"{KEY}=old-gfd-value")
    once = subprocess.run(run_args(cluster.labeller_kubeconfig, "--once", "--simulate", PROFILE, "--metrics-port", "0"),
                          cwd=ROOT, capture_output=True, text=True, check=False)
    check(once.returncode == 0, f"run --once exits 0 (got {once.returncode})")
    labels = cluster.labels()
    check(all(labels.get(k) == v for k, v in ADMIN.items()), "admin's vgpu.config, vgpu.config.state, gpu.imex-domain, "
          "gpu.deploy.driver survive run --once")
    check(labels.get(KEY) == OURS, f"{KEY} set by kubectl is taken over ({labels.get(KEY)})")
    fields = managed_fields_of(cluster)
    ours = fields.get("gpu-labeller/Apply", [])
    figure(f"managedFields after our apply: gpu-labeller/Apply owns {len(ours)} labels; "
           f"kubectl-label/Update owns {fields.get('kubectl-label/Update')}")
    check(KEY in ours and KEY not in fields.get("kubectl-label/Update", []),
          f"{KEY} is ours alone after the forced apply")
    check(not set(ADMIN) & set(ours), "no admin label in gpu-labeller's managedFields")
    adopted = [entry for entry in (json.loads(line) for line in once.stderr.splitlines() if line.startswith("{"))
               if entry.get("reason") == "adopted"]
    check(len(adopted) == 1 and adopted[0].get("previous_managers") == "kubectl-label",
          f"one adoption line naming kubectl-label: {[a.get('label') for a in adopted]}")


def time_to_repair(cluster: Cluster, key: str, value: str, timeout: float = 60.0, step: float = 0.01) -> float | None:
    return wait(lambda: cluster.labels().get(key) == value, timeout, step)


def step_daemon(cluster: Cluster, tmp: Path) -> None:
    print("\n2. the daemon: drift, an etcd outage, patch revoked, a kubectl loop, an instant reverter", flush=True)
    expected = cluster.labels()
    daemon = Daemon(cluster.labeller_kubeconfig, tmp / "daemon.log")
    try:
        check(wait(daemon.ready, 20) is not None, "daemon ready")
        repairs = []
        for key in DRIFT_KEYS:
            cluster.kubectl("label", "node", NODE, f"{key}-")
            repairs.append(time_to_repair(cluster, key, expected[key], 10) or float("nan"))
        figure("drift repair after `kubectl label <key>-`: " + ", ".join(f"{r * 1000:.0f} ms" for r in repairs)
               + " (from kubectl returning to our label seen by a GET polled every 10 ms)")

        # etcd outage: the label goes while the daemon is paused, etcd stops, the daemon resumes and fails to write
        daemon.pause()
        cluster.kubectl("label", "node", NODE, f"{OUTAGE_KEY}-")
        cluster.stop_etcd()
        daemon.resume()
        time.sleep(15)
        errors = daemon.metric("gpu_labeller_writes_total", outcome="error")
        etcd_at = cluster.start_etcd()
        writable: list[float] = []
        threading.Thread(target=cluster.first_write_after, args=(writable,), daemon=True).start()
        seconds = time_to_repair(cluster, OUTAGE_KEY, expected[OUTAGE_KEY], step=0.02)
        back_at = time.monotonic()
        wait(lambda: writable, 60)
        if seconds is None or not writable:
            figure("label deleted during an etcd outage: NOT back within 60 s")
        else:
            figure(f"label deleted during a 15 s etcd outage: back {back_at - etcd_at:.2f} s after etcd answered "
                   f"again, {back_at - writable[0]:+.2f} s after the API server first accepted another write "
                   f"({writable[0] - etcd_at:.2f} s after etcd); {errors:.0f} failed writes during the outage")
        check(seconds is not None and bool(writable) and back_at - writable[0] < 1.0,
              "label back within 1 s of the API server accepting writes again")

        # patch revoked
        cluster.revoke("e2e-labeller-patch")
        time.sleep(1.0)  # RBAC reaches the authorizer's cache
        cluster.kubectl("label", "node", NODE, f"{REVOKED_KEY}-")
        time.sleep(10)
        cluster.grant("e2e-labeller-patch", PATCH)
        granted = time.monotonic()
        seconds = time_to_repair(cluster, REVOKED_KEY, expected[REVOKED_KEY])
        took = time.monotonic() - granted if seconds is not None else None
        figure(f"label deleted while `patch` was revoked (10 s): back {took:.2f} s after the ClusterRoleBinding "
               "was created again" if took is not None else "patch revoked: label NOT back within 60 s")
        check(took is not None and took < 2.0, "label back within 2 s of patch being granted again")
        logs = daemon.logs()
        fights = [e for e in logs if e.get("reason") == "label-fight"]
        check(not fights, f"no label-fight line after drift, the etcd outage and the revoked patch: {fights}")
        forbidden = [e["event"] for e in logs if e.get("reason") == "forbidden"]
        check(forbidden == ["permission missing: grant verb 'patch' on resource 'nodes' to user labeller"],
              f"one permission line for patch: {forbidden}")

        # a person's kubectl loop, 10 s
        writes_before = daemon.metric("gpu_labeller_writes_total", outcome="success")
        began, loops, last_done = time.monotonic(), 0, 0.0
        while time.monotonic() - began < 10.0:
            cluster.kubectl("label", "--overwrite", "node", NODE, f"{KEY}=Other")
            last_done, loops = time.monotonic(), loops + 1
        seconds = time_to_repair(cluster, KEY, OURS, 600, step=0.005)
        back = time.monotonic() - last_done if seconds is not None else None
        ours_during = daemon.metric("gpu_labeller_writes_total", outcome="success") - writes_before
        figure(f"10 s `kubectl label --overwrite` loop ({loops} runs): our value back {back:.3f} s after the last "
               f"kubectl returned; {ours_during:.0f} writes by gpu-labeller meanwhile; "
               f"fights reported {daemon.metric('gpu_labeller_label_fights_total'):.0f}")
        check(back is not None and back < 1.0, "our value back within 1 s of the loop's last write")

        # a controller that undoes each of our writes at once, for 30 s
        counts = instant_reverter(cluster, daemon, REVERTED_KEY, seconds=30.0)
        stopped = time.monotonic()
        seconds = time_to_repair(cluster, REVERTED_KEY, expected[REVERTED_KEY], 600)
        figure(f"instant reverter for 30 s: gpu-labeller's writes per 10 s: {counts}; our value back "
               f"{time.monotonic() - stopped:.2f} s after the reverter stopped")
        check(counts[0] > counts[-1] and sum(counts) < 100,
              "write rate bounded and falling against an instant reverter")
    finally:
        daemon.stop()


def instant_reverter(cluster: Cluster, daemon: Daemon, key: str, seconds: float) -> list[int]:
    """Watch the Node and put ``key`` back to 'Reverted' after every change; count our writes per 10 s."""
    kube = cluster.admin()
    stop = threading.Event()

    def put_back(node: dict[str, Any] | None) -> None:
        if node is not None and (node["metadata"].get("labels") or {}).get(key) != "Reverted":
            kube._request("patch", "nodes", "PATCH", f"/api/v1/nodes/{NODE}", {"fieldManager": "reverter"},
                          {"metadata": {"labels": {key: "Reverted"}}}, "application/merge-patch+json")

    def revert() -> None:
        while not stop.is_set():
            node, rv = kube.list_node(NODE)
            put_back(node)
            for _, node in kube.watch_node(NODE, rv, 1):
                put_back(node)
                if stop.is_set():
                    break

    thread = threading.Thread(target=revert, daemon=True)
    counts, before = [], daemon.metric("gpu_labeller_writes_total", outcome="success")
    thread.start()
    for _ in range(int(seconds // 10)):
        time.sleep(10)
        now = daemon.metric("gpu_labeller_writes_total", outcome="success")
        counts.append(int(now - before))
        before = now
    stop.set()
    thread.join(timeout=5)
    return counts


def step_forbidden_list_watch(cluster: Cluster, tmp: Path) -> None:
    print("\n3. 403 on list, then on watch: one line each", flush=True)
    cluster.revoke("e2e-labeller-read")
    cluster.grant("e2e-labeller-get", ("get",))
    time.sleep(1.0)
    for missing, extra in (("list", ()), ("watch", ("list",))):
        if extra:
            cluster.grant("e2e-labeller-list", extra)
            time.sleep(1.0)
        daemon = Daemon(cluster.labeller_kubeconfig, tmp / f"daemon-{missing}.log")
        time.sleep(12)
        daemon.stop()
        lines = [e["event"] for e in daemon.logs() if e.get("reason") == "forbidden"]
        warnings = [e["event"] for e in daemon.logs() if e.get("level") == "warning" and "watch" in e.get("event", "")]
        print(f"  {missing} refused for 12 s: {lines}; watch warnings: {len(warnings)}", flush=True)
        check(lines == [f"permission missing: grant verb '{missing}' on resource 'nodes' to user labeller"],
              f"one line for the missing '{missing}'")
    cluster.revoke("e2e-labeller-get")
    cluster.revoke("e2e-labeller-list")
    cluster.grant("e2e-labeller-read", READ)


def untrusted_probe_keeps_labels(cluster: Cluster) -> None:
    before = cluster.labels()
    bad = subprocess.run(run_args(cluster.labeller_kubeconfig, "--once", "--host-root", "/nonexistent",
                                  "--metrics-port", "0"),
                         cwd=ROOT, capture_output=True, text=True, check=False)
    kept = cluster.labels() == before
    failed = [json.loads(line) for line in bad.stderr.splitlines() if '"probe-failed"' in line]
    check(bad.returncode == 1 and kept and len(failed) == 1, f"run --once --host-root /nonexistent exits 1 "
          f"({bad.returncode}), keeps every label ({'kept' if kept else 'REMOVED'}), one probe-failed line")


def step_probes(cluster: Cluster, tmp: Path) -> None:
    print("\n4. probes: a host root with no PCI devices directory, then a genuine node without GPUs", flush=True)
    untrusted_probe_keeps_labels(cluster)
    empty = tmp / "no-gpu.yaml"
    empty.write_text("name: no-gpu\nmachine: PowerEdge R650\n")
    before = cluster.labels()
    done = subprocess.run(run_args(cluster.labeller_kubeconfig, "--once", "--simulate", str(empty),
                                   "--metrics-port", "0"),
                          cwd=ROOT, capture_output=True, text=True, check=False)
    after = cluster.labels()
    gone = sorted(set(before) - set(after))
    check(done.returncode == 0 and KEY in gone and all(after.get(k) == v for k, v in ADMIN.items()),
          f"a readable node without GPUs removes our {len(gone)} labels and keeps the admin's")
    subprocess.run(run_args(cluster.labeller_kubeconfig, "--once", "--simulate", PROFILE, "--metrics-port", "0"),
                   cwd=ROOT, capture_output=True, check=False)


def step_cleanup(cluster: Cluster) -> None:
    print("\n5. cleanup (admin), then cleanup --include-foreign", flush=True)
    cleanup = ["cleanup", "--node", NODE, "--kubeconfig", str(cluster.admin_kubeconfig)]
    done = subprocess.run(cli(*cleanup), cwd=ROOT, capture_output=True, text=True, check=False)
    print("  " + "\n  ".join(line for line in done.stdout.splitlines() if "removed nvidia" not in line), flush=True)
    labels = cluster.labels()
    check(done.returncode == 0 and all(labels.get(k) == v for k, v in ADMIN.items()), "admin labels survive cleanup")
    check(KEY not in labels and f"{NODE}: left nvidia.com/gpu.imex-domain (set by kubectl-label; --include-foreign "
          "removes it)" in done.stdout, "cleanup removed ours and names what it left")
    dry = subprocess.run(cli(*cleanup, "--include-foreign", "--dry-run"), cwd=ROOT, capture_output=True,
                         text=True, check=False)
    print("  " + "\n  ".join(dry.stdout.splitlines()), flush=True)
    check(cluster.labels() == labels, "--dry-run changes nothing")
    foreign = subprocess.run(cli(*cleanup, "--include-foreign"), cwd=ROOT, capture_output=True, text=True, check=False)
    print("  " + "\n  ".join(foreign.stdout.splitlines()), flush=True)
    labels = cluster.labels()
    check("nvidia.com/gpu.imex-domain" not in labels and all(labels.get(k) == ADMIN[k] for k in ADMIN
                                                              if k != "nvidia.com/gpu.imex-domain"),
          "--include-foreign removed gpu.imex-domain; vgpu.config, vgpu.config.state, gpu.deploy.driver stay")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_k8s_argument(parser)
    parser.add_argument("--state", type=Path, default=Path(os.environ.get("K8S_STATE", "/tmp/gpu-labeller-k8s")))
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    options = parser.parse_args()
    tmp = options.state / "e2e"
    with cluster_up(options.k8s, options.state, options.keep) as cluster:
        tmp.mkdir(parents=True, exist_ok=True)
        for name in ("e2e-labeller-read", "e2e-labeller-patch", "e2e-labeller-get", "e2e-labeller-list"):
            cluster.revoke(name)
        for name in (NODE, CANARY):
            cluster.kubectl("delete", "node", name, "--ignore-not-found")
            subprocess.run(["kubectl", "create", "-f", "-"], env=cluster.env, capture_output=True, check=True,
                           text=True,
                           input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
                               "name": name, "labels": {"kubernetes.io/hostname": name}}}))
        cluster.grant("e2e-labeller-read", READ)
        cluster.grant("e2e-labeller-patch", PATCH)
        time.sleep(1.0)
        step_once(cluster)
        step_daemon(cluster, tmp)
        step_forbidden_list_watch(cluster, tmp)
        step_probes(cluster, tmp)
        step_cleanup(cluster)
    failed = [what for ok, what in results if not ok]
    print(f"\n{len(results) - len(failed)} of {len(results)} checks passed")
    for text in figures:
        print(f"- {text}")
    for what in failed:
        print(f"FAILED: {what}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
