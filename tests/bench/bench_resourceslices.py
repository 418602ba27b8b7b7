"""Benchmark: `gpu-labeller resourceslices` against `gpu-labeller labels`, cold processes, same profiles.

Budget (issue 20): `resourceslices` as fast as `labels`: its median wall time at most 10 % above
labels' on the same profile, neither imports the kubernetes client nor grpc. The two commands run
interleaved (labels, resourceslices, labels, ...), so a machine whose speed drifts slows both alike.
`resourceslices` runs with `--dra-vendors all`: every device of the node is derived and printed.
Prints figures; it is not a test.

    python tests/bench/bench_resourceslices.py [--runs 20] [profile ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

DEFAULT_PROFILES = ("dgx-h100", "dgx-a100-mig-mixed", "mi300x-x8-spx", "mi300x-x8-cpx")
SLOWER_BY_AT_MOST = 1.10
COMMANDS = {
    "labels": ["labels"],
    "resourceslices": ["resourceslices", "--dra-vendors", "all", "--node-name", "bench"],
}


def argv(command: str, profile: str) -> list[str]:
    exe = shutil.which("gpu-labeller")
    return [*([exe] if exe else [sys.executable, "-m", "labeller.cli"]), *COMMANDS[command], "--simulate", profile]


def one_run(command: str, profile: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one cold process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv(command, profile), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{command} {profile}: {(proc.stderr.read() if proc.stderr else b'').decode().strip()}")
    return wall, usage.ru_maxrss / 1024  # Linux reports KiB


def heavy_imported(command: str, profile: str) -> bool:
    code = ("import sys; from labeller.cli.root import main\n"
            f"try: main({[*COMMANDS[command], '--simulate', profile]!r})\n"
            "except SystemExit: pass\n"
            "print(any(m.split('.')[0] in ('kubernetes', 'grpc') for m in sys.modules), file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return result.stderr.strip().splitlines()[-1] == "True"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("profiles", nargs="*", default=list(DEFAULT_PROFILES))
    args = parser.parse_args()
    print(f"cold runs, interleaved, {args.runs} each, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'profile':<22} {'command':<15} {'median s':>9} {'p90 s':>7} {'max RSS MiB':>12} {'k8s/grpc':>9}")
    worst = 0
    for profile in args.profiles:
        for command in COMMANDS:
            one_run(command, profile)  # warm the page cache, not the process
        runs: dict[str, list[tuple[float, float]]] = {command: [] for command in COMMANDS}
        for _ in range(args.runs):
            for command in COMMANDS:
                runs[command].append(one_run(command, profile))
        medians = {}
        for command, measured in runs.items():
            walls = sorted(w for w, _ in measured)
            medians[command] = statistics.median(walls)
            heavy = heavy_imported(command, profile)
            worst |= heavy
            print(f"{profile:<22} {command:<15} {medians[command]:>9.3f} {walls[int(0.9 * (len(walls) - 1))]:>7.3f} "
                  f"{max(r for _, r in measured):>12.1f} {str(heavy):>9}")
        ratio = medians["resourceslices"] / medians["labels"]
        worst |= ratio > SLOWER_BY_AT_MOST
        print(f"{profile:<22} {'ratio':<15} {ratio:>9.2f}  {'ok' if ratio <= SLOWER_BY_AT_MOST else 'OVER BUDGET'}")
    print(f"budget: resourceslices median <= {SLOWER_BY_AT_MOST:.2f} x labels', neither kubernetes nor grpc imported")
    return worst


if __name__ == "__main__":
    sys.exit(main())
