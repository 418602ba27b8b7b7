"""Benchmark: what the real ``gpu-labeller dra-plugin`` process costs while nothing happens. Prints
figures; not a test.

Budgets (issue 29): idle <= 0.1 % of one core, RSS <= 60 MiB (AMD's own DRA driver on the same
node: 0.02 %, 44-48 MiB), 0 ResourceSlice writes while idle, with health and hardware changes still
seen within 1 s and a config switch within 5 s (issue 12's budget).

The plugin runs as the chart runs it (``--config-dir`` of named configs, the one named by the Node's
``nvidia.com/device-plugin.config`` label) against the fake API server and the kubelet DRA manager
stand-in (both in this process), on simulated or captured nodes; once it has published and
registered, and settled for ``--settle`` seconds, its CPU time is read over ``--seconds`` (what it
used, whatever the machine's load): utime + stime from /proc/<pid>/stat, counted in 10 ms ticks, and
the nanoseconds each thread ran (/proc/<pid>/task/*/schedstat), the precise figure. With them: its
RSS (VmRSS), peak RSS (VmHWM), threads, how often its threads woke (voluntary context switches, per
second, per thread), which is what an idle process costs, and the ResourceSlice writes (and all
requests) the API server saw meanwhile.

Then, on the same process, each kind of change is made ``--rounds`` times, each after a random pause
(at any phase of the plugin's polls), and timed to the slices on the API server, and to the plugin's
log line saying it saw the change where it logs one (median and worst; the plugin logs at info, as
deployed: nothing while idle):
the Node's label switched to a config that serves nothing through DRA and back, the selected
ConfigMap key edited the same way (the kubelet's ``..data`` swap), and, on AMD nodes, a GPU's KFD
topology node removed and put back as amdkfd does (``generation_id`` moved where the tree has one):
the device leaves the slice and returns. NVIDIA's health events (an XID, a GPU off the bus) need the
simulated NVML's hooks, in process: tests/draplugin/test_draplugin_idle.py awaits them with every
schedule at an hour, and bench_dra_taints.py times them.

``--before DIR`` runs the same measurement on another checkout (its own ``.venv``), side by side:

    python tests/bench/bench_dra_idle.py [--seconds 60] [--settle 10] [--rounds 5] [--before DIR] [--node NAME]

``--node this-node``: the machine's own GPUs (``--host-root /``, real NVML), on a machine that has one;
its KFD topology is never touched.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_dra import slice_writes, wait  # noqa: E402
from tests.builders import TOPOLOGY, config_map_volume, kfd_node_goes  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402
from tests.fakes.drakubelet import FakeDraKubelet  # noqa: E402
from vendors.simulate import ROOT_PREFIX, scratch_dir  # noqa: E402

NODE = "bench-node"
LABEL = "nvidia.com/device-plugin.config"
SERVING = {"version": "v1", "labeller": {"dra": {"vendors": ["nvidia", "amd"]}}}
CONFIGS = {"default": {"version": "v1"}, "dra": SERVING}  # default: the device plugin's, nothing through DRA
HEALTH_BUDGET_S, SWITCH_BUDGET_S = 1.0, 5.0  # a KFD node seen by the plugin; a config switch on the slices
KFD_SEEN = ("hardware changed; probing again", "device health changed")  # the lines that say the plugin saw it
CLK_TCK = os.sysconf("SC_CLK_TCK")
# name -> the plugin's arguments that give it that node
NODES = {
    "dgx-h100": ("--simulate", "dgx-h100"),
    "mi210-x8": ("--simulate", "mi210-x8"),  # the MI210 capture's KFD topology, with a PCI tree
    "mi300x-x8-cpx": ("--simulate", "mi300x-x8-cpx"),
    "this-node": ("--host-root", "/"),  # this machine's own GPUs (real NVML): only when named
}


@dataclass
class Sample:
    cpu_s: float  # utime + stime
    ran_s: float  # the threads' schedstat run times
    rss_mib: float
    hwm_mib: float
    threads: int
    wakeups: dict[str, int]  # thread id (and name) -> voluntary context switches so far


@dataclass
class Run:
    first: Sample
    last: Sample
    wall: float
    slice_writes: int  # while idle
    requests: int  # every request the API server saw while idle (watch renewals, ...)
    log_lines: int  # what the plugin logged while idle (at info)
    reactions: list[Change] = field(default_factory=list)


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


def devices(api: FakeApiServer) -> int:
    return sum(len(s["spec"].get("devices", [])) for s in api.slices(NODE))


def host_root(pid: int) -> Path | None:
    """The simulated node's root that process ``pid`` built; None on this machine (``this-node``)."""
    roots = list(Path(scratch_dir() or tempfile.gettempdir()).glob(f"{ROOT_PREFIX}{pid}-*"))
    return roots[0] if len(roots) == 1 else None


