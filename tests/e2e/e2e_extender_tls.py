"""End to end: the real kube-scheduler v1.24 drives ``gpu-labeller scheduler-extender`` over mutual TLS,
configured exactly by the chart (its Secrets and its KubeSchedulerConfiguration), on a real
kube-apiserver. Prints every check and figure; exits 1 if a check failed. Not a test (pytest does not
collect e2e_*.py): run it by hand.

    K8S_STATE=/tmp/k8s-x K8S_API_PORT=... K8S_ETCD_PORT=... K8S_ETCD_PEER_PORT=... K8S_SCHED_PORT=... \\
        python tests/e2e/e2e_extender_tls.py [--k8s DIR] [--port 39997] [--keep]

1. up.sh, the chart's RBAC for the extender, two Nodes sharing GPU memory (4 GPUs x 16 each), and a
   device-plugin stand-in that marks each bound pod allocated (no container runs here).
2. The chart rendered with extender.enabled: the extender runs with its serving Secret (--tls-*), the
   scheduler with the ConfigMap's KubeSchedulerConfiguration and the client Secret.
3. Pods asking aliyun.com/gpu-mem are bound by the real scheduler through the extender.
4. Clients without the scheduler's certificate are refused on every path: no certificate, another CA's,
   plain HTTP.
5. A quiet burst of pods, then issue 28's attacker: 1,100 idle TCP connections (no TLS hello at all;
   more than --max-connections), each opened again as soon as the server closes it. 20 filter calls on
   fresh mutual-TLS connections are all answered within the scheduler's httpTimeout, the scheduler keeps
   placing pods, and the extender's threads and RSS stay bounded (sampled every 0.2 s). Before, 5 to 8
   of 20 such calls failed, at about 1,000 threads.
6. While 1,000 slow clients stay connected (one byte of a TLS hello per 10 s each, reconnecting as soon
   as the server closes it) and a client sends a 100 MB body, another burst: the scheduler keeps placing
   pods and every filter and bind is answered within httpTimeout (a probe on a fresh mutual-TLS
   connection twice a second, the extender's duration histogram, the scheduler's log); the body is
   refused (413) unread, the slow clients are closed at the TLS handshake deadline
   (--tls-handshake-timeout), the extender's CPU and memory stay low.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import selectors
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.model import gpushare  # noqa: E402
from labeller.cluster.kube import Kube  # noqa: E402
from tests.deploy import render  # noqa: E402
from tests.e2e.e2e_config_switch import NAMESPACE, Cluster, ms  # noqa: E402
from tests.e2e.e2e_ownership import add_k8s_argument, check, figure, verdict, wait  # noqa: E402
from tests.e2e.e2e_sharing import stop  # noqa: E402
from tests.extender.certs import make_certs  # noqa: E402

NODES = ("e2e-tls-a", "e2e-tls-b")
GPUS, UNITS = 4, 16
NAME = "gpu-labeller-scheduler-extender"
REQUEST_TIMEOUT_S = 5
HANDSHAKE_TIMEOUT_S = 3  # the extender's default --tls-handshake-timeout, given explicitly
SLOW_INTERVAL_S = 10.0  # the attacker: one byte per 10 s
ATTACK_S = 20.0  # the least time the attack lasts


def pod_body(name: str, units: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {gpushare.RESOURCE_MEM: str(units)}}}]}}


def make_node(cluster: Cluster, name: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {"kubernetes.io/hostname": name}}}))
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110", gpushare.RESOURCE_MEM: str(GPUS * UNITS),
                 gpushare.RESOURCE_COUNT: str(GPUS)}
    cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
        "capacity": resources, "allocatable": resources, "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e",
            "lastHeartbeatTime": now, "lastTransitionTime": now}]}}))
    cluster.kubectl("taint", "node", name, "node.kubernetes.io/not-ready:NoSchedule-", check=False)


def allocate_bound_pods(admin: Kube, stop_event: threading.Event) -> None:
    """What the device plugin's Allocate does for the extender: mark each bound, assumed pod assigned."""
    while not stop_event.wait(0.05):
        for pod in admin.list_pods(field_selector="metadata.namespace=default")[0]:
            if pod["spec"].get("nodeName") and gpushare.is_assumed(pod):
                admin.patch_pod_annotations("default", pod["metadata"]["name"], {
                    gpushare.ANN_ASSIGNED: "true", gpushare.ANN_ASSIGN_TIME: str(time.time_ns())})


