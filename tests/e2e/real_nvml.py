"""gpu-labeller's NVIDIA backend against a real GPU and its real NVML: run by hand on a machine with an
NVIDIA GPU (CI has none). Read-only: it changes no GPU setting (no MIG mode, no compute policy, no MPS
daemon; the DRA plugin's tools are the test stand-ins in tests/fakes/bin).

    python tests/e2e/real_nvml.py --out DIR

Writes to DIR what the machine said, to keep as a fixture (tests/fixtures/nvidia/<machine>/):
  nvml.json            every NVML query the backend makes, per GPU: its value or the NVML error's name
  nvidia-smi-q.txt     ``nvidia-smi -q``, the driver's own account
  probe.json, labels.json, resources.json, resourceslices.json   the CLI's dry runs (default config)
  labels-ts.json, resources-ts.json   the same with time-slicing, 4 replicas
  device-plugin.json   what the kubelet emulator saw: registration, devices, one Allocate
  dra.json             the DRA plugin's slices (fake API server) and one claim's prepare and CDI spec
and prints PASS/FAIL lines and figures (probe and start-up times).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.draplane import check, figure, results  # noqa: E402

def step(name: str, body: Callable[[], None]) -> None:
    print(name, flush=True)
    try:
        body()
    except Exception as exc:  # noqa: BLE001  one step's failure is reported, the others still run
        check(False, f"{name}: {type(exc).__name__}: {exc}")


def save(out: Path, name: str, value: Any) -> None:
    (out / name).write_text(value if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True,
                                                                            default=str) + "\n")


# --- 1. every NVML query the backend makes, as NVML answers it ---------------------------------------

def nvml_capture(n: Any) -> dict[str, Any]:
    from vendors.nvidia import nvml as backend  # the calls as the backend makes them

    def plain(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.decode(errors="replace")
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if hasattr(value, "_fields_"):
            return {field[0]: plain(getattr(value, field[0])) for field in value._fields_}
        if hasattr(value, "_length_"):  # a ctypes array
            return [plain(v) for v in value]
        return value

    def answer(call: Callable[..., Any], *args: Any) -> Any:
        try:
            return plain(call(*args))
        except Exception as exc:  # noqa: BLE001  NVMLError_NotSupported and the like: the answer to keep
            return {"nvml_error": type(exc).__name__, "text": str(exc)}

    def ask(name: str, *args: Any) -> Any:
        call = getattr(n, name, None)
        return {"missing": name} if call is None else answer(call, *args)

    def events(handle: Any) -> dict[str, Any]:
        """The health check's event set on this GPU: registered for what it watches, one wait."""
        wanted = (n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError
                  | n.nvmlEventTypeSingleBitEccError)
        said: dict[str, Any] = {"asked": wanted}
        event_set = n.nvmlEventSetCreate()
        try:
            said["register"] = answer(lambda: n.nvmlDeviceRegisterEvents(handle, wanted, event_set) or "ok")
            began = time.monotonic()
            said["wait_1s"] = answer(lambda: n.nvmlEventSetWait(event_set, 1000))
            said["waited_s"] = round(time.monotonic() - began, 3)
        finally:
            n.nvmlEventSetFree(event_set)
        return said

    n.nvmlInit()
    try:
        count = n.nvmlDeviceGetCount()
        system = {"driver_version": ask("nvmlSystemGetDriverVersion"),
                  "cuda_driver_version": ask("nvmlSystemGetCudaDriverVersion"),
                  "nvml_version": ask("nvmlSystemGetNVMLVersion"),
                  "pynvml": getattr(n, "__version__", None), "count": count}
        gpus = []
        for index in range(count):
            h = n.nvmlDeviceGetHandleByIndex(index)
            gpu: dict[str, Any] = {"index": index}
            for key, name in [("name", "nvmlDeviceGetName"), ("brand", "nvmlDeviceGetBrand"),
                              ("uuid", "nvmlDeviceGetUUID"), ("minor", "nvmlDeviceGetMinorNumber"),
                              ("pci", "nvmlDeviceGetPciInfo"), ("memory", "nvmlDeviceGetMemoryInfo"),
                              ("compute_capability", "nvmlDeviceGetCudaComputeCapability"),
                              ("architecture", "nvmlDeviceGetArchitecture"), ("mig_mode", "nvmlDeviceGetMigMode"),
                              ("max_mig_devices", "nvmlDeviceGetMaxMigDeviceCount"),
                              ("virtualization_mode", "nvmlDeviceGetVirtualizationMode"),
                              ("supported_event_types", "nvmlDeviceGetSupportedEventTypes"),
                              ("attributes", "nvmlDeviceGetAttributes"),
                              ("addressing_mode", "nvmlDeviceGetAddressingMode")]:
                gpu[key] = ask(name, h)
            gpu["fabric"] = answer(backend._fabric_info, n, h)
            gpu["events"] = answer(events, h)
            gpu["nvlink_state"] = {str(link): ask("nvmlDeviceGetNvLinkState", h, link) for link in range(18)}
            profiles = {}
            for profile in range(getattr(n, "NVML_GPU_INSTANCE_PROFILE_COUNT", 14)):
                info = answer(backend._versioned, n, n.nvmlDeviceGetGpuInstanceProfileInfo, h, profile)
                entry = {"info": info}
                if isinstance(info, dict) and "id" in info:
                    entry["placements"] = answer(backend.placements, n, h, info["id"])
                profiles[str(profile)] = entry
            gpu["gpu_instance_profiles"] = profiles
            gpus.append(gpu)
        return {"system": system, "gpus": gpus}
    finally:
        n.nvmlShutdown()


