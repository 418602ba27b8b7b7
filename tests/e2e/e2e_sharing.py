"""End to end: MPS and a shared subset, served to the real kubelet device manager. Not a test.

Run by hand (pytest does not collect ``e2e_*.py``); it needs ``dpkubelet`` from the shared
Kubernetes folder and runs it in fake mode (no API server: it admits fake pods itself):

    python tests/e2e/e2e_sharing.py [--k8s DIR]

1. MPS: the real ``gpu-labeller device-plugin`` on the ``l40s-x4-mps`` profile and the real
   ``gpu-labeller mps-control-daemon`` beside it, with the stand-in ``nvidia-cuda-mps-control`` and
   ``nvidia-smi`` (tests/fakes/bin) on PATH. Nothing is registered until the control daemon is
   ready; then dpkubelet admits two pods asking one ``nvidia.com/gpu`` each, and each Allocate
   answer carries ``CUDA_MPS_PIPE_DIRECTORY`` and the pipe and shm mounts. A daemon killed under
   it is started again; when the control daemon stops, the replicas are withdrawn.
2. Subset: ``dgx-h100-4of8-shared`` (GPUs 0-3 time-sliced x4 as ``nvidia.com/gpu.shared``, 4-7
   whole): one pod asking one of each is admitted; the whole GPU is one of 4-7, the replica one of 0-3.

Prints what it saw; exits with 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller.host.machine import NodeOptions, open_host  # noqa: E402
from tests.e2e.e2e_ownership import add_k8s_argument  # noqa: E402
from tests.e2e.e2e_plugin import JsonLines, named  # noqa: E402
from vendors.nvidia.model import NvidiaInventory  # noqa: E402

GPU, SHARED = "nvidia.com/gpu", "nvidia.com/gpu.shared"
FAKES = ROOT / "tests" / "fakes" / "bin"
Event = dict[str, Any]


class Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def __call__(self, ok: bool, what: str) -> None:
        print(f"  [{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            self.failures.append(what)


def dpkubelet(k8s: Path, sockets: Path, logs: Path, resources: list[str],
              pods: int) -> tuple[subprocess.Popen[str], JsonLines]:
    args = [str(k8s / "bin" / "dpkubelet"), "--socket-dir", str(sockets), "--duration", "0", "--pods", str(pods),
            "--allocate", "1"]
    for resource in resources:
        args += ["--resource", resource]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=(logs / "dpkubelet.klog").open("a"), text=True)
    assert proc.stdout is not None
    events = JsonLines(proc.stdout, logs / "dpkubelet.jsonl")
    events.wait(named("kubelet_started"), timeout=30)
    return proc, events


def gpu_labeller(logs: Path, name: str, *args: str) -> tuple[subprocess.Popen[str], JsonLines]:
    proc = subprocess.Popen([sys.executable, "-m", "labeller.cli", "--log-format", "json", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "GRPC_VERBOSITY": "ERROR", "PATH": f"{FAKES}:{os.environ['PATH']}"})
    assert proc.stderr is not None
    return proc, JsonLines(proc.stderr, logs / f"{name}.jsonl")


def stop(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def envs(event: Event) -> dict[str, str]:
    return {e["Name"]: e["Value"] for e in event.get("envs") or []}


def mounts(event: Event) -> list[tuple[str, str, bool]]:
    return [(m["HostPath"], m["ContainerPath"], bool(m["ReadOnly"])) for m in event.get("mounts") or []]


def mps_scenario(k8s: Path, work: Path, check: Checks) -> None:
    print("1. MPS: the plugin serves nvidia.com/gpu replicas only while the MPS control daemon is ready")
    sockets, logs, root = work / "mps-sockets", work / "logs", work / "mps"
    root.mkdir()
    config = work / "mps.yaml"
    config.write_text(json.dumps({"version": "v1", "flags": {"mpsRoot": str(root)},
                                  "sharing": {"mps": {"resources": [{"name": GPU, "replicas": 4}]}}}))
    kubelet, kubelet_log = dpkubelet(k8s, sockets, logs, [GPU], pods=2)
    plugin, plugin_log = gpu_labeller(logs, "plugin", "device-plugin", "--simulate", "l40s-x4-mps", "--config",
                                      str(config), "--socket-dir", str(sockets), "--metrics-port", "0")
    daemon: subprocess.Popen[str] | None = None
    try:
        plugin_log.wait(lambda e: e.get("event") == "resource not advertised" and e.get("waiting") is True)
        check(not any(e.get("event") == "plugin_registered" for e in kubelet_log.events),
              "nothing registered while no MPS control daemon runs")
        started = time.monotonic()
        daemon, daemon_log = gpu_labeller(logs, "mps-control-daemon", "mps-control-daemon", "--simulate", "l40s-x4-mps",
                                          "--config", str(config), "--check-interval", "0.5", "--metrics-port", "0")
        ready = daemon_log.wait(named("MPS daemon ready"))
        registered = kubelet_log.wait(named("plugin_registered", resource=GPU))
        devices = kubelet_log.wait(lambda e: e.get("event") == "devices" and e.get("healthy") == 16)
        print(f"  control daemon started -> daemon ready {ready['at'] - started:.2f} s, plugin_registered "
              f"{registered['at'] - started:.2f} s, devices healthy=16 {devices['at'] - started:.2f} s")
        check(registered["at"] - ready["at"] <= 2.5, "registered within 2.5 s of the daemon being ready "
              "(the plugin looks at the readiness file every second)")
        allocations = [kubelet_log.wait(lambda e, n=n: e.get("event") == "allocate" and e.get("pod") == f"dpk-pod-{n}")
                       for n in range(2)]
        for event in allocations:
            print(f"  allocate {event['pod']}: devices {event['device_ids']} envs {json.dumps(envs(event))} "
                  f"mounts {mounts(event)}")
        check(all(not e.get("error") for e in allocations), "both pods admitted")
        check(all(envs(e).get("CUDA_MPS_PIPE_DIRECTORY") == "/mps/nvidia.com/gpu/pipe" for e in allocations),
              "CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe in every answer")
        check(all(mounts(e) == [(f"{root}/nvidia.com/gpu/pipe", "/mps/nvidia.com/gpu/pipe", False),
                                (f"{root}/shm", "/dev/shm", False)] for e in allocations),
              "the resource's pipe directory and the shm directory are mounted")
        log = (root / "nvidia.com/gpu/log/control.log").read_text()
        told = [line.split("CMD: ", 1)[1] for line in log.splitlines() if "CMD: set_" in line]
        print(f"  the control daemon was told: {told}")
        check(told == [f"set_default_device_pinned_mem_limit {i} 11517M" for i in range(4)]
              + ["set_default_active_thread_percentage 25"], "limits: 46068 MiB / 4 per GPU, 100 / 4 percent")
        pid = int((root / "nvidia.com/gpu/pipe/nvidia-cuda-mps-control.pid").read_text())
        mark, kubelet_mark, killed = daemon_log.mark(), kubelet_log.mark(), time.monotonic()
        os.kill(pid, signal.SIGKILL)
        again = daemon_log.wait(lambda e: e.get("event") == "MPS daemon ready" and e.get("starts") == 2, since=mark)
        print(f"  daemon killed -> started again and ready {again['at'] - killed:.2f} s")
        # The readiness file drops the daemon while it is down; the plugin withdraws the replicas when its
        # once-a-second look falls in that window, and serves them again once the file names them.
        def served_again() -> bool:
            recent = kubelet_log.since(kubelet_mark)
            stops = [i for i, e in enumerate(recent) if e.get("event") == "plugin_stopped"]
            return not stops or any(e.get("event") == "devices" and e.get("healthy") == 16 for e in recent[stops[-1]:])

        deadline = time.monotonic() + 10
        while not served_again() and time.monotonic() < deadline:
            time.sleep(0.05)
        withdrawn = any(e.get("event") == "plugin_stopped" for e in kubelet_log.since(kubelet_mark))
        answer = "yes, and served again" if withdrawn else "no (back within a look)"
        print(f"  replicas withdrawn while it was down: {answer}")
        check(served_again(), "16 replicas served after the restart")
        mark, stopped = kubelet_log.mark(), time.monotonic()
        stop(daemon)
        gone = kubelet_log.wait(lambda e: e.get("event") in ("plugin_stopped", "devices") and e.get("resource") == GPU
                                and e.get("healthy", 0) == 0, since=mark, timeout=15)
        print(f"  control daemon stopped -> {gone['event']} (healthy 0) {gone['at'] - stopped:.2f} s")
        check(gone["at"] - stopped <= 3.0, "replicas withdrawn within 3 s of the control daemon stopping")
    finally:
        stop(*(p for p in (daemon, plugin, kubelet) if p is not None))


def subset_scenario(k8s: Path, work: Path, check: Checks) -> None:
    print("2. subset: GPUs 0-3 shared x4 as nvidia.com/gpu.shared, GPUs 4-7 whole as nvidia.com/gpu")
    sockets, logs = work / "subset-sockets", work / "logs"
    kubelet, kubelet_log = dpkubelet(k8s, sockets, logs, [GPU, SHARED], pods=1)
    plugin, _ = gpu_labeller(logs, "plugin-subset", "device-plugin", "--simulate", "dgx-h100-4of8-shared",
                             "--socket-dir", str(sockets), "--metrics-port", "0")
    try:
        whole = kubelet_log.wait(lambda e: e.get("event") == "devices" and e.get("resource") == GPU)
        shared = kubelet_log.wait(lambda e: e.get("event") == "devices" and e.get("resource") == SHARED)
        print(f"  devices: {GPU} healthy={whole['healthy']}, {SHARED} healthy={shared['healthy']}")
        check((whole["healthy"], shared["healthy"]) == (4, 16), "4 whole GPUs and 16 replicas")
        with open_host(NodeOptions(simulate="dgx-h100-4of8-shared")) as node:
            part = node.probe().part(NvidiaInventory)
        assert part is not None
        uuids = [g.uuid for g in part.gpus]
        allocations = [kubelet_log.wait(lambda e, r=r: e.get("event") == "allocate" and r in
                                        (e.get("devices_by_resource") or {})) for r in (GPU, SHARED)]
        event = allocations[0]
        print(f"  allocate {event['pod']}: {json.dumps(event['devices_by_resource'])} envs {json.dumps(envs(event))}")
        by_resource = event["devices_by_resource"]
        check(not event.get("error"), "the pod asking one of each is admitted")
        check(all(i in uuids[4:] for i in by_resource[GPU]), "its whole GPU is one of GPUs 4-7")
        check(all(i.split("::")[0] in uuids[:4] for i in by_resource[SHARED]), "its replica is of one of GPUs 0-3")
    finally:
        stop(plugin, kubelet)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_k8s_argument(parser)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="e2es", dir="/tmp"))  # short: unix socket paths are limited
    (work / "logs").mkdir()
    check = Checks()
    try:
        mps_scenario(args.k8s, work, check)
        subset_scenario(args.k8s, work, check)
    except TimeoutError as exc:
        check(False, f"timed out waiting: {exc}")
    finally:
        for pid_file in work.glob("**/nvidia-cuda-mps-control.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        print(f"logs: {work / 'logs'}" if args.keep else "")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("PASS" if not check.failures else f"FAIL: {len(check.failures)} check(s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