@dataclass
class Change:
    what: str
    make: Callable[[], object]
    done: Callable[[], bool]  # the slices on the API server say so
    seen_by: tuple[str, ...] = ()  # the plugin's log lines that say it saw the change (budget on the first)
    budget_s: float = SWITCH_BUDGET_S
    seconds: list[float] = field(default_factory=list)  # to ``done``, each time
    seen_s: list[float] = field(default_factory=list)  # to the first ``seen_by`` line, each time one was logged


def logged_after(log: Path, events: tuple[str, ...], since: float) -> float | None:
    """The time (epoch seconds) of the first of ``events`` the plugin logged (JSON lines) at or after ``since``."""
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
            at = datetime.fromisoformat(entry["timestamp"]).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if entry.get("event") in events and at >= since:
            return at
    return None


def react(api: FakeApiServer, configs: Path, pid: int, log: Path, rounds: int) -> list[Change]:
    """Each kind of change, made ``rounds`` times on the running plugin, each after a random pause (at any
    phase of its polls): seconds to the slices on the API server, and to the line saying it was seen."""
    served, off = devices(api), {**CONFIGS, "dra": CONFIGS["default"]}
    changes = [Change("label -> nothing through DRA", lambda: api.set_labels(NODE, {LABEL: "default"}),
                      lambda: not api.slices(NODE)),
               Change("label -> DRA", lambda: api.set_labels(NODE, {LABEL: "dra"}), lambda: devices(api) == served),
               Change("ConfigMap edit -> nothing", lambda: config_map_volume(configs, off),
                      lambda: not api.slices(NODE)),
               Change("ConfigMap edit -> DRA", lambda: config_map_volume(configs, CONFIGS),
                      lambda: devices(api) == served)]
    root = host_root(pid)
    # an AMD node: its last KFD node is a GPU's (the CPUs' come first); never on this machine's own
    if root is not None and (root / TOPOLOGY).is_dir():
        last = max(int(p.name) for p in (root / TOPOLOGY).iterdir())
        back: list[Callable[[], None]] = []
        changes += [Change("KFD node gone", lambda: back.append(kfd_node_goes(root, last)),
                           lambda: devices(api) == served - 1, KFD_SEEN, HEALTH_BUDGET_S),
                    Change("KFD node back", lambda: back.pop()(), lambda: devices(api) == served, KFD_SEEN,
                           HEALTH_BUDGET_S)]
    for _ in range(rounds):
        for change in changes:
            time.sleep(random.uniform(0, 1))
            at, started = time.time(), time.monotonic()
            change.make()
            wait(change.done, 120)  # the code before: a KFD node back is Healthy after the 60 s recovery
            change.seconds.append(time.monotonic() - started)
            seen = logged_after(log, change.seen_by, at) if change.seen_by else None
            if seen is not None:
                change.seen_s.append(seen - at)
    return changes


