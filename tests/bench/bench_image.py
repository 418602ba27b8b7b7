"""The image's size and the cold start of `labels` in its container, as built and with the other bytecode choices.

    .ci/image bench [--runs 7]     # builds the image first if needed; or, with podman set up as .ci/image does:
    python tests/bench/bench_image.py --image localhost/gpu-labeller:0.1.0 [--runs 7]

Prints the project's layers above the base, the .pyc files the image holds, and for three images: the one
built (what the Dockerfile compiles), one with no .pyc at all and one with every module compiled (both made
here from the built one, then removed). For each: a fresh container's `labels --simulate dgx-h100` (podman
run to exit, read-only root filesystem as the chart runs it), the same command as fresh processes inside one
container (wall and CPU: the interpreter's start without podman's), and importing every labeller module (as
a daemon's start does) inside the container. With a read-only root filesystem and PYTHONDONTWRITEBYTECODE, a
module without its .pyc is compiled at every start. Runs interleave the images; medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.e2e_image import PROFILE, CheckFailed, container, in_image, layer_sizes, podman, project_size  # noqa: E402

VARIANTS = {
    "no .pyc": "RUN find /opt/gpu-labeller -name '*.pyc' -delete",
    "every .pyc": "RUN python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/gpu-labeller/lib",
}
IN_CONTAINER = """
import json, resource, statistics, subprocess, sys, time
def timed(command):
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - start, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
runs = int(sys.argv[2])
labels = [timed(["gpu-labeller", "labels", "--simulate", sys.argv[1]]) for _ in range(runs)]
imports = [timed(["python", "-c", "import importlib, pkgutil, labeller\\n"
                  "for m in pkgutil.walk_packages(labeller.__path__, 'labeller.'):\\n"
                  "    m.name.endswith('.__main__') or importlib.import_module(m.name)"])
           for _ in range(runs)]
median = lambda values, i: statistics.median(v[i] for v in values)
print(json.dumps({"labels_wall": median(labels, 0), "labels_cpu": median(labels, 1),
                  "import_wall": median(imports, 0), "import_cpu": median(imports, 1)}))
"""
PYC = """
import json, os, sys
count = size = 0
for folder, _, files in os.walk(sys.prefix):
    for name in files:
        if name.endswith(".pyc"):
            count += 1
            size += os.path.getsize(os.path.join(folder, name))
print(json.dumps({"count": count, "bytes": size}))
"""


def derived(image: str, name: str, instruction: str) -> str:
    """An image made from ``image`` by one RUN as root; its tag."""
    tag = f"localhost/gpu-labeller-bench:{name.replace(' ', '-').replace('.', '')}"
    containerfile = f"FROM {image}\nUSER 0\n{instruction}\nUSER 65532:65532\n"
    result = subprocess.run(["podman", "build", "--quiet", "--network=none", "-t", tag, "-f", "-", str(ROOT / "tests")],
                            input=containerfile, capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        raise CheckFailed(f"podman build {tag}: {result.stderr.strip()[-200:]}")
    return tag


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    images = {"as built": args.image}
    try:
        for name, instruction in VARIANTS.items():
            images[name] = derived(args.image, name, instruction)
        walls: dict[str, list[float]] = {name: [] for name in images}
        for _ in range(args.runs):  # interleaved: the machine's load changes under the runs
            for name, image in images.items():
                start = time.perf_counter()
                result = container(image, "labels", "--simulate", PROFILE)
                walls[name].append(time.perf_counter() - start)
                if result.returncode != 0:
                    raise CheckFailed(f"{name}: labels exited {result.returncode}")
        print(f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}, {args.runs} runs each")
        print("| image | project layers (built so) | .pyc files | fresh container, labels (wall) "
              "| labels in the container (wall / CPU) | import every labeller module (wall / CPU) |")
        print("|---|---|---|---|---|---|")
        built_pyc = in_image(args.image, PYC)["bytes"]
        for name, image in images.items():
            pyc = in_image(image, PYC)
            # the variants are a layer on the built image: their size is computed as a build would make them
            project = project_size(args.image)[0] - built_pyc + pyc["bytes"]
            inside = in_image(image, IN_CONTAINER, PROFILE, str(args.runs))
            print(f"| {name} | {project / 1e6:.1f} MB | {pyc['count']} ({pyc['bytes'] / 1e6:.1f} MB) "
                  f"| {statistics.median(walls[name]):.2f} s "
                  f"| {inside['labels_wall']:.2f} / {inside['labels_cpu']:.2f} s "
                  f"| {inside['import_wall']:.2f} / {inside['import_cpu']:.2f} s |")
        print(f"layers of {args.image}: {layer_sizes(args.image)}")
    except CheckFailed as exc:
        print(f"bench_image: {exc}", file=sys.stderr)
        return 1
    finally:
        for image in images.values():
            if image != args.image:
                podman("image", "rm", "--force", image, timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(main())
