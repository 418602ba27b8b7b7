"""Benchmark: what the real ``gpu-labeller dra-plugin`` process costs while nothing happens. Prints
figures; not a test.

Budgets (issue 29): idle <= 0.1 % of one core, RSS <= 60 MiB (AMD's own DRA driver on the same
node: 0.02 %, 44-48 MiB), with health and hardware changes still seen within 1 s (the tests in
tests/draplugin and tests/process await each wake source).

The plugin runs against the fake API server and the kubelet DRA manager stand-in (both in this
process), on simulated or captured nodes; once it has published and registered, and settled for
``--settle`` seconds, its CPU time is read over ``--seconds`` (what it used, whatever the machine's
load): utime + stime from /proc/<pid>/stat, counted in 10 ms ticks, and the nanoseconds each
thread ran (/proc/<pid>/task/*/schedstat), the precise figure. With them: its RSS (VmRSS), peak RSS
(VmHWM), threads, and how often its threads woke (voluntary context switches, per second, per
thread), which is what an idle process costs.

``--before DIR`` runs the same measurement on another checkout (its own ``.venv``), side by side:

    python tests/bench/bench_dra_idle.py [--seconds 60] [--settle 10] [--before /work/main]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_dra import wait  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402
from tests.fakes.drakubelet import FakeDraKubelet  # noqa: E402

NODE = "bench-node"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# name -> the plugin's arguments that give it that node
NODES = {
    "dgx-h100": ("--simulate", "dgx-h100"),
    "mi210-x8": ("--simulate", "mi210-x8"),  # the MI210 capture's KFD topology, with a PCI tree
    "mi300x-x8-cpx": ("--simulate", "mi300x-x8-cpx"),
}


@dataclass
class Sample:
    cpu_s: float  # utime + stime
    ran_s: float  # the threads' schedstat run times
    rss_mib: float
    hwm_mib: float
    threads: int
    wakeups: dict[str, int]  # thread id (and name) -> voluntary context switches so far


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def sample(pid: int) -> Sample:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    wakeups, ran_ns = {}, 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            switches = next(int(line.split()[1]) for line in (task / "status").read_text().splitlines()
                            if line.startswith("voluntary_ctxt_switches:"))
            ran_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, StopIteration):
            continue
        wakeups[f"{task.name} {name}"] = switches
    return Sample((int(fields[11]) + int(fields[12])) / CLK_TCK, ran_ns / 1e9, status_kib(pid, "VmRSS") / 1024,
                  status_kib(pid, "VmHWM") / 1024, status_kib(pid, "Threads"), wakeups)


def measure(tree: Path, python: str, node: str, seconds: float, settle: float) -> tuple[Sample, Sample, float]:
    """Start ``tree``'s plugin on ``node``; (sample before, sample after, wall seconds between)."""
    work = Path(tempfile.mkdtemp(prefix="draidle", dir="/tmp"))
    registry, plugins, cdi = work / "reg", work / "plugins", work / "cdi"
    with FakeApiServer() as api, FakeDraKubelet(registry) as kubelet:
        api.create_node(NODE)
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        config = work / "config.yaml"
        config.write_text("version: v1\nlabeller: {dra: {vendors: [nvidia, amd]}}\n")
        process = subprocess.Popen(
            [python, "-m", "labeller.cli", "--log-level", "warning", "dra-plugin", *NODES[node],
             "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--config", str(config),
             "--registry-dir", str(registry), "--plugins-dir", str(plugins), "--cdi-spec-dir", str(cdi),
             "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
            cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR", "PYTHONPATH": str(tree)})
        try:
            wait(lambda: api.slices(NODE))
            driver = api.slices(NODE)[0]["spec"]["driver"]
            wait(lambda: kubelet.registered(driver))
            time.sleep(settle)
            first, started = sample(process.pid), time.monotonic()
            time.sleep(seconds)
            last, wall = sample(process.pid), time.monotonic() - started
            if process.poll() is not None:
                raise SystemExit(f"the plugin exited with {process.returncode}")
            return first, last, wall
        finally:
            process.terminate()
            process.wait(20)
            shutil.rmtree(work, ignore_errors=True)


def report(label: str, node: str, first: Sample, last: Sample, wall: float) -> str:
    ran, ticks = 100 * (last.ran_s - first.ran_s) / wall, 100 * (last.cpu_s - first.cpu_s) / wall
    woke = {task: (last.wakeups[task] - first.wakeups.get(task, 0)) / wall for task in last.wakeups}
    busiest = sorted(((rate, task) for task, rate in woke.items() if rate > 0), reverse=True)[:3]
    return (f"{label:6} {node:14} CPU {ran:6.3f} % of a core (ticks: {ticks:5.2f} %)   RSS {last.rss_mib:5.1f} MiB "
            f"(peak {last.hwm_mib:5.1f})   {last.threads:2} threads, {sum(woke.values()):5.1f} wakeups/s"
            f" [{', '.join(f'{task.split()[1]} {rate:.1f}' for rate, task in busiest)}]")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0, help="idle seconds measured")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after registering before measuring")
    parser.add_argument("--before", type=Path, help="another checkout to measure side by side (its .venv)")
    parser.add_argument("--node", action="append", choices=sorted(NODES), help="default: every one")
    args = parser.parse_args()
    trees = [("after", ROOT, sys.executable)]
    if args.before is not None:
        trees.insert(0, ("before", args.before.resolve(), str(args.before.resolve() / ".venv" / "bin" / "python")))
    print(f"idle over {args.seconds:.0f} s after {args.settle:.0f} s settled (budget: <= 0.1 % of a core, "
          "RSS <= 60 MiB); wakeups/s: voluntary context switches of all threads, the busiest threads' ids")
    for node in args.node or list(NODES):
        for label, tree, python in trees:
            print(report(label, node, *measure(tree, python, node, args.seconds, args.settle)), flush=True)


if __name__ == "__main__":
    main()
