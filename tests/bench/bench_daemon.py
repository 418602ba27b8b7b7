"""Benchmark: the real `gpu-labeller run` process against the fake API server. Prints figures; not a test.

Budgets (issue 3):
  - zero write requests per node-hour with unchanged hardware; at most one open watch;
  - drift repair median <= 1 s; process start -> labels applied <= 2 s;
  - steady-state RSS <= 80 MiB; idle CPU <= 1 % of one core at the default interval (60 s).

    python tests/bench/bench_daemon.py [--profile mi210-x8] [--busy-seconds 10] [--idle-seconds 20] [--repairs 20]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fakes.apiserver import FakeApiServer  # noqa: E402

NODE = "bench-node"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_daemon(kubeconfig: Path, profile: str, interval: float, port: int) -> tuple[subprocess.Popen[bytes], float]:
    args = [sys.executable, "-m", "labeller.cli", "--log-level", "warning", "run", "--node-name", NODE,
            "--kubeconfig", str(kubeconfig), "--simulate", profile, "--interval", str(interval),
            "--start-jitter", "0", "--metrics-port", str(port)]
    began = time.monotonic()
    return subprocess.Popen(args, cwd=ROOT, stderr=subprocess.DEVNULL), began


def ours(api: FakeApiServer) -> dict[str, str]:
    return {k: v for k, v in api.labels(NODE).items() if k.startswith(("amd.com/", "beta.amd.com/", "nvidia.com/gpu."))}


def wait(predicate, timeout: float = 10.0, step: float = 0.002) -> float:  # type: ignore[no-untyped-def]
    began = time.monotonic()
    while not predicate():
        if time.monotonic() - began > timeout:
            raise SystemExit("timed out waiting")
        time.sleep(step)
    return time.monotonic() - began


def rss_mib(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def probes_done(port: int) -> float:
    return metric(port, "gpu_labeller_probes_total")


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
        text = answer.read().decode()
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def fight(api: FakeApiServer, port: int, key: str, seconds: float) -> tuple[int, float, float]:
    """Another writer resets ``key`` every 20 ms; then stops. Our writes meanwhile, fights reported,
    and the seconds from its last write until our value is back."""
    ours = api.labels(NODE)[key]
    since = last = time.monotonic()
    while time.monotonic() - since < seconds:
        if api.labels(NODE).get(key) != "someone-else":
            api.set_labels(NODE, {key: "someone-else"}, manager="other-controller")
            last = time.monotonic()
        time.sleep(0.02)
    writes = len(api.log.writes(since))
    wait(lambda: api.labels(NODE).get(key) == ours, timeout=600)
    back_in = time.monotonic() - last
    return writes, metric(port, "gpu_labeller_label_fights_total"), back_in


def busy_run(api: FakeApiServer, kubeconfig: Path, profile: str, seconds: float, repairs: int) -> None:
    port = free_port()
    process, began = start_daemon(kubeconfig, profile, 0.05, port)
    try:
        wait(lambda: bool(ours(api)), timeout=20)
        start_to_labels = time.monotonic() - began
        labels = sorted(ours(api))
        since = time.monotonic()
        probes_before = probes_done(port)
        time.sleep(seconds)
        probes = probes_done(port) - probes_before
        writes = len(api.log.writes(since))
        other = dict(api.log.by_verb(since))
        repair_times = []
        for i in range(repairs):
            key = labels[i % len(labels)]  # rotate keys: the same key over and over would be a fight
            api.set_labels(NODE, {key: None})
            repair_times.append(wait(lambda key=key: key in api.labels(NODE), timeout=10))
            time.sleep(0.05)
        rss = rss_mib(process.pid)
        fight_writes, fights, back_in = fight(api, port, labels[0], seconds)
    finally:
        process.terminate()
        process.wait(timeout=5)
    hours = probes * 60 / 3600  # each probe stands for one default 60 s interval
    print(f"start -> labels applied: {start_to_labels:.2f} s   "
          f"(budget <= 2 s; {len(labels)} labels, profile {profile})")
    print(f"unchanged hardware: {probes:.0f} re-probes in {seconds:.0f} s (= {hours:.1f} node-hours at 60 s), "
          f"{writes} write requests -> {writes / max(hours, 1e-9):.2f} writes per node-hour   (budget 0)")
    print(f"requests during that window by verb: {other or '{}'}; "
          f"max open watches: {api.max_open_watches}   (budget 1)")
    print(f"drift repair over {repairs} removals: median {statistics.median(repair_times) * 1000:.1f} ms, "
          f"p95 {sorted(repair_times)[int(len(repair_times) * 0.95) - 1] * 1000:.1f} ms, "
          f"max {max(repair_times) * 1000:.1f} ms   (budget median <= 1000 ms)")
    print(f"RSS after {seconds:.0f} s at a 0.05 s interval: {rss:.1f} MiB   (budget <= 80 MiB)")
    print(f"label fight: another writer resets {labels[0]} every 20 ms for {seconds:.0f} s -> {fight_writes} writes by "
          f"gpu-labeller, gpu_labeller_label_fights_total {fights:.0f} (paced repairs, no hot loop); our value back "
          f"{back_in * 1000:.0f} ms after its last write")


def idle_run(api: FakeApiServer, kubeconfig: Path, profile: str, seconds: float) -> None:
    port = free_port()
    process, _ = start_daemon(kubeconfig, profile, 60.0, port)
    try:
        wait(lambda: bool(ours(api)), timeout=20)
        time.sleep(2.0)  # let start-up settle
        cpu_before, wall_before = cpu_seconds(process.pid), time.monotonic()
        time.sleep(seconds)
        cpu = cpu_seconds(process.pid) - cpu_before
        wall = time.monotonic() - wall_before
        rss = rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=5)
    print(f"idle at the default 60 s interval: {cpu:.2f} CPU-s over {wall:.1f} s = {100 * cpu / wall:.2f} % of a core "
          f"(budget <= 1 %); RSS {rss:.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="mi210-x8")
    parser.add_argument("--busy-seconds", type=float, default=10.0)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--repairs", type=int, default=20)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for run in ("busy", "idle"):
            with FakeApiServer() as api:
                api.create_node(NODE, {"kubernetes.io/hostname": NODE, "team": "bench"})
                kubeconfig = api.write_kubeconfig(Path(tmp) / f"kubeconfig-{run}")
                if run == "busy":
                    busy_run(api, kubeconfig, options.profile, options.busy_seconds, options.repairs)
                else:
                    idle_run(api, kubeconfig, options.profile, options.idle_seconds)


if __name__ == "__main__":
    main()