# --- 2. the CLI's dry runs ------------------------------------------------------------------------------

SIMULATE: list[str] = []  # --simulate PROFILE: the script tried out on a machine without a GPU


def cli(*args: str, config: Path | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "labeller.cli", *args, *SIMULATE,
                           *(["--config", str(config)] if config else [])],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done, time.monotonic() - began


def dry_runs(out: Path, work: Path) -> None:
    outputs: dict[str, Any] = {}
    for name, args in [("probe", ["probe"]), ("labels", ["labels", "--format", "json"]),
                       ("resources", ["resources", "--format", "json"]),
                       ("resourceslices", ["resourceslices", "--format", "json", "--node-name", "gpu-node",
                                           "--dra-vendors", "all"])]:
        done, took = cli(*args)
        check(done.returncode == 0, f"{name}: exit {done.returncode} in {took:.2f} s {done.stderr.strip()[-300:]}")
        figure(f"gpu-labeller {name}: {took:.2f} s wall")
        save(out, f"{name}.json", done.stdout)
        outputs[name] = done.stdout
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    figure(f"peak RSS of a dry run: {rss:.1f} MiB")
    labels = json.loads(outputs["labels"])
    print("  labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())), flush=True)
    check(labels.get("nvidia.com/gpu.present") == "true" and int(labels.get("nvidia.com/gpu.count", "0")) >= 1,
          "nvidia.com/gpu.present and gpu.count")
    ts = work / "ts.yaml"
    ts.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
                  "      replicas: 4\n")
    for name, args in [("labels-ts", ["labels", "--format", "json"]),
                       ("resources-ts", ["resources", "--format", "json"])]:
        done, _ = cli(*args, config=ts)
        check(done.returncode == 0, f"{name}: exit {done.returncode} {done.stderr.strip()[-300:]}")
        save(out, f"{name}.json", done.stdout)
    shared = json.loads((out / "labels-ts.json").read_text())
    check(shared.get("nvidia.com/gpu.replicas") == "4" and shared.get("nvidia.com/gpu.product", "").endswith("-SHARED"),
          f"time-slicing: gpu.replicas {shared.get('nvidia.com/gpu.replicas')}, "
          f"gpu.product {shared.get('nvidia.com/gpu.product')}")


def probe_times() -> None:
    from labeller.host.machine import open_host
    times = []
    with open_host(node_options()) as host:
        for _ in range(20):
            began = time.perf_counter()
            host.probe()
            times.append((time.perf_counter() - began) * 1000)
    times.sort()
    figure(f"in-process probe of this node, 20 runs: median {statistics.median(times):.1f} ms, "
           f"max {times[-1]:.1f} ms, first {times[0]:.1f} ms sorted-min")


# --- 3. the device plugin, as the kubelet emulator sees it ----------------------------------------------

