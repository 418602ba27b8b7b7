"""Run benchmarks of two commits side by side, interleaved, and compare every figure they print.

Each pass runs every bench script once from each checkout, the order alternating from pass to pass
(base then this, this then base, ...), so a machine whose speed drifts slows both sides alike. Each
side runs its own copy of the script with ``PYTHONPATH`` set to its checkout and the same
interpreter. Every figure a script prints with a unit (ms, s, MiB, %) and every decimal in its
tables is paired with the same figure of the other side (the same line, numbers aside); the median
over the passes is compared. Lower is better except for rates (``/s``). Prints figures; it is not a
test. Exits 1 when a figure is worse by more than ``--within`` (default 10 %).

    python tests/bench/side_by_side.py --base 7951ffe [--passes 5] [--bench "dry_run --runs 10" ...]

``--base`` is a commit (checked out into a temporary worktree) or a directory holding a checkout.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BENCHES = (
    "dry_run --runs 10",
    "resourceslices --runs 10",
    "plugin --calls 1000 --restarts 5 --health 10 --idle 5",
    "dra --claims 300 --idle 5",
    "extender --calls 300",
)
UNIT_FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(ms|us|s|MiB|%|[\w ]*/s)(?![\w])")
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
IGNORED = re.compile(r"\((?:budget|made in)[^)]*\)|\bOVER BUDGET\b|\bok\b|\bload \d+(?:\.\d+)?")  # not our figures

Figure = tuple[str, int]  # a line's text with its numbers blanked, and the figure's place on it


def figures(output: str) -> dict[Figure, tuple[float, str]]:
    """Every figure in a bench's output: (line, index) -> (value, unit)."""
    found: dict[Figure, tuple[float, str]] = {}
    for raw in output.splitlines():
        line = IGNORED.sub("", raw)
        key = " ".join(NUMBER.sub("#", line).split())
        with_units = [(float(m.group(1)), m.group(2).strip()) for m in UNIT_FIGURE.finditer(line)]
        values = with_units or [(float(m.group(0)), "") for m in DECIMAL.finditer(line)]
        for index, value in enumerate(values):
            found[(key, index)] = value
    return found


def run_bench(checkout: Path, bench: str) -> tuple[str, float]:
    name, *args = shlex.split(bench)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not Path(p, "gpu-labeller").exists())  # run each checkout's own code
    start = time.monotonic()
    result = subprocess.run([sys.executable, f"tests/bench/bench_{name}.py", *args], cwd=checkout, env=env,
                            capture_output=True, text=True, timeout=900)
    return result.stdout + result.stderr, time.monotonic() - start


def base_checkout(base: str, scratch: Path) -> Path:
    if Path(base).is_dir():
        return Path(base).resolve()
    path = scratch / "base"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), base], check=True)
    return path


def compare(samples: dict[str, list[dict[Figure, tuple[float, str]]]], within: float) -> int:
    worse = 0
    shown: set[str] = set()
    for key in samples["this"][0]:
        base_values = [s[key][0] for s in samples["base"] if key in s]
        this_values = [s[key][0] for s in samples["this"] if key in s]
        if not base_values or len(this_values) != len(samples["this"]):
            continue
        unit = samples["this"][0][key][1]
        before, now = statistics.median(base_values), statistics.median(this_values)
        if before == now == 0:
            continue
        higher_is_better = unit.endswith("/s")
        ratio = (now / before if before else float("inf")) if not higher_is_better else (before / now if now else 0)
        verdict = "WORSE" if ratio > 1 + within else ""
        worse += bool(verdict)
        line = key[0] if key[0] not in shown else "  ..."
        shown.add(key[0])
        print(f"{line[:88]:88} [{key[1]}] {before:10.3f} -> {now:10.3f} {unit:6} {100 * (ratio - 1):+6.1f} % {verdict}")
    return worse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="a commit, or a directory holding a checkout")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--within", type=float, default=0.10)
    parser.add_argument("--bench", action="append", dest="benches", help="a bench name and its arguments")
    parser.add_argument("--keep", type=Path, help="write each run's output into this directory")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as scratch:
        base = base_checkout(options.base, Path(scratch))
        try:
            sides = {"base": base, "this": REPO}
            worse = 0
            for bench in options.benches or DEFAULT_BENCHES:
                samples: dict[str, list[dict[Figure, tuple[float, str]]]] = defaultdict(list)
                for number in range(options.passes):
                    order = ("base", "this") if number % 2 == 0 else ("this", "base")
                    for side in order:
                        output, seconds = run_bench(sides[side], bench)
                        samples[side].append(figures(output))
                        if options.keep:
                            options.keep.mkdir(parents=True, exist_ok=True)
                            (options.keep / f"{bench.split()[0]}-{side}-{number}.txt").write_text(output)
                        print(f"# {bench}: pass {number + 1} {side} {seconds:.0f} s", file=sys.stderr, flush=True)
                print(f"\n## {bench} (median of {options.passes} passes each: base {options.base} -> this checkout)")
                worse += compare(samples, options.within)
        finally:
            if base.parent == Path(scratch):
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    print(f"\n{worse} figure(s) worse by more than {100 * options.within:.0f} %")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
