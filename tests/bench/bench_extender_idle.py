"""Benchmark: issue 28's idle attacker against the scheduler extender, without a real control plane.
Prints figures; not a test.

The real ``gpu-labeller scheduler-extender`` process serves mutual TLS (certificates from
tests/extender/certs.py) against the fake API server in this process, with its default
``--max-connections`` (1,024) and a 3 s ``--tls-handshake-timeout``. The attacker of
tests/e2e/e2e_extender_tls.py holds ``--idle`` TCP connections open that send nothing (no TLS hello),
each opened again as soon as the extender closes it, while ``--calls`` filter calls are made one after
the other on fresh mutual-TLS connections, as the kube-scheduler makes them after an idle spell.
Budget (issue 28): every call answered within the scheduler's ``httpTimeout`` (5 s); the extender's
threads and RSS bounded (sampled every 0.2 s). The e2e script measures the same beside the real
kube-scheduler; this one needs no cluster, so two builds can be compared side by side.

    python tests/bench/bench_extender_idle.py [--idle 1100] [--calls 20]
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.process.httpserver import raise_open_files_limit  # noqa: E402
from tests.bench.bench_extender import build_cluster, free_port  # noqa: E402
from tests.e2e.e2e_config_switch import ms  # noqa: E402
from tests.e2e.e2e_extender_tls import (Sampler, SlowClients, cpu_seconds, pod_body, proc_status,  # noqa: E402
                                        rss_mib, timed_filter)
from tests.extender.certs import make_certs  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402

HTTP_TIMEOUT_S = 5.0  # the chart's KubeSchedulerConfiguration gives the extender this httpTimeout
NODES = 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=int, default=1100, help="idle TCP connections held open at once")
    parser.add_argument("--calls", type=int, default=20, help="filter calls on fresh mutual-TLS connections")
    args = parser.parse_args()
    raise_open_files_limit(args.idle + 512)  # the attacker's sockets
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with FakeApiServer() as api, tempfile.TemporaryDirectory() as tmp:
        build_cluster(api, NODES, 4)
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        certs = make_certs(Path(tmp) / "certs")
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-level", "warning", "scheduler-extender", "--port", str(port),
             "--bind", "127.0.0.1", "--kubeconfig", str(kubeconfig), "--tls-cert-file", str(certs.server_cert),
             "--tls-key-file", str(certs.server_key), "--client-ca-file", str(certs.ca), "--request-timeout", "5s",
             "--tls-handshake-timeout", "3s"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            context = ssl.create_default_context(cafile=str(certs.ca))
            context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
            url = f"https://127.0.0.1:{port}/gpushare-scheduler/filter"
            body = json.dumps({"Pod": pod_body("probe", 1), "NodeNames": [f"node-{n:04}" for n in range(NODES)]})
            probe = (url, context, "localhost", body.encode())
            wait_ready(probe)
            attack(process.pid, args.idle, args.calls, probe)
        finally:
            process.terminate()
            process.wait(timeout=10)


def wait_ready(probe: tuple[str, ssl.SSLContext, str, bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            timed_filter(*probe)
            return
        except (OSError, RuntimeError):
            time.sleep(0.05)
    raise SystemExit("the extender did not answer a filter in 60 s")


def attack(pid: int, idle: int, calls: int, probe: tuple[str, ssl.SSLContext, str, bytes]) -> None:
    threads_before, rss_before = proc_status(pid, "Threads"), rss_mib(pid)
    attacker = SlowClients(int(probe[0].rsplit(":", 1)[1].split("/", 1)[0]), idle, None)
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    answered: list[float] = []
    errors: list[str] = []
    with Sampler(pid) as sampler:
        attacker.start()
        while attacker.opened < idle and time.monotonic() - started < 120:
            time.sleep(0.05)  # the attacker's connections, opened on its own thread
        for _ in range(calls):
            try:
                answered.append(timed_filter(*probe))
            except (OSError, RuntimeError) as exc:
                errors.append(str(exc) or type(exc).__name__)
            time.sleep(0.25)  # pacing the calls, as the e2e script does
    cpu, wall = cpu_seconds(pid) - cpu_before, time.monotonic() - started
    attacker.stop()
    within = sum(seconds < HTTP_TIMEOUT_S for seconds in answered)
    print(f"{within} of {calls} filter calls on fresh mutual-TLS connections answered within {HTTP_TIMEOUT_S:g} s "
          f"with {idle} idle TCP connections held open: {ms(answered) if answered else 'none'}; "
          f"{len(errors)} failed {errors[:3]}")
    print(f"attacker: {attacker.opened} connections opened in {wall:.1f} s, {len(attacker.lifetimes)} closed by the "
          f"extender (lifetime {ms(attacker.lifetimes) if attacker.lifetimes else '-'})")
    print(f"extender: threads {threads_before} before, max {max(sampler.threads, default=0)} during; RSS "
          f"{rss_before:.0f} MiB before, max {max(sampler.rss, default=0):.0f} MiB during; CPU {cpu:.1f} s in "
          f"{wall:.1f} s")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
