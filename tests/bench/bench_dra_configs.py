"""Benchmark: NodePrepareResources of claims with opaque configs, through the real ``gpu-labeller
dra-plugin`` process, the fake API server and the kubelet DRA manager stand-in, NVIDIA's tools being
the stand-ins of tests/fakes/bin (``nvidia-smi``, ``nvidia-cuda-mps-control``: Python scripts, so a
call costs an interpreter start). Prints figures; not a test.

Budgets (issue 29), p99 over the claims, each claim unprepared before the next:
  - a plain claim (no config): <= 10 ms, as before configs were read;
  - a TimeSlicing claim (NVIDIA's gpu-test5 ts-gpu config: one ``nvidia-smi compute-policy`` call): <= 50 ms;
  - an MPS claim (gpu-test5's mps-gpu config: compute mode, ``-d``, limits, percentage, the check): <= 1 s.

    python tests/bench/bench_dra_configs.py [--plain 500] [--timeslicing 200] [--mps 50]
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_dra import percentile, prepare_times, wait  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402
from tests.fakes.drakubelet import Claim, FakeDraKubelet  # noqa: E402

NODE = "bench-node"
DRIVER = "gpu.nvidia.com"
FAKES = ROOT / "tests" / "fakes" / "bin"
NV_API = "resource.nvidia.com/v1beta1"
CONFIGS: dict[str, Any] = {  # NVIDIA's demo/specs/quickstart/v1/gpu-test5.yaml, one request each
    "plain": None,
    "TimeSlicing": {"apiVersion": NV_API, "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
    "MPS": {"apiVersion": NV_API, "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                                                         "defaultPinnedDeviceMemoryLimit": "10Gi"}}},
}
BUDGET_MS = {"plain": 10, "TimeSlicing": 50, "MPS": 1000}


def tool_call_ms(calls: int, env: dict[str, str]) -> list[float]:
    """What one call of the stand-in nvidia-smi costs by itself on this machine now (an interpreter
    start): the floor under a TimeSlicing prepare that is not the plugin's."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        subprocess.run([str(FAKES / "nvidia-smi"), "compute-policy", "-i", "GPU-bench", "--set-timeslice", "0"],
                       capture_output=True, text=True, check=True, env=env)
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plain", type=int, default=500)
    parser.add_argument("--timeslicing", type=int, default=200)
    parser.add_argument("--mps", type=int, default=50)
    parser.add_argument("--profile", default="dgx-h100")
    args = parser.parse_args()
    counts = {"plain": args.plain, "TimeSlicing": args.timeslicing, "MPS": args.mps}
    work = Path(tempfile.mkdtemp(prefix="drac", dir="/tmp"))
    registry, plugins, cdi, mps_root = work / "reg", work / "plugins", work / "cdi", work / "mps"
    logs = {"FAKE_NVIDIA_SMI_LOG": str(work / "smi.log"), "FAKE_MPS_CONTROL_LOG": str(work / "mps.log")}
    with FakeApiServer() as api, FakeDraKubelet(registry) as kubelet:
        api.create_node(NODE)
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        config = work / "config.yaml"
        config.write_text("version: v1\nlabeller: {dra: {vendors: [nvidia]}}\n")
        process = subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-level", "warning", "dra-plugin", "--simulate", args.profile,
             "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--config", str(config),
             "--registry-dir", str(registry), "--plugins-dir", str(plugins), "--cdi-spec-dir", str(cdi),
             "--mps-root", str(mps_root), "--mps-control", str(FAKES / "nvidia-cuda-mps-control"),
             "--nvidia-smi", str(FAKES / "nvidia-smi"), "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR", **logs})
        try:
            wait(lambda: kubelet.registered(DRIVER) and api.slices(NODE, DRIVER))
            devices = [d["name"] for s in api.slices(NODE, DRIVER) for d in s["spec"]["devices"]]
            for kind, parameters in CONFIGS.items():
                made = []
                for i in range(counts[kind]):
                    name = f"{kind.lower()}-{i}"
                    config_entries = [{"source": "FromClaim", "requests": ["gpu"],
                                       "opaque": {"driver": DRIVER, "parameters": parameters}}] if parameters else None
                    obj = api.create_resource_claim(name, results=[
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": devices[i % len(devices)]}],
                        config=config_entries)
                    made.append(Claim("default", name, obj["metadata"]["uid"], DRIVER))
                times = prepare_times(kubelet, made, unprepare_each=True)
                p99 = percentile(times, 99)
                print(f"NodePrepareResources, {kind} claim of 1 device, {len(made)} claims, each unprepared before "
                      f"the next: p50 {statistics.median(times):.2f} ms, p99 {p99:.2f} ms, max {max(times):.2f} ms "
                      f"(budget p99 <= {BUDGET_MS[kind]} ms: {'met' if p99 <= BUDGET_MS[kind] else 'NOT MET'})")
            alone = tool_call_ms(100, {**os.environ, "FAKE_NVIDIA_SMI_LOG": str(work / "alone.log")})
            print(f"the stand-in nvidia-smi alone, 100 calls: p50 {statistics.median(alone):.2f} ms, "
                  f"p99 {percentile(alone, 99):.2f} ms (a real nvidia-smi call is an NVML start: slower)")
            smi = Path(logs["FAKE_NVIDIA_SMI_LOG"])
            calls = smi.read_text().count("\n") if smi.exists() else 0
            print(f"stand-in calls: nvidia-smi {calls}; MPS daemons started "
                  f"{Path(logs['FAKE_MPS_CONTROL_LOG']).read_text().count(': START') if args.mps else 0}, "
                  f"left under --mps-root: {len([p for p in mps_root.glob('*') if p.name != 'shm'])}")
        finally:
            process.terminate()
            process.wait(10)
            for pid_file in mps_root.glob("*/pipe/nvidia-cuda-mps-control.pid"):
                try:
                    os.kill(int(pid_file.read_text()), 9)
                except (OSError, ValueError):
                    pass
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
