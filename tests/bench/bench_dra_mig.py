"""Benchmark: MIG devices made at prepare (``labeller.dra.dynamicMig``), the real ``gpu-labeller
dra-plugin`` process against the fake API server with DRAPartitionableDevices on (which validates the
counters as 1.34 does) and the kubelet DRA manager stand-in. Prints figures; not a test.

Budgets (issue 30):
  - publishing the counter sets of 8 A100s <= 1 s after start (a node of 8 A100 40GB, MIG enabled,
    no MIG device made yet: 8 slices of a counter set and 25 devices each). Printed two ways: from
    the process's start (the interpreter's start and imports included) and from the plugin's first
    log line (the service started) to its last slice written, from its log's timestamps;
  - NodePrepareResources of a claim of one MIG device made at prepare <= 100 ms p99 with the
    simulated NVML (the GPU and compute instance made, the ledger and checkpoint records, the CDI
    spec written), each claim unprepared (its MIG device destroyed) before the next; the devices go
    round the GPUs, profiles and placements;
  - 0 ResourceSlice writes while idle (``--idle`` seconds, a probe every second: the probes counted
    on the plugin's /metrics).

Each budget's line ends ``ok`` or ``OVER BUDGET``; exits 1 when one is over.

    python tests/bench/bench_dra_mig.py [--claims 400] [--idle 20]
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: its INFO lines are noise here
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_daemon import metric  # noqa: E402
from tests.bench.bench_dra import percentile, slice_writes, wait  # noqa: E402
from tests.bench.bench_plugin import rss_mib  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402
from tests.fakes.drakubelet import Claim, FakeDraKubelet  # noqa: E402

NODE = "bench-node"
NVIDIA = "gpu.nvidia.com"


def eight_a100s(path: Path) -> None:
    """dgx-a100-mig-dynamic with MIG enabled and no MIG device on all eight GPUs."""
    source = yaml.safe_load((ROOT / "vendors" / "profiles" / "dgx-a100-mig-dynamic.yaml").read_text())
    (first, *_) = source["nvidia"]["gpus"]
    source["nvidia"]["gpus"] = [{**first, "repeat": 8, "mig_mode": "enabled",
                                 "pci_bus_id": [f"0000:{bus:02x}:00.0" for bus in (7, 15, 71, 78, 135, 144, 183, 189)],
                                 "numa_node": [3, 3, 1, 1, 7, 7, 5, 5]}]
    path.write_text(yaml.safe_dump(source))


def seconds_after_start(log: Path) -> float:
    """From the plugin's first log line to its first ResourceSlices written, by their timestamps."""
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    stamp = [datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")) for e in events]
    done = next(i for i, e in enumerate(events) if e.get("event") == "ResourceSlices published")
    return (stamp[done] - stamp[0]).total_seconds()


def verdict(ok: bool) -> str:
    return "ok" if ok else "OVER BUDGET"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle to count writes over")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dramig", dir="/tmp"))
    registry, plugins, cdi, log = work / "reg", work / "plugins", work / "cdi", work / "plugin.log"
    with FakeApiServer(feature_gates={"DRAPartitionableDevices"}) as api, FakeDraKubelet(registry) as kubelet:
        api.create_node(NODE)
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        profile, config = work / "a100x8.yaml", work / "config.yaml"
        eight_a100s(profile)
        config.write_text("version: v1\nlabeller: {dra: {vendors: [nvidia], dynamicMig: true}}\n")
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "dra-plugin", "--simulate", str(profile),
             "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--config", str(config),
             "--registry-dir", str(registry), "--plugins-dir", str(plugins), "--cdi-spec-dir", str(cdi),
             "--metrics-port", "0", "--metrics-bind", "127.0.0.1",
             "--probe-interval", "1s"],  # the idle budget is over probes (the default is 300 s: a safety net)
            stdout=subprocess.DEVNULL, stderr=log.open("w"), env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
        try:
            # the request log, not the slices: copying 200 devices every 5 ms would slow the server down
            wait(lambda: api.log.count("create", "resourceslices") >= 8)
            published = time.monotonic() - started
            wait(lambda: "ResourceSlices published" in log.read_text())
            slices = api.slices(NODE, NVIDIA)
            devices = [d["name"] for s in slices for d in s["spec"]["devices"]]
            after_start = seconds_after_start(log)
            counted = sum(1 for s in slices if s["spec"].get("sharedCounters"))
            within = after_start <= 1.0 and counted == 8
            print(f"8 A100 40GB, MIG enabled, dynamicMig: {len(slices)} slices ({counted} with a counter set), "
                  f"{len(devices)} devices; counter sets published {after_start * 1000:.0f} ms after the plugin "
                  f"started (budget <= 1 s: {verdict(within)}), {published * 1000:.0f} ms after the process started "
                  "(interpreter start and imports included)")
            wait(lambda: kubelet.registered(NVIDIA))

            claims = []
            for i in range(args.claims):
                device = devices[i % len(devices)]
                obj = api.create_resource_claim(f"mig-{i}", results=[
                    {"request": "mig", "driver": NVIDIA, "pool": NODE, "device": device}])
                claims.append(Claim("default", f"mig-{i}", obj["metadata"]["uid"], NVIDIA))
            prepares, unprepares = [], []
            for claim in claims:
                began = time.perf_counter()
                answer = kubelet.call_prepare(NVIDIA, [claim])[claim.uid]
                prepares.append((time.perf_counter() - began) * 1000)
                if answer.error:
                    raise SystemExit(f"prepare failed: {answer.error}")
                began = time.perf_counter()
                gone = kubelet.call_unprepare(NVIDIA, [claim])[claim.uid]
                unprepares.append((time.perf_counter() - began) * 1000)
                if gone.error:
                    raise SystemExit(f"unprepare failed: {gone.error}")
            p99 = percentile(prepares, 99)
            within = within and p99 <= 100
            print(f"NodePrepareResources of one MIG device made at prepare, {args.claims} claims over "
                  f"{min(args.claims, len(devices))} profiles and placements: "
                  f"p50 {statistics.median(prepares):.2f} ms, "
                  f"p99 {p99:.2f} ms, max {max(prepares):.2f} ms (budget p99 <= 100 ms: {verdict(p99 <= 100)}); "
                  f"NodeUnprepareResources (MIG device destroyed): p50 {statistics.median(unprepares):.2f} ms, "
                  f"p99 {percentile(unprepares, 99):.2f} ms; plugin RSS {rss_mib(process.pid):.1f} MiB")
            port = next(json.loads(line)["port"] for line in log.read_text().splitlines()
                        if '"metrics server listening"' in line)
            idle_from, probes = time.monotonic(), metric(port, "gpu_labeller_dra_probes_total")
            time.sleep(args.idle)  # a measurement over a span: nothing is awaited
            idle = slice_writes(api, idle_from)
            probed = metric(port, "gpu_labeller_dra_probes_total") - probes
            within = within and idle == 0 and probed > 0
            print(f"idle {args.idle:.0f} s: {idle} ResourceSlice writes over {probed:.0f} probes "
                  f"(budget 0: {verdict(idle == 0 and probed > 0)}; {slice_writes(api)} in all, the first "
                  "publication included)")
        finally:
            process.terminate()
            process.wait(10)
            if not os.environ.get("BENCH_KEEP"):
                shutil.rmtree(work, ignore_errors=True)
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