def device_plugin(out: Path, work: Path) -> None:
    from tests.fakes.kubelet import FakeKubelet
    sockets, cdi = work / "dp", work / "dp-cdi"
    sockets.mkdir()
    cdi.mkdir()
    said: dict[str, Any] = {}
    with FakeKubelet(sockets) as kubelet:
        began = time.monotonic()
        log = open(work / "device-plugin.log", "w")
        plugin = subprocess.Popen([sys.executable, "-m", "labeller.cli", "--log-format", "json", "device-plugin",
                                   *SIMULATE, "--socket-dir", str(sockets), "--cdi-spec-dir", str(cdi),
                                   "--metrics-port", "0"],
                                  cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            up = kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") > 0, 60)
            took = time.monotonic() - began
            check(up, f"registered nvidia.com/gpu and listed healthy devices ({took:.2f} s after start)")
            figure(f"device-plugin start -> devices Healthy at the kubelet: {took:.2f} s")
            said["devices"] = kubelet.devices("nvidia.com/gpu")
            response, ids = kubelet.admit("nvidia.com/gpu", [1])
            from google.protobuf.json_format import MessageToDict
            said["allocate"] = {"ids": ids, "response": MessageToDict(response)}
            check(len(ids[0]) == 1, f"Allocate of one GPU: {ids}")
            time.sleep(3)  # a look at the health watch running on the real GPU (its log lines below)
        finally:
            plugin.terminate()
            plugin.wait(30)
            log.close()
    said["log"] = (work / "device-plugin.log").read_text().splitlines()
    said["cdi_specs"] = {p.name: p.read_text() for p in sorted(cdi.iterdir())}
    check(plugin.returncode == 0, f"device-plugin exited {plugin.returncode} on SIGTERM")
    save(out, "device-plugin.json", said)
    for line in said["log"]:
        if any(word in line for word in ("health", "event", "warning", "error")):
            print("   log: " + line[:300], flush=True)


# --- 4. the DRA plugin: slices and one claim prepared ---------------------------------------------------

def dra(out: Path, work: Path) -> None:
    from labeller.host.machine import open_host
    from tests.draplugin.conftest import Dirs, NVIDIA, dra_config, running_plugin
    from tests.fakes.apiserver import FakeApiServer
    from tests.fakes.drakubelet import FakeDraKubelet
    from tests.plugin.profile_files import write_yaml
    dirs = Dirs(work / "reg", work / "plugins", work / "cdi", work / "mps")
    config = work / "dra.yaml"
    write_yaml(config, dra_config("nvidia"))
    said: dict[str, Any] = {}
    began = time.monotonic()
    with FakeApiServer() as api, FakeDraKubelet(dirs.registry) as kubelet, \
            open_host(node_options(config_path=config)) as host, \
            running_plugin(api, kubelet, dirs, host, config_path=config) as run:
        figure(f"dra-plugin start -> registered and slices written: {time.monotonic() - began:.2f} s")
        said["slices"] = run.slices()
        devices = run.devices()
        check(bool(devices), f"published devices: {devices}")
        claim = run.claim("real-gpu", devices[0])
        answer = kubelet.prepare("pod-1", [claim])
        from google.protobuf.json_format import MessageToDict
        said["prepare"] = {uid: MessageToDict(a) for uid, a in answer.items()}
        ok = all(not a.error for a in answer.values())
        check(ok, f"claim for {devices[0]} prepared: {said['prepare']}")
        said["cdi_specs"] = {p.name: p.read_text() for p in sorted(dirs.cdi.iterdir())}
        unprepared = kubelet.unprepare("pod-1", [claim])
        check(all(not a.error for a in unprepared.values()), "unprepared")
        check(not any(dirs.cdi.iterdir()), "its CDI spec removed")
        said["driver"] = NVIDIA
    save(out, "dra.json", said)


def node_options(**fields: Any) -> Any:
    from labeller.host.machine import NodeOptions
    return NodeOptions(simulate=SIMULATE[1] if SIMULATE else None, **fields)


def nvml_module() -> Any:
    if not SIMULATE:
        import pynvml
        return pynvml
    from labeller.host.machine import open_host
    with open_host(node_options()) as host:  # the simulated pynvml outlives the host for this
        return host.handles["nvidia"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--simulate", metavar="PROFILE", help="a simulated node instead of this machine's GPUs")
    args = parser.parse_args()
    if args.simulate:
        SIMULATE.extend(["--simulate", args.simulate])
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="nvml-", dir="/tmp"))
    smi = shutil.which("nvidia-smi")
    if smi:
        save(out, "nvidia-smi-q.txt", subprocess.run([smi, "-q"], capture_output=True, text=True, timeout=60).stdout)
    step("1. every NVML query the backend makes", lambda: save(out, "nvml.json", nvml_capture(nvml_module())))
    step("2. the CLI's dry runs", lambda: dry_runs(out, work))
    step("2b. probe times", probe_times)
    step("3. device plugin and the kubelet emulator", lambda: device_plugin(out, work))
    step("4. DRA plugin, fake API server, kubelet DRA stand-in", lambda: dra(out, work))
    failed = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed)} checks passed, {len(failed)} failed; os {os.uname().release}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
