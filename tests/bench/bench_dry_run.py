"""Benchmark: `gpu-labeller labels --simulate <profile>` (and `resources`) from a cold process.

Budget (issues 2 and 10): median wall time <= 0.5 s and peak RSS <= 40 MiB on a 2-core machine,
and neither the kubernetes client nor grpc is imported. Prints figures; it is not a test.

Two ways of running are measured, because compiling the sources is a large share of a cold start:
- "source": this checkout as it is; with PYTHONDONTWRITEBYTECODE set (as on the development
  machine), every run compiles gpu-labeller's modules again;
- "installed": with bytecode for every module the command imports, as a wheel install (the image)
  has it; the bytecode is written under a temporary PYTHONPYCACHEPREFIX, never into the checkout.

With ``--before DIR`` (another checkout, e.g. a worktree of an older commit) every run of this
checkout is followed by one of DIR's code (``PYTHONPATH=DIR``, same interpreter), the order swapped at
each run, so both see the same machine; each row then shows both and their ratio.

    python tests/bench/bench_dry_run.py [--runs 20] [--command labels --command resources] [--before DIR] [profile ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULT_PROFILES = ("dgx-h100", "dgx-a100-mig-mixed", "mi300x-x8-spx", "mi300x-x8-cpx")
WALL_BUDGET_S = 0.5
RSS_BUDGET_MIB = 40.0


def command(name: str, profile: str, env: dict[str, str]) -> list[str]:
    exe = None if "PYTHONPATH" in env else shutil.which("gpu-labeller")
    base = [exe] if exe else [sys.executable, "-m", "labeller.cli"]
    return [*base, name, "--simulate", profile]


def one_run(name: str, profile: str, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one cold process."""
    start = time.perf_counter()
    proc = subprocess.Popen(command(name, profile, env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            cwd=env.get("PYTHONPATH"))  # `-m` and `-c` put the cwd first on sys.path
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"{profile}: exit {proc.returncode}: {stderr.strip()}")
    return wall, usage.ru_maxrss / 1024  # Linux reports KiB


IMPORT_MAIN = (  # the CLI's entry, before and after it became a package
    "import sys\ntry: from labeller.cli.root import main\nexcept ImportError: from labeller.cli import main\n")


def compile_imports(name: str, profile: str, prefix: str, env: dict[str, str]) -> None:
    """Write bytecode under ``prefix`` for every module the command imports."""
    code = (
        IMPORT_MAIN +
        f"try: main([{name!r}, '--simulate', {profile!r}])\n"
        "except SystemExit: pass\n"
        "print('\\n'.join(f for m in list(sys.modules.values()) if (f := getattr(m, '__file__', None))"
        " and f.endswith('.py')), file=sys.stderr)"
    )
    files = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=env, cwd=env.get("PYTHONPATH")).stderr.split()
    subprocess.run([sys.executable, "-m", "py_compile", *files], env={**env, "PYTHONPYCACHEPREFIX": prefix},
                   check=True)


def heavy_imported(name: str, profile: str, env: dict[str, str]) -> bool:
    """Whether the kubernetes client or grpc was imported."""
    code = (
        IMPORT_MAIN +
        f"try: main([{name!r}, '--simulate', {profile!r}])\n"
        "except SystemExit: pass\n"
        "print('kubernetes' in sys.modules or 'grpc' in sys.modules, file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                            cwd=env.get("PYTHONPATH"))
    return result.stderr.strip().splitlines()[-1] == "True"


def measure(name: str, profile: str, envs: list[dict[str, str]], runs: int) -> list[list[tuple[float, float]]]:
    """``runs`` cold processes for each env, interleaved (the order swapped at each run)."""
    for env in envs:
        one_run(name, profile, env)  # warm the page cache, not the process
    results: list[list[tuple[float, float]]] = [[] for _ in envs]
    for number in range(runs):
        order = list(range(len(envs)))
        for side in order if number % 2 == 0 else order[::-1]:
            results[side].append(one_run(name, profile, envs[side]))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--command", action="append", choices=("labels", "resources"), dest="commands")
    parser.add_argument("--before", type=os.path.abspath, help="another checkout, run interleaved with this one")
    parser.add_argument("profiles", nargs="*", default=list(DEFAULT_PROFILES))
    args = parser.parse_args()
    commands = args.commands or ["labels", "resources"]
    checkouts = {"this": dict(os.environ)}
    if args.before:
        checkouts = {"this": {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))}, "before": {**os.environ, "PYTHONPATH": args.before}}
        print(f"before: {args.before}")
    print(f"cold `gpu-labeller <command> --simulate <profile>`, {args.runs} runs each, {os.cpu_count()} CPUs")
    print(f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
    print(f"{'command':<10} {'profile':<22} {'mode':<10} {'code':<7} {'median s':>9} {'p90 s':>7} {'max RSS MiB':>12} "
          f"{'k8s/grpc':>9}  verdict")
    worst = 0
    for name in commands:
        for profile in args.profiles:
            with tempfile.TemporaryDirectory() as scratch:
                heavy, installed = {}, {}
                for side, env in checkouts.items():
                    heavy[side] = heavy_imported(name, profile, env)
                    prefix = os.path.join(scratch, side)
                    compile_imports(name, profile, prefix, env)
                    installed[side] = {**env, "PYTHONPYCACHEPREFIX": prefix}
                for mode in ("source", "installed"):
                    envs = list(checkouts.values()) if mode == "source" else list(installed.values())
                    medians = []
                    for side, runs in zip(checkouts, measure(name, profile, envs, args.runs)):
                        walls = sorted(w for w, _ in runs)
                        rss = max(r for _, r in runs)
                        median = statistics.median(walls)
                        medians.append(median)
                        p90 = walls[int(0.9 * (len(walls) - 1))]
                        ok = median <= WALL_BUDGET_S and rss <= RSS_BUDGET_MIB and not heavy[side]
                        worst |= not ok and side == "this"
                        print(f"{name:<10} {profile:<22} {mode:<10} {side:<7} {median:>9.3f} {p90:>7.3f} "
                              f"{rss:>12.1f} {str(heavy[side]):>9}  {'ok' if ok else 'OVER BUDGET'}")
                    if len(medians) == 2:
                        ratio = medians[0] / medians[1]
                        print(f"{name:<10} {profile:<22} {mode:<10} this/before median ratio {ratio:.3f}")
    print(f"budget: median <= {WALL_BUDGET_S} s, peak RSS <= {RSS_BUDGET_MIB} MiB, "
          "neither kubernetes nor grpc imported")
    return worst


if __name__ == "__main__":
    sys.exit(main())