def secret_files(objects: list[dict[str, Any]], name: str, directory: Path) -> Path:
    secret = next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == name)
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in secret["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
    (directory / "tls.key").chmod(0o600)
    return directory


def refused(url: str, context: ssl.SSLContext | None) -> bool:
    body = json.dumps({"Pod": pod_body("x", 1), "NodeNames": list(NODES)}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10, context=context):
            return False
    except urllib.error.HTTPError:
        return False  # an answer, even an error, is not a refusal
    except (ssl.SSLError, ConnectionError, urllib.error.URLError, TimeoutError):
        return True


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    return proc_status(pid, "VmRSS") / 1024


def proc_status(pid: int, field: str) -> int:
    """A number from /proc/<pid>/status (VmRSS in KiB, Threads)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


class Sampler:
    """The extender's RSS (MiB) and thread count, sampled every ``step_s`` on a thread of its own."""

    def __init__(self, pid: int, step_s: float = 0.2) -> None:
        self.pid, self.step_s = pid, step_s
        self.rss: list[float] = []
        self.threads: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.step_s):
            self.rss.append(rss_mib(self.pid))
            self.threads.append(proc_status(self.pid, "Threads"))


class SlowClients:
    """An attacker: ``count`` connections, each sending one byte of a TLS ClientHello every
    ``interval_s`` and never a whole one (``interval_s`` None: nothing at all, idle TCP connections);
    a connection the server closes is opened again at once, so ``count`` stay connected for as long as
    the attack lasts (as far as the server lets them). One thread, one selector."""

    HELLO = b"\x16\x03\x01\x02\x00\x01"

    def __init__(self, port: int, count: int, interval_s: float | None) -> None:
        self.port, self.count, self.interval_s = port, count, interval_s
        self.lifetimes: list[float] = []  # seconds from connect to the server's close, per closed connection
        self.opened = self.refused = 0
        self.connected = 0  # connections open now
        self.connected_samples: list[int] = []
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _open(self) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            if self.interval_s is not None:
                sock.sendall(self.HELLO[:1])
        except OSError:
            self.refused += 1
            return
        sock.setblocking(False)
        now = time.monotonic()
        self.opened += 1
        next_send = now + self.interval_s if self.interval_s is not None else float("inf")
        self._selector.register(sock, selectors.EVENT_READ, [now, next_send, 1])  # opened, next send, sent

    def _closed(self, sock: socket.socket, opened: float) -> None:
        self.lifetimes.append(time.monotonic() - opened)
        self._selector.unregister(sock)
        sock.close()

    def _run(self) -> None:
        for _ in range(self.count):
            self._open()
        last_sample = 0.0
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(64)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""  # reset: also closed by the server
                if not data:
                    self._closed(sock, key.data[0])
            now = time.monotonic()
            for key in list(self._selector.get_map().values()):
                state = key.data
                if state[1] <= now and self.interval_s is not None:
                    try:
                        key.fileobj.send(self.HELLO[state[2] % len(self.HELLO):][:1])  # type: ignore[union-attr]
                        state[1], state[2] = now + self.interval_s, state[2] + 1
                    except OSError:
                        self._closed(key.fileobj, state[0])  # type: ignore[arg-type]
            for _ in range(self.count - len(self._selector.get_map())):
                self._open()
            self.connected = len(self._selector.get_map())
            if now - last_sample >= 1.0:
                self.connected_samples.append(self.connected)
                last_sample = now
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()


