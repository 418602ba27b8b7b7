"""Benchmark: the real ``gpu-labeller dra-plugin`` process against the fake API server and the kubelet
DRA manager stand-in. Prints figures; not a test.

Budgets (issue 20):
  - time from start to published ResourceSlices (and to registered with the kubelet);
  - NodePrepareResources p99 <= 10 ms for a claim of one device, over 1,000 claims, through a real
    unix-socket gRPC channel (the claim read from the API server, the CDI spec and the checkpoint
    written); once with each claim unprepared before the next, once with all 1,000 kept prepared
    (shared allocations: a shareID each, as a device that allows multiple allocations gets them);
  - 0 ResourceSlice writes while idle (the issue: 10 idle minutes; ``--idle 600``);
  - plugin RSS <= 80 MiB (after the claims, and after the idle time).

With ``--memory-unit GiB`` the node shares its GPUs by memory (issue 30: ``sharing.memory`` in DRA,
the API server with ``DRAConsumableCapacity``, or without it with ``--gate-off``): the kept claims
are shares (a ``consumedCapacity`` each), and the writes it took to publish are printed.

    python tests/bench/bench_dra.py [--claims 1000] [--idle 60] [--profile dgx-h100] [--memory-unit GiB [--gate-off]]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: its INFO lines are noise here
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_plugin import cpu_seconds, rss_mib  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402
from tests.fakes.drakubelet import Claim, FakeDraKubelet  # noqa: E402

NODE = "bench-node"
WRITES = ("create", "update", "delete", "patch")


def slice_writes(api: FakeApiServer, since: float = 0.0) -> int:
    return sum(api.log.count(verb, "resourceslices", since) for verb in WRITES)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def wait(predicate: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.005)


def prepare_times(kubelet: FakeDraKubelet, claims: list[Claim], unprepare_each: bool) -> list[float]:
    times = []
    for claim in claims:
        started = time.perf_counter()
        answer = kubelet.call_prepare(claim.driver, [claim])[claim.uid]
        times.append((time.perf_counter() - started) * 1000)
        if answer.error:
            raise SystemExit(f"prepare failed: {answer.error}")
        if unprepare_each:
            kubelet.call_unprepare(claim.driver, [claim])
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle to count writes over")
    parser.add_argument("--profile", default="dgx-h100")
    parser.add_argument("--memory-unit", choices=("GiB", "MiB"), help="share the GPUs by memory (sharing.memory)")
    parser.add_argument("--gate-off", action="store_true", help="the API server without DRAConsumableCapacity")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="drab", dir="/tmp"))
    registry, plugins, cdi = work / "reg", work / "plugins", work / "cdi"
    gates = ["DRAConsumableCapacity"] if args.memory_unit and not args.gate_off else []
    with FakeApiServer(feature_gates=gates) as api, FakeDraKubelet(registry) as kubelet:
        api.create_node(NODE)
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        config = work / "config.yaml"
        memory = f"sharing: {{memory: {{unit: {args.memory_unit}}}}}\n" if args.memory_unit else ""
        config.write_text(f"version: v1\nlabeller: {{dra: {{vendors: [nvidia, amd]}}}}\n{memory}")
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-level", "warning", "dra-plugin", "--simulate", args.profile,
             "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--config", str(config),
             "--registry-dir", str(registry), "--plugins-dir", str(plugins), "--cdi-spec-dir", str(cdi),
             "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
        try:
            wait(lambda: api.slices(NODE))
            published = time.monotonic() - started
            driver = api.slices(NODE)[0]["spec"]["driver"]
            wait(lambda: kubelet.registered(driver))
            registered = time.monotonic() - started
            devices = [d["name"] for s in api.slices(NODE, driver) for d in s["spec"]["devices"]]
            print(f"{args.profile}: {len(devices)} {driver} devices; "
                  f"start -> slices published {published * 1000:.0f} ms, "
                  f"-> registered with the kubelet {registered * 1000:.0f} ms (interpreter start included)")
            if args.memory_unit:
                shared = [d["name"] for s in api.slices(NODE, driver) for d in s["spec"]["devices"]
                          if d.get("allowMultipleAllocations")]
                print(f"sharing.memory ({args.memory_unit}), DRAConsumableCapacity "
                      f"{'off' if args.gate_off else 'on'}: {len(shared)} of {len(devices)} devices published for "
                      f"shares; {slice_writes(api)} ResourceSlice writes to publish")

            def claims(prefix: str, shared: bool) -> list[Claim]:
                """One device each; ``shared``: allocated as consumable capacity allocates a device that
                allows multiple allocations (a shareID each), so that 1,000 claims can be prepared at
                once on a node of 8 devices (an exclusive device is refused to a second claim)."""
                made = []
                for i in range(args.claims):
                    share = {"shareID": str(uuid.uuid4())} if shared else {}
                    if shared and args.memory_unit and not args.gate_off:
                        share["consumedCapacity"] = {"memory": "16Mi"}  # 1,000 shares fit 8 GPUs
                    obj = api.create_resource_claim(f"{prefix}-{i}", results=[
                        {"request": "gpu", "driver": driver, "pool": NODE, "device": devices[i % len(devices)],
                         **share}])
                    made.append(Claim("default", f"{prefix}-{i}", obj["metadata"]["uid"], driver))
                return made

            for label, unprepare_each in (("each unprepared before the next", True),
                                          ("all kept prepared (shared allocations)", False)):
                made = claims("each", False) if unprepare_each else claims("kept", True)
                times = prepare_times(kubelet, made, unprepare_each)
                print(f"NodePrepareResources, 1 device per claim, {args.claims} claims, {label}: "
                      f"p50 {statistics.median(times):.2f} ms, p99 {percentile(times, 99):.2f} ms, "
                      f"max {max(times):.2f} ms (budget p99 <= 10 ms); plugin RSS then {rss_mib(process.pid):.1f} MiB "
                      "(budget <= 80 MiB)")
            idle_from, cpu_from = time.monotonic(), cpu_seconds(process.pid)
            time.sleep(args.idle)
            cpu = cpu_seconds(process.pid) - cpu_from
            print(f"idle {args.idle:.0f} s: {slice_writes(api, idle_from)} ResourceSlice writes "
                  f"({api.log.count(None, None, idle_from)} API requests of any kind), CPU {cpu:.2f} s "
                  f"({100 * cpu / args.idle:.2f} % of one core; bench_dra_idle.py has the details); "
                  f"RSS {rss_mib(process.pid):.1f} MiB")
        finally:
            process.terminate()
            process.wait(10)
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
