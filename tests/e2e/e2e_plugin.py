"""End to end: ``gpu-labeller device-plugin`` against the real kubelet device manager. Not a test.

Run by hand (pytest does not collect ``e2e_*.py``); it needs ``dpkubelet`` from the shared
Kubernetes folder and runs it in fake mode (no API server):

    python tests/e2e/e2e_plugin.py [--k8s DIR] [--restarts 5]

1. Late driver: the plugin starts on a profile whose NVIDIA section has ``nvml_error:
   library_not_found``; after it has retried a few times the file is rewritten without it. Measured:
   rewrite -> dpkubelet ``plugin_registered`` and healthy devices, with no SIGHUP.
2. SIGHUP reload, time-slicing replicas 2 -> 4 under the same name: from dpkubelet's ``devices``
   and ``node_status`` events, allocatable never 0 and no new registration.
3. dpkubelet restarts (it empties the socket directory, as a kubelet does): restart -> registered
   again with healthy devices.

Prints what it saw; exits with 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.e2e_ownership import add_k8s_argument  # noqa: E402
from tests.plugin.profile_files import l40s_node, time_slicing, write_yaml  # noqa: E402

GPU = "nvidia.com/gpu"
Event = dict[str, Any]


class JsonLines:
    """Reads a process's JSON lines on a thread; each event gets ``at`` (time.monotonic()) when read."""

    def __init__(self, stream: IO[str], copy: Path):
        self.events: list[Event] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(stream, copy), daemon=True).start()

    def _read(self, stream: IO[str], copy: Path) -> None:
        with copy.open("a") as out:
            for line in stream:
                out.write(line)
                out.flush()
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                with self._changed:
                    self.events.append({**event, "at": time.monotonic()})
                    self._changed.notify_all()

    def mark(self) -> int:
        with self._changed:
            return len(self.events)

    def since(self, mark: int) -> list[Event]:
        with self._changed:
            return list(self.events[mark:])

    def wait(self, predicate: Callable[[Event], bool], since: int = 0, timeout: float = 60) -> Event:
        with self._changed:
            found = self._changed.wait_for(lambda: any(predicate(e) for e in self.events[since:]), timeout)
            if not found:
                raise TimeoutError("no such event")
            return next(e for e in self.events[since:] if predicate(e))


def named(name: str, **fields: Any) -> Callable[[Event], bool]:
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items())


