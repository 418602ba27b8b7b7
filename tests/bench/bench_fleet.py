"""Benchmark: a fleet of labelling daemons against one fake API server. Prints figures; not a test.

Runs N real ``Daemon`` loops (each with its own ``Kube`` client, watch and start-up jitter) on
threads in this process, all talking HTTP to one ``FakeApiServer``, and reports the API request
rate at start-up (per second) and in steady state. With ``--outage-seconds N`` it then stops
answering for N seconds (a label of every node is deleted meanwhile) and reports the retry rate
during the outage and how long after it every node is repaired.

    python tests/bench/bench_fleet.py [--nodes 200] [--jitter 2] [--interval 60]
                                      [--steady-seconds 20] [--outage-seconds 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.apps.daemon.service import Daemon, Options  # noqa: E402
from labeller.process.loop import ProcessLoop  # noqa: E402
from labeller.apps.daemon.reconcile import ProbeResult, owned  # noqa: E402
from labeller.apps.daemon.sinks import NodeSink  # noqa: E402
from labeller.cluster.kube import Kube  # noqa: E402
from labeller.base.log import configure  # noqa: E402
from labeller.apps.daemon.metrics import Metrics  # noqa: E402
from tests.fakes.apiserver import FakeApiServer, Fault  # noqa: E402

LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
          "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
          "nvidia.com/gpu.memory": "81559", "nvidia.com/cuda.driver.major": "550"}


def probe() -> ProbeResult:
    return ProbeResult(owned(LABELS))


def start_fleet(api: FakeApiServer, kubeconfig: Path, nodes: int, jitter: float, interval: float) -> list[ProcessLoop]:
    daemons = []
    for i in range(nodes):
        name = f"node-{i:04d}"
        kube = Kube(str(kubeconfig), pool_size=1)
        options = Options(interval_s=interval, start_jitter_s=jitter)
        daemon = ProcessLoop(Daemon(name, probe, NodeSink(kube, name, watch=True), Metrics(), options), options.loop())
        threading.Thread(target=daemon.run, daemon=True).start()
        daemons.append(daemon)
    return daemons


def per_second(api: FakeApiServer, since: float, seconds: int) -> list[int]:
    counts = Counter(int(r.at - since) for r in api.log.requests if r.at >= since)
    return [counts.get(s, 0) for s in range(seconds)]


def labelled(api: FakeApiServer, nodes: int, key: str = "nvidia.com/gpu.present") -> int:
    return sum(1 for i in range(nodes) if key in api.labels(f"node-{i:04d}"))


def outage(api: FakeApiServer, nodes: int, seconds: float) -> str:
    """No answers (and no watch) for ``seconds``; a label of every node goes meanwhile."""
    began = time.monotonic()
    api.faults.add(Fault(drop=True))
    api.drop_watches.set()
    for i in range(nodes):
        api.set_labels(f"node-{i:04d}", {"nvidia.com/gpu.count": None})
    time.sleep(seconds)
    attempts = per_second(api, began, int(seconds))
    api.faults.clear()
    api.drop_watches.clear()
    back = time.monotonic()
    while labelled(api, nodes, "nvidia.com/gpu.count") < nodes and time.monotonic() - back < 120:
        time.sleep(0.05)
    return (f"outage of {seconds:.0f} s: requests/s second by second {attempts} = "
            f"{sum(attempts[1:]) / max(1, len(attempts) - 1) / nodes:.2f} per node per second; every node repaired "
            f"{time.monotonic() - back:.2f} s after the API answered again")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--jitter", type=float, default=2.0, help="--start-jitter of every daemon (s)")
    parser.add_argument("--interval", type=float, default=60.0, help="--interval of every daemon (s)")
    parser.add_argument("--steady-seconds", type=float, default=20.0)
    parser.add_argument("--outage-seconds", type=float, default=0.0, help="then an API outage this long (s)")
    options = parser.parse_args()
    configure("warning", json_output=False)
    with tempfile.TemporaryDirectory() as tmp, FakeApiServer() as api:
        for i in range(options.nodes):
            api.create_node(f"node-{i:04d}", {"kubernetes.io/hostname": f"node-{i:04d}"})
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        began = time.monotonic()
        daemons = start_fleet(api, kubeconfig, options.nodes, options.jitter, options.interval)
        spawned = time.monotonic() - began
        deadline = began + 120
        while time.monotonic() < deadline and labelled(api, options.nodes) < options.nodes:
            time.sleep(0.1)
        all_labelled = time.monotonic() - began
        time.sleep(1.0)
        startup_window = int(all_labelled) + 1
        startup = per_second(api, began, startup_window)
        startup_verbs = api.log.by_verb(began)
        steady_from = time.monotonic()
        time.sleep(options.steady_seconds)
        steady = api.log.by_verb(steady_from)
        steady_total = sum(steady.values())
        watches = api.open_watches
        after_outage = outage(api, options.nodes, options.outage_seconds) if options.outage_seconds else ""
        for daemon in daemons:
            daemon.stop()
    print(f"fleet: {options.nodes} daemons (threads in one process, {options.nodes} clients) "
          "against one fake API server; "
          f"start jitter {options.jitter} s, interval {options.interval} s; spawned in {spawned:.1f} s")
    print(f"start-up: all nodes labelled after {all_labelled:.2f} s; requests by verb {dict(startup_verbs)}")
    print(f"start-up requests/s, second by second: {startup}; peak {max(startup)} req/s, "
          f"mean {sum(startup) / len(startup):.0f} req/s")
    print(f"steady state over {options.steady_seconds:.0f} s: {steady_total} requests = "
          f"{steady_total / options.steady_seconds:.2f} req/s ({dict(steady) or 'none'}); "
          f"writes: {steady.get('patch', 0)}; "
          f"open watches: {watches} (one per node)")
    if after_outage:
        print(after_outage)


if __name__ == "__main__":
    main()