def timed_filter(url: str, context: ssl.SSLContext, server_name: str, body: bytes) -> float:
    """Seconds for one filter call as the scheduler makes it after an idle spell: a new connection, the
    mutual TLS handshake, the request and its whole answer; raises on anything but a 200."""
    started = time.monotonic()
    host, port = url.split("://", 1)[1].split("/", 1)[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw, \
            context.wrap_socket(raw, server_hostname=server_name) as sock:
        sock.sendall(b"POST /gpushare-scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    if not answer.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(answer.split(b"\r\n", 1)[0].decode(errors="replace"))
    return time.monotonic() - started


def idle_attack(port: int, count: int, calls: int, pid: int, probe: tuple[str, ssl.SSLContext, str, bytes],
                http_timeout_s: float, between: Callable[[], object]) -> None:
    """``count`` idle TCP connections held open (opened again when closed) while ``calls`` filters are
    made one after the other on fresh mutual-TLS connections: each must be answered within httpTimeout;
    the extender's threads and RSS are sampled throughout; ``between`` is called after each call."""
    attack = SlowClients(port, count, None)
    threads_before = proc_status(pid, "Threads")
    cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
    with Sampler(pid) as sampler:
        attack.start()
        took = wait(lambda: attack.opened >= count, 120)
        check(took is not None, f"{count} idle TCP connections (no TLS hello) opened in {took or 0:.1f} s; each "
                                "closed by the server is opened again at once")
        answered: list[float] = []
        errors: list[str] = []
        for _ in range(calls):
            try:
                answered.append(timed_filter(*probe))
            except (OSError, RuntimeError) as exc:
                errors.append(str(exc) or type(exc).__name__)
            between()
            time.sleep(0.25)  # pacing the calls, not waiting for a condition
    cpu, wall = cpu_seconds(pid) - cpu_before, time.monotonic() - wall_before
    attack.stop()
    within = [seconds for seconds in answered if seconds < http_timeout_s]
    check(len(within) == calls, f"{len(within)} of {calls} filter calls on fresh mutual-TLS connections answered "
                                f"within httpTimeout ({http_timeout_s:g} s): {ms(answered) if answered else 'none'}; "
                                f"{len(errors)} failed {errors[:3]}")
    connected = sorted(attack.connected_samples)
    lifetimes = ms(attack.lifetimes) if attack.lifetimes else "-"
    figure(f"idle attack: {attack.opened} connections opened in {wall:.1f} s ({attack.refused} refused at connect), "
           f"{len(attack.lifetimes)} closed by the server (lifetime {lifetimes}), median "
           f"{connected[len(connected) // 2] if connected else 0} open on the attacker's side; extender CPU "
           f"{cpu:.1f} s in {wall:.1f} s")
    # A thread per connection would be over a thousand: the workers serve the requests in flight only.
    check(max(sampler.threads, default=0) <= threads_before + 16,
          f"the extender's threads stay bounded: {threads_before} before, max {max(sampler.threads, default=0)}, "
          f"median {sorted(sampler.threads)[len(sampler.threads) // 2] if sampler.threads else 0} during the attack "
          "(sampled every 0.2 s)")
    check(max(sampler.rss, default=0) <= 256,
          f"the extender's RSS stays bounded (the chart's limit is 256Mi): max {max(sampler.rss, default=0):.0f} MiB, "
          f"after {rss_mib(pid):.0f} MiB")


def duration_buckets(metrics_url: str, verb: str) -> dict[str, float]:
    """The extender's request-duration histogram for ``verb``: upper bound -> cumulative count."""
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    buckets = {}
    for line in text.splitlines():
        if line.startswith("gpu_labeller_extender_request_duration_seconds_bucket{") and f'verb="{verb}"' in line:
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[bound] = float(line.rsplit(" ", 1)[1])
    return buckets


def big_body(port: int, context: ssl.SSLContext, server_name: str) -> tuple[str, float]:
    """An authenticated client declaring 100 MB and sending 5 MB of it: the status line and the seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as raw, \
            context.wrap_socket(raw, server_hostname=server_name) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /gpushare-scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000000\r\n\r\n")
        try:
            for _ in range(80):
                sock.sendall(b"[" * 65536)
        except OSError:
            pass  # the server stopped reading: it answered and closed
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
        return answer.split(b"\r\n", 1)[0].decode(errors="replace"), time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_k8s_argument(parser)
    parser.add_argument("--port", type=int, default=int(os.environ.get("K8S_SCHED_PORT", "10259")) + 2,
                        help="the extender's port (default: K8S_SCHED_PORT + 2)")
    parser.add_argument("--slow", type=int, default=1000, help="slow clients at once")
    parser.add_argument("--idle", type=int, default=1100, help="idle TCP connections at once (issue 28's attacker)")
    parser.add_argument("--idle-probes", type=int, default=20, help="filter calls on fresh connections during it")
    parser.add_argument("--max-connections", type=int, default=0,
                        help="the extender's --max-connections (default: the extender's own, 1024)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    max_connections = ["--max-connections", str(args.max_connections)] if args.max_connections else []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(args.slow, args.idle) + 512  # the attackers' sockets (one attack at a time), kubectl pipes, the rest
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))
    cluster = Cluster(args.k8s, Path(os.environ.get("K8S_STATE", "/tmp/gpu-labeller-k8s")))
    work = Path(tempfile.mkdtemp(prefix="e2e-extender-tls-"))
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    processes: list[subprocess.Popen[str]] = []
    allocating = threading.Event()
    try:
        cluster.up()
        objects = render({"extender": {
            "enabled": True,
            "schedulerConfig": {"host": "127.0.0.1", "apiVersion": "kubescheduler.config.k8s.io/v1beta3"},  # v1.24
            "port": args.port, "metricsPort": args.port + 1}})
        rbac = [o for o in objects if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                                    "RoleBinding")]
        cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
        for node in NODES:
            make_node(cluster, node)
        admin = Kube(str(cluster.admin))
        threading.Thread(target=allocate_bound_pods, args=(admin, allocating), daemon=True).start()

        # 2. The extender with the chart's serving Secret; the scheduler with its configuration and client Secret.
        serving = secret_files(objects, f"{NAME}-tls", work / "serving")
        client_dir = secret_files(objects, f"{NAME}-scheduler-client", work / "scheduler-client")
        config_map = next(o for o in objects
                          if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{NAME}-scheduler-config")
        config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
        tls_config = config["extenders"][0]["tlsConfig"]
        for key in ("caFile", "certFile", "keyFile"):  # the files, where the control plane would hold them
            tls_config[key] = str(client_dir / Path(tls_config[key]).name)
        del config["clientConnection"]  # scheduler-up.sh gives the scheduler its kubeconfig
        (work / "scheduler.yaml").write_text(yaml.safe_dump(config))
        print("  scheduler extender entry:", json.dumps(config["extenders"][0]))
        extender_kubeconfig = cluster.kubeconfig_for(NAME, work / "kubeconfig-extender")
        extender = subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "scheduler-extender", "--port",
             str(args.port), "--metrics-port", str(args.port + 1), "--bind", "127.0.0.1", "--kubeconfig",
             str(extender_kubeconfig), "--tls-cert-file", str(serving / "tls.crt"), "--tls-key-file",
             str(serving / "tls.key"), "--client-ca-file", str(serving / "ca.crt"), "--request-timeout",
             f"{REQUEST_TIMEOUT_S}s", "--tls-handshake-timeout", f"{HANDSHAKE_TIMEOUT_S}s", *max_connections],
            stderr=(work / "extender.log").open("w"), text=True, cwd=ROOT)
        processes.append(extender)

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{args.port + 1}/readyz", timeout=1) as answer:
                    return answer.status == 200
            except OSError:
                return False
        took = wait(ready, 60)
        check(took is not None, f"the extender serves mutual TLS with the chart's Secret, ready in {took or 0:.2f} s")
        subprocess.run([str(args.k8s / "scheduler-up.sh"), "--config", str(work / "scheduler.yaml")], env=cluster.env,
                       check=True, stdout=subprocess.DEVNULL)

        # 3. The real scheduler, over mutual TLS.
        created = {f"first-{i}": time.monotonic() for i in range(4)}
        for name in created:
            cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod_body(name, 8)))

        def bound(names: list[str]) -> list[str]:
            pods = {p["metadata"]["name"]: p for p in admin.list_pods(field_selector="metadata.namespace=default")[0]}
            return [n for n in names if n in pods and pods[n]["spec"].get("nodeName")
                    and gpushare.assigned_gpu(pods[n]) is not None]
        took = wait(lambda: len(bound(list(created))) == len(created), 120)
        check(took is not None, f"the real kube-scheduler binds {len(created)} gpu-mem pods through the extender over "
                                f"mutual TLS (annotated, bound) in {took or 0:.2f} s")

        # 4. Everyone else is refused.
        url = f"https://127.0.0.1:{args.port}"
        server_name = tls_config["serverName"]
        anonymous = ssl.create_default_context(cafile=str(client_dir / "ca.crt"))
        anonymous.check_hostname = False
        stranger_certs = make_certs(work / "stranger")
        stranger = ssl.create_default_context(cafile=str(client_dir / "ca.crt"))
        stranger.check_hostname = False
        stranger.load_cert_chain(str(stranger_certs.stranger_cert), str(stranger_certs.stranger_key))
        paths = ("/gpushare-scheduler/filter", "/gpushare-scheduler/bind", "/gpushare-scheduler/inspect", "/metrics")
        check(all(refused(url + path, anonymous) for path in paths), "a client without a certificate is refused on "
                                                                      f"{', '.join(paths)}")
        check(all(refused(url + path, stranger) for path in paths), "a client with another CA's certificate is refused")
        check(refused(f"http://127.0.0.1:{args.port}/gpushare-scheduler/inspect", None), "plain HTTP is refused")

        # A quiet burst first, to compare.
        def burst(prefix: str, count: int) -> tuple[dict[str, float], dict[str, float]]:
            names = [f"{prefix}-{i:02}" for i in range(count)]
            started = {}
            for name in names:
                cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod_body(name, 4)))
                started[name] = time.monotonic()
            return started, {}

        def all_bound(started: dict[str, float], times: dict[str, float]) -> bool:
            for name in bound(list(started)):
                times.setdefault(name, time.monotonic() - started[name])
            return len(times) == len(started)
        quiet_started, quiet = burst("quiet", 8)
        took = wait(lambda: all_bound(quiet_started, quiet), 120)
        check(took is not None, f"a quiet burst: {len(quiet)}/{len(quiet_started)} pods bound")
        if quiet:
            figure(f"created -> bound, quiet: {ms(list(quiet.values()))}")
        http_timeout_s = float(str(config["extenders"][0]["httpTimeout"]).rstrip("s"))
        scheduler_log = cluster.state / "scheduler.log"
        log_offset = scheduler_log.stat().st_size
        scheduler = ssl.create_default_context(cafile=str(client_dir / "ca.crt"))
        scheduler.load_cert_chain(str(client_dir / "tls.crt"), str(client_dir / "tls.key"))
        metrics_url = f"http://127.0.0.1:{args.port + 1}/metrics"
        figure(f"extender RSS before the attacks: {rss_mib(extender.pid):.0f} MiB, "
               f"{proc_status(extender.pid, 'Threads')} threads")

        # 5. Issue 28's attacker: idle TCP connections, more than the extender's slots, opened again when closed.
        probe_body = json.dumps({"Pod": pod_body("probe", 4), "NodeNames": list(NODES)}).encode()
        idle_started, idle_times = burst("idle", 4)  # the last 16 units free
        idle_attack(args.port, args.idle, args.idle_probes, extender.pid, (url, scheduler, server_name, probe_body),
                    http_timeout_s, lambda: all_bound(idle_started, idle_times))
        took = wait(lambda: all_bound(idle_started, idle_times), 120)
        check(took is not None, f"with {args.idle} idle connections, the scheduler keeps placing: "
                                f"{len(idle_times)}/{len(idle_started)} pods bound")
        if idle_times:
            figure(f"created -> bound during the idle attack: {ms(list(idle_times.values()))}")
        scheduler_lines = scheduler_log.read_bytes()[log_offset:].decode(errors="replace").splitlines()
        extender_errors = [line for line in scheduler_lines if "gpushare-scheduler" in line or "xtender" in line
                           or "Client.Timeout" in line or "deadline exceeded" in line]
        check(not extender_errors, f"the scheduler logged no extender error or timeout during the idle attack "
                                   f"({len(scheduler_lines)} log lines read): {extender_errors[:3]}")
        figure(f"extender RSS after the idle attack: {rss_mib(extender.pid):.0f} MiB, "
               f"{proc_status(extender.pid, 'Threads')} threads")

        # 6. Slow clients and a big body while the scheduler keeps placing pods.
        log_offset = scheduler_log.stat().st_size
        calls_before = {verb: duration_buckets(metrics_url, verb).get("+Inf", 0.0) for verb in ("filter", "bind")}
        attack = SlowClients(args.port, args.slow, SLOW_INTERVAL_S)
        cpu_before, wall_before = cpu_seconds(extender.pid), time.monotonic()
        attack.start()
        took = wait(lambda: attack.connected >= args.slow, 120)
        check(took is not None, f"{attack.connected} slow clients connected at once after {took or 0:.1f} s "
                                f"(one byte per {SLOW_INTERVAL_S:g} s each, reconnecting when closed)")
        probes: list[float] = []
        probe_errors: list[str] = []
        probing = threading.Event()

        def probe() -> None:  # a scheduler's filter on a fresh connection, twice a second, all through the attack
            while not probing.wait(0.5):
                try:
                    probes.append(timed_filter(url, scheduler, server_name, probe_body))
                except (OSError, RuntimeError) as exc:
                    probe_errors.append(str(exc))
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        started, times = burst("during", 12)
        status, body_s = big_body(args.port, scheduler, server_name)
        check(status.startswith("HTTP/1.1 413"), f"a 100 MB body is refused unread: {status!r} in {body_s:.2f} s")
        took = wait(lambda: all_bound(started, times), 120)
        check(took is not None, f"with {args.slow} slow clients and the big body, the scheduler keeps placing: "
                                f"{len(times)}/{len(started)} pods bound")
        if times:
            figure(f"created -> bound while attacked: {ms(list(times.values()))}")
        attacked_for = ATTACK_S - (time.monotonic() - wall_before)
        if attacked_for > 0:
            probing.wait(attacked_for)  # long enough for every slow connection to be closed and reopened twice
        probing.set()
        prober.join(60)
        cpu = cpu_seconds(extender.pid) - cpu_before
        wall = time.monotonic() - wall_before
        attack.stop()
        steady = attack.connected_samples[int(took or 0) + 1:] or attack.connected_samples
        check(min(steady, default=0) >= 0.95 * args.slow,
              f"{args.slow} slow clients stayed connected through the attack: min {min(steady, default=0)}, "
              f"median {sorted(steady)[len(steady) // 2] if steady else 0} connected at once (sampled each second over "
              f"{wall:.0f} s); {attack.opened} connections opened, {attack.refused} refused at connect")
        check(bool(attack.lifetimes) and max(attack.lifetimes) <= HANDSHAKE_TIMEOUT_S + 3,
              f"the server closed every slow connection at the TLS handshake deadline ({HANDSHAKE_TIMEOUT_S} s): "
              f"{len(attack.lifetimes)} closed, {ms(attack.lifetimes) if attack.lifetimes else 'none'} "
              "after connecting")
        check(not probe_errors and bool(probes) and max(probes) < http_timeout_s,
              f"a scheduler's filter on a fresh mutual-TLS connection is answered within httpTimeout "
              f"({http_timeout_s:g} s) all through the attack: {len(probes)} calls, "
              f"{ms(probes) if probes else 'none'}; {len(probe_errors)} failed {probe_errors[:3]}")
        for verb in ("filter", "bind"):
            buckets = duration_buckets(metrics_url, verb)
            calls = buckets.get("+Inf", 0.0) - calls_before[verb]
            # the histogram's buckets start with the earlier calls
            within = buckets.get("1.0", 0.0) - calls_before[verb]
            check(calls > 0 and buckets.get("1.0") == buckets.get("+Inf"),
                  f"every {verb} the extender answered during the attack took under 1 s to handle "
                  f"(histogram): {int(within)}/{int(calls)}" + (" (the probes' included)" if verb == "filter" else ""))
        scheduler_lines = scheduler_log.read_bytes()[log_offset:].decode(errors="replace").splitlines()
        extender_errors = [line for line in scheduler_lines if "gpushare-scheduler" in line or "xtender" in line
                           or "Client.Timeout" in line or "deadline exceeded" in line]
        check(not extender_errors, f"the scheduler logged no extender error or timeout during the attack "
                                   f"({len(scheduler_lines)} log lines read): {extender_errors[:3]}")
        check(cpu < 0.5 * wall, f"the extender did not spin: {cpu:.2f} s CPU in {wall:.1f} s")
        figure(f"extender RSS after the attack: {rss_mib(extender.pid):.0f} MiB, "
               f"{proc_status(extender.pid, 'Threads')} threads")

        used: dict[tuple[str, int], int] = {}
        for pod in admin.list_pods(field_selector="metadata.namespace=default")[0]:
            gpu = gpushare.assigned_gpu(pod)
            if pod["spec"].get("nodeName") and gpu is not None:
                key = (pod["spec"]["nodeName"], gpu)
                used[key] = used.get(key, 0) + gpushare.pod_request(pod)
        check(max(used.values()) <= UNITS, f"no GPU holds more than {UNITS}: {sorted(used.items())}")
        log = (work / "extender.log").read_text()
        check("Traceback" not in log, "no traceback in the extender's log")
    finally:
        allocating.set()
        stop(*reversed(processes))
        subprocess.run([str(args.k8s / "scheduler-down.sh")], env=cluster.env, check=False, stdout=subprocess.DEVNULL)
        if not args.keep:
            cluster.down()
        print(f"logs in {work}")
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
