"""Benchmark: `gpu-labeller labels --simulate <profile>` from a cold process.

Budget (issue 2): median wall time <= 0.5 s and peak RSS <= 40 MiB on a 2-core machine, and the
kubernetes client is never imported. Prints figures; it is not a test.

    python tests/bench/bench_dry_run.py [--runs 20] [profile ...]
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
WALL_BUDGET_S = 0.5
RSS_BUDGET_MIB = 40.0


def command(profile: str) -> list[str]:
    exe = shutil.which("gpu-labeller")
    base = [exe] if exe else [sys.executable, "-m", "labeller.cli"]
    return [*base, "labels", "--simulate", profile]


def one_run(profile: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one cold process."""
    start = time.perf_counter()
    proc = subprocess.Popen(command(profile), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"{profile}: exit {proc.returncode}: {stderr.strip()}")
    return wall, usage.ru_maxrss / 1024  # Linux reports KiB


def kubernetes_imported(profile: str) -> bool:
    code = (
        "import sys; from labeller.cli import main\n"
        f"try: main(['labels', '--simulate', {profile!r}])\n"
        "except SystemExit: pass\n"
        "print('kubernetes' in sys.modules, file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return result.stderr.strip().splitlines()[-1] == "True"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("profiles", nargs="*", default=list(DEFAULT_PROFILES))
    args = parser.parse_args()
    print(f"cold `gpu-labeller labels --simulate <profile>`, {args.runs} runs each, {os.cpu_count()} CPUs")
    print(f"{'profile':<22} {'median s':>9} {'p90 s':>7} {'max RSS MiB':>12} {'kubernetes':>11}  verdict")
    worst = 0
    for profile in args.profiles:
        one_run(profile)  # warm the page cache, not the process
        runs = [one_run(profile) for _ in range(args.runs)]
        walls = sorted(w for w, _ in runs)
        rss = max(r for _, r in runs)
        median = statistics.median(walls)
        p90 = walls[int(0.9 * (len(walls) - 1))]
        k8s = kubernetes_imported(profile)
        ok = median <= WALL_BUDGET_S and rss <= RSS_BUDGET_MIB and not k8s
        worst |= not ok
        print(f"{profile:<22} {median:>9.3f} {p90:>7.3f} {rss:>12.1f} {str(k8s):>11}  {'ok' if ok else 'OVER BUDGET'}")
    print(f"budget: median <= {WALL_BUDGET_S} s, peak RSS <= {RSS_BUDGET_MIB} MiB, kubernetes never imported")
    return worst


if __name__ == "__main__":
    sys.exit(main())