def measure(tree: Path, python: str, node: str, seconds: float, settle: float, rounds: int) -> Run:
    """Start ``tree``'s plugin on ``node``; what it cost while idle, then how fast it reacts."""
    work = Path(tempfile.mkdtemp(prefix="draidle", dir="/tmp"))
    registry, plugins, cdi, configs = work / "reg", work / "plugins", work / "cdi", work / "configs"
    log = work / "plugin.log"
    config_map_volume(configs, CONFIGS)
    with FakeApiServer() as api, FakeDraKubelet(registry) as kubelet, log.open("w") as stderr:
        api.create_node(NODE)
        api.set_labels(NODE, {LABEL: "dra"})
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        process = subprocess.Popen(
            [python, "-m", "labeller.cli", "--log-format", "json", "dra-plugin", *NODES[node],
             "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--config-dir", str(configs),
             "--config-label", LABEL, "--registry-dir", str(registry), "--plugins-dir", str(plugins),
             "--cdi-spec-dir", str(cdi), "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
            cwd=tree, stdout=subprocess.DEVNULL, stderr=stderr,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR",
                 "PYTHONPATH": os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH"))))})
        try:
            wait(lambda: api.slices(NODE))
            driver = api.slices(NODE)[0]["spec"]["driver"]
            wait(lambda: kubelet.registered(driver))
            time.sleep(settle)
            first, started = sample(process.pid), time.monotonic()
            lines = len(log.read_text().splitlines())
            time.sleep(seconds)
            last, wall = sample(process.pid), time.monotonic() - started
            run = Run(first, last, wall, slice_writes(api, started), api.log.count(None, None, started),
                      len(log.read_text().splitlines()) - lines)
            if process.poll() is not None:
                raise SystemExit(f"the plugin exited with {process.returncode}")
            run.reactions = react(api, configs, process.pid, log, rounds)
            return run
        finally:
            process.terminate()
            process.wait(20)
            shutil.rmtree(work, ignore_errors=True)


def report(label: str, node: str, run: Run) -> str:
    first, last, wall = run.first, run.last, run.wall
    ran, ticks = 100 * (last.ran_s - first.ran_s) / wall, 100 * (last.cpu_s - first.cpu_s) / wall
    woke = {task: (last.wakeups[task] - first.wakeups.get(task, 0)) / wall for task in last.wakeups}
    busiest = sorted(((rate, task) for task, rate in woke.items() if rate > 0), reverse=True)[:3]

    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:.0f}/{max(values) * 1000:.0f} ms"

    reactions = ", ".join(f"{c.what} {ms(c.seconds)}" + (f" (seen {ms(c.seen_s)})" if c.seen_s else "")
                          for c in run.reactions)
    late = [c.what for c in run.reactions if max(c.seen_s or c.seconds) > c.budget_s]
    return (f"{label:6} {node:14} CPU {ran:6.3f} % of a core (ticks: {ticks:5.2f} %)   RSS {last.rss_mib:5.1f} MiB "
            f"(peak {last.hwm_mib:5.1f})   {last.threads:2} threads, {sum(woke.values()):5.1f} wakeups/s"
            f" [{', '.join(f'{task.split()[1]} {rate:.1f}' for rate, task in busiest)}]   "
            f"{run.slice_writes} slice writes ({run.requests} requests, {run.log_lines} log lines) while idle\n"
            f"{'':22}reacts: {reactions}{'   OVER BUDGET: ' + ', '.join(late) if late else ''}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0, help="idle seconds measured")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after registering before measuring")
    parser.add_argument("--before", type=Path, help="another checkout to measure side by side (its .venv)")
    parser.add_argument("--node", action="append", choices=sorted(NODES), help="default: every one but this-node")
    parser.add_argument("--rounds", type=int, default=5, help="times each change is made, after the idle window")
    args = parser.parse_args()
    trees = [("after", ROOT, sys.executable)]
    if args.before is not None:
        trees.insert(0, ("before", args.before.resolve(), str(args.before.resolve() / ".venv" / "bin" / "python")))
    print(f"idle over {args.seconds:.0f} s after {args.settle:.0f} s settled (budget: <= 0.1 % of a core, "
          "RSS <= 60 MiB, 0 slice writes); wakeups/s: voluntary context switches of all threads, the busiest "
          "threads' ids; reacts: median/max from a change to the slices on the API server, and to the plugin's "
          f"line saying it saw it (budget: a config switch on the slices {SWITCH_BUDGET_S:g} s, a KFD node seen "
          f"{HEALTH_BUDGET_S:g} s)")
    for node in args.node or [name for name in NODES if name != "this-node"]:
        for label, tree, python in trees:
            print(report(label, node, measure(tree, python, node, args.seconds, args.settle, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