class Run:
    """dpkubelet and the plugin, their logs under ``logs``."""

    def __init__(self, k8s: Path, work: Path):
        self.k8s, self.sockets, self.logs = k8s, work / "sockets", work / "logs"
        self.logs.mkdir(parents=True)
        self.profile, self.config = work / "node.yaml", work / "config.yaml"
        self.kubelet: subprocess.Popen[str] | None = None
        self.kubelet_log: JsonLines | None = None
        self.plugin: subprocess.Popen[str] | None = None
        self.plugin_log: JsonLines | None = None
        self.failures: list[str] = []

    def start_kubelet(self) -> float:
        self.kubelet = subprocess.Popen(
            [str(self.k8s / "bin" / "dpkubelet"), "--socket-dir", str(self.sockets), "--duration", "0",
             "--pods", "0"], stdout=subprocess.PIPE, stderr=(self.logs / "dpkubelet.klog").open("a"), text=True)
        assert self.kubelet.stdout is not None
        self.kubelet_log = JsonLines(self.kubelet.stdout, self.logs / "dpkubelet.jsonl")
        return float(self.kubelet_log.wait(named("kubelet_started"), timeout=30)["at"])

    def stop_kubelet(self) -> None:
        assert self.kubelet is not None
        self.kubelet.send_signal(signal.SIGTERM)
        self.kubelet.wait(10)

    def start_plugin(self) -> None:
        self.plugin = subprocess.Popen(
            [sys.executable, "-m", "labeller.cli", "--log-format", "json", "device-plugin", "--simulate",
             str(self.profile), "--config", str(self.config), "--socket-dir", str(self.sockets),
             "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
        assert self.plugin.stderr is not None
        self.plugin_log = JsonLines(self.plugin.stderr, self.logs / "plugin.jsonl")

    def readyz(self) -> int:
        assert self.plugin_log is not None
        port = self.plugin_log.wait(named("metrics server listening"))["port"]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def check(self, ok: bool, what: str) -> None:
        print(f"  [{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            self.failures.append(what)

    def stop(self) -> None:
        for proc in (self.plugin, self.kubelet):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def healthy(count: int) -> Callable[[Event], bool]:
    return lambda e: e.get("event") == "devices" and e.get("resource") == GPU and e.get("healthy") == count


def late_driver(run: Run) -> None:
    print("1. late driver: NVML missing at start, installed later, no SIGHUP")
    write_yaml(run.profile, l40s_node(2, nvml_error="library_not_found"))
    write_yaml(run.config, time_slicing(2))
    run.start_plugin()
    assert run.plugin_log is not None and run.kubelet_log is not None
    waits = [run.plugin_log.wait(named("driver not ready; probing again", attempt=n), timeout=30) for n in (1, 2, 3)]
    print(f"  plugin: {waits[0]['detail']}")
    print(f"  plugin retried after {', '.join(str(w['retry_in_s']) for w in waits)} s "
          f"(attempts 1-3; the next is due {waits[-1]['retry_in_s']} s after the third)")
    run.check(run.readyz() == 503, "/readyz is 503 while the driver is not ready")
    run.check(not any(e.get("event") == "plugin_registered" for e in run.kubelet_log.events),
              "nothing registered while waiting")
    mark = run.kubelet_log.mark()
    write_yaml(run.profile, l40s_node(2))
    written = time.monotonic()
    registered = run.kubelet_log.wait(named("plugin_registered", resource=GPU), since=mark)
    devices = run.kubelet_log.wait(healthy(4), since=mark)
    print(f"  profile rewritten -> plugin_registered {registered['at'] - written:.2f} s, "
          f"devices healthy=4 {devices['at'] - written:.2f} s")
    run.check(devices["at"] - written <= waits[-1]["retry_in_s"] + 2.0,
              "found by the next scheduled probe (within its backoff + 2 s)")
    run.check(run.readyz() == 200, "/readyz is 200 once registered")
    run.check(not any(e.get("event") == "signal received" for e in run.plugin_log.events), "no SIGHUP was sent")


def reload_same_name(run: Run) -> None:
    print("2. SIGHUP: time-slicing replicas 2 -> 4 under the same name")
    assert run.plugin is not None and run.kubelet_log is not None
    mark = run.kubelet_log.mark()
    write_yaml(run.config, time_slicing(4))
    run.plugin.send_signal(signal.SIGHUP)
    sent = time.monotonic()
    devices = run.kubelet_log.wait(healthy(8), since=mark)
    time.sleep(1.0)  # let any late event (a stream end, a registration) show up before judging
    events = run.kubelet_log.since(mark)
    for e in events:
        if e.get("event") in ("devices", "node_status", "plugin_registered", "plugin_stopped"):
            shown = {k: e[k] for k in ("resource", "healthy", "unhealthy", "registration", "allocatable",
                                       "capacity") if k in e}
            print(f"  dpkubelet +{e['at'] - sent:.3f}s {e['event']} {json.dumps(shown)}")
    allocatable = [e["allocatable"].get(GPU) for e in events if e.get("event") == "node_status"]
    run.check(all(e.get("healthy", 0) > 0 for e in events if e.get("event") == "devices" and e.get("resource") == GPU),
              "every devices event after the SIGHUP has healthy > 0")
    run.check(all(a not in (None, "0", 0) for a in allocatable),
              f"node_status allocatable {GPU} never 0: {allocatable}")
    run.check(not any(e.get("event") in ("plugin_registered", "plugin_stopped") for e in events),
              "no new registration and no stopped plugin")
    print(f"  SIGHUP -> devices healthy=8 in {devices['at'] - sent:.3f} s")


def kubelet_restarts(run: Run, restarts: int) -> None:
    print(f"3. kubelet restart x{restarts}: dpkubelet stopped and started again (it empties the socket dir)")
    times = []
    for _ in range(restarts):
        run.stop_kubelet()
        started = run.start_kubelet()
        assert run.kubelet_log is not None
        registered = run.kubelet_log.wait(named("plugin_registered", resource=GPU), timeout=10)
        devices = run.kubelet_log.wait(healthy(8), timeout=10)
        times.append((registered["at"] - started, devices["at"] - started))
    print("  kubelet_started -> plugin_registered: " + ", ".join(f"{r * 1000:.0f}" for r, _ in times) + " ms")
    print("  kubelet_started -> devices healthy=8:  " + ", ".join(f"{d * 1000:.0f}" for _, d in times) + " ms")
    healthy_s = [d for _, d in times]
    print(f"  median {statistics.median(healthy_s) * 1000:.0f} ms, max {max(healthy_s) * 1000:.0f} ms")
    run.check(max(d for _, d in times) <= 2.0, "re-registered with healthy devices within 2 s every time")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_k8s_argument(parser)
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="e2ec", dir="/tmp"))  # short: unix socket paths are limited
    run = Run(args.k8s, work)
    try:
        run.start_kubelet()
        late_driver(run)
        reload_same_name(run)
        kubelet_restarts(run, args.restarts)
    except TimeoutError as exc:
        run.check(False, f"timed out waiting: {exc}")
    finally:
        run.stop()
        print(f"logs: {run.logs}" if args.keep else "")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("PASS" if not run.failures else f"FAIL: {len(run.failures)} check(s)")
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
