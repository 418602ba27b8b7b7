"""Benchmark: checking a config is linear in its size, and a config whose offer the kubelet could not
take is refused before any device is built. Prints figures; not a test.

1. A ``devices:`` list of 1k, 10k and 100k entries: the time ``load_config`` takes as shipped (lists
   over MAX_DEVICE_REFS are refused at their length), and the time the checks of every entry take
   with that bound lifted, which shows they grow linearly (a ``refs.count`` per entry made 100k
   entries take over 60 s).
2. ``replicas: 1000000`` (14.6 s and 2.09 GB before the bound): load time as shipped.
3. ``sharing.memory.unit: MiB`` on 8 H100s (652,472 devices, 969 MB peak RSS before): the real
   ``gpu-labeller resources`` process, its wall time and peak RSS, beside the same with GiB.

    python tests/bench/bench_config_limits.py
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from labeller import config as config_module  # noqa: E402
from labeller.model.config import ConfigError, load_config, parse_config  # noqa: E402
from vendors import RESOURCE_NAMES  # noqa: E402

SIZES = (1_000, 10_000, 100_000)


def time_it(call: Callable[[], object]) -> tuple[float, str]:
    """Seconds ``call()`` took, and how it ended ("ok" or the end of its ConfigError)."""
    started = time.perf_counter()
    try:
        call()
        outcome = "ok"
    except ConfigError as exc:
        outcome = f"refused: ...{str(exc)[-60:]}"
    return time.perf_counter() - started, outcome


def devices_document(entries: int) -> dict[str, object]:
    refs = list(range(entries))  # GPU indices, as in the report: 100k of them are about 600 KB of YAML
    return {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "nvidia.com/gpu", "replicas": 2, "devices": refs}]}}}


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def cli_run(*args: str) -> tuple[float, float, int, str]:
    """(wall seconds, peak RSS MiB, exit code, last stderr line) of one ``gpu-labeller`` process."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "labeller.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (time.perf_counter() - started, usage.ru_maxrss / 1024, proc.returncode,
            (stderr.strip().splitlines() or [""])[-1])


def main() -> None:
    print(f"bounds: replicas <= {config_module.MAX_REPLICAS}, devices <= {config_module.MAX_DEVICE_REFS} entries, "
          f"resources <= {config_module.MAX_SHARED_RESOURCES} entries")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        print("\n1. devices list: load_config as shipped | the checks of every entry, bound lifted")
        for entries in SIZES:
            document = devices_document(entries)
            path = write(directory, f"devices-{entries}.yaml", yaml.safe_dump(document, default_flow_style=None))
            shipped, outcome = time_it(functools.partial(load_config, path, RESOURCE_NAMES))
            bound = config_module.MAX_DEVICE_REFS
            config_module.MAX_DEVICE_REFS = entries
            try:
                lifted, lifted_outcome = time_it(functools.partial(parse_config, document, RESOURCE_NAMES))
            finally:
                config_module.MAX_DEVICE_REFS = bound
            print(f"  {entries:>7} entries ({path.stat().st_size // 1024:>5} KiB): shipped {shipped * 1000:8.1f} ms "
                  f"({outcome})\n{'':33}| checks {lifted * 1000:8.1f} ms ({lifted_outcome}), "
                  f"{lifted / entries * 1e6:.2f} us/entry")

        print("\n2. replicas: 1000000")
        replicas = write(directory, "replicas.yaml", "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                                     "    - {name: nvidia.com/gpu, replicas: 1000000}\n")
        seconds, outcome = time_it(lambda: load_config(replicas, RESOURCE_NAMES))
        print(f"  load_config {seconds * 1000:.1f} ms: {outcome}")

        print("\n3. memory sharing on dgx-h100 (8 x 81559 MiB), `gpu-labeller resources` process")
        for unit in ("GiB", "MiB"):
            path = write(directory, f"memory-{unit}.yaml", f"version: v1\nsharing:\n  memory:\n    unit: {unit}\n")
            wall, rss, code, last = cli_run("resources", "--simulate", "dgx-h100", "--config", str(path))
            print(f"  unit {unit}: exit {code}, {wall:.2f} s, peak RSS {rss:.0f} MiB"
                  + (f"\n    {last}" if code else ""))


if __name__ == "__main__":
    main()
