"""The built image, checked as a user and the chart run it. Not a test: `.ci/image` runs it after the build.

    python tests/e2e/e2e_image.py --image IMAGE [--name localhost/gpu-labeller:0.1.0]

Needs podman (with the containers.conf `.ci/image` writes on this machine: `.ci/image check` runs this) and
the project installed in this interpreter: the image's output is compared with this checkout's CLI. Every
container runs as the chart runs its pods (read-only root filesystem, every capability dropped, no new
privileges, no network but where it must reach the fake API server on 127.0.0.1), is named, and is removed.

Checks: the entrypoint, default command, user and version label; `--version` and `labels --simulate
dgx-h100` byte for byte as this checkout's CLI; the uid the processes run as (65532, not root); the
default command's one-line error without a node name; the installed distributions exactly the closure of
gpu-labeller's requirements as locked in deploy/image/requirements.lock (no pip, no setuptools, no
kubernetes.aio stack), each of them imported by gpu-labeller; every module gpu-labeller imports compiled
(.pyc, unchecked-hash: nothing is compiled at start); `run --once` labels a Node of the fake API server
through the image's Kubernetes client as `labels` says; the project's layers within the size budget.
Prints each check, the sizes and the cold start of `labels`; exits 1 with one line naming the first
failure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.deploy import load_lock_script  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402

PROFILE = "dgx-h100"
UID = 65532
LAYER_BUDGET_BYTES = 120_000_000  # the project's layers, above the base: 120 MB as podman prints sizes
TIMEOUT_S = 600  # one container; generous: the CI box is shared and loaded
# Distributions the processes import only when they need them, not when gpu-labeller's modules load.
ON_DEMAND = {"nvidia-ml-py": "pynvml: NVML, on a node with NVIDIA's driver",
             "tzdata": "time zone data, read by python-dateutil when the system has none"}
# What the Kubernetes client requires beyond its configuration and REST layer: its own kubeconfig loader and the
# generated API it builds on, loaded only for a kubeconfig labeller/cluster/kubeconfig.py does not read itself
# (exec credentials, an auth provider); websocket-client is kubernetes.stream's, required but never loaded.
ON_DEMAND |= {name: "the Kubernetes client's kubeconfig loader, for exec credentials or an auth provider"
              for name in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "python-dateutil",
                           "certifi", "requests", "charset-normalizer", "idna", "requests-oauthlib", "oauthlib",
                           "websocket-client")}
CHART_RUNTIME = ["--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges"]

lock = load_lock_script()
names = (f"gpu-labeller-image-check-{os.getpid()}-{n}" for n in itertools.count())
started: list[str] = []
results: list[tuple[bool, str]] = []


class CheckFailed(Exception):
    """One line: what the image does that it should not."""


def podman(*args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


def container(image: str, *args: str, entrypoint: str | None = None, network: str = "none",
              volumes: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``image`` to completion as the chart runs it; the container is removed."""
    name = next(names)
    started.append(name)
    options = ["run", "--rm", "--name", name, f"--network={network}", *CHART_RUNTIME]
    options += [f"--entrypoint={entrypoint}"] if entrypoint else []
    options += [option for volume in volumes for option in ("-v", volume)]
    return podman(*options, image, *args)


def in_image(image: str, code: str, *args: str) -> Any:
    """Run Python ``code`` in the image; it prints one JSON document, returned."""
    result = container(image, "-c", code, *args, entrypoint="python")
    if result.returncode != 0:
        raise CheckFailed(f"python in the image failed: {last_line(result.stderr)}")
    return json.loads(result.stdout)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing on stderr)"


def venv_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """This checkout's CLI, from the interpreter running this script."""
    return subprocess.run([sys.executable, "-c", "from labeller.cli.main import main; main()", *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def check(title: str, run: Callable[[], str | None]) -> None:
    try:
        detail = run()
    except CheckFailed as exc:
        results.append((False, f"{title}: {exc}"))
        print(f"FAIL  {title}: {exc}", flush=True)
        return
    results.append((True, title))
    print(f"ok    {title}" + (f" ({detail})" if detail else ""), flush=True)


def inspect(image: str) -> dict[str, Any]:
    result = podman("image", "inspect", image)
    if result.returncode != 0:
        raise CheckFailed(f"podman image inspect {image}: {last_line(result.stderr)}")
    found: dict[str, Any] = json.loads(result.stdout)[0]
    return found


# -- the checks


def configuration(image: str) -> str:
    config = inspect(image)["Config"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    expected = {"User": f"{UID}:{UID}", "Entrypoint": ["gpu-labeller"], "Cmd": ["run"]}
    for key, value in expected.items():
        if config.get(key) != value:
            raise CheckFailed(f"{key} is {config.get(key)!r}, not {value!r}")
    label = (config.get("Labels") or {}).get("org.opencontainers.image.version")
    if label != version:
        raise CheckFailed(f"org.opencontainers.image.version is {label!r}, pyproject.toml says {version}")
    return f"user {UID}:{UID}, entrypoint gpu-labeller, command run, version {version}"


def same_output(image: str, *args: str) -> str:
    ours, theirs = venv_cli(*args), container(image, *args)
    if theirs.returncode != ours.returncode:
        raise CheckFailed(f"exit {theirs.returncode}, the CLI's {ours.returncode}: {last_line(theirs.stderr)}")
    if theirs.stdout != ours.stdout:
        image_lines, cli_lines = theirs.stdout.splitlines(), ours.stdout.splitlines()
        line = next((n for n, (a, b) in enumerate(zip(image_lines, cli_lines)) if a != b),
                    min(len(image_lines), len(cli_lines)))
        image_line, cli_line = (image_lines[line:line + 1] or ["(end)"])[0], (cli_lines[line:line + 1] or ["(end)"])[0]
        raise CheckFailed(f"output differs from the CLI's at line {line + 1}: image {image_line!r}, CLI {cli_line!r}")
    return f"{len(ours.stdout.splitlines())} lines, identical"


def user(image: str) -> str:
    ids = in_image(image, "import json, os; print(json.dumps([os.getuid(), os.geteuid(), os.getgid()]))")
    if ids != [UID, UID, UID]:
        raise CheckFailed(f"runs as uid/euid/gid {ids}, not {UID}")
    return f"uid {UID}"


def default_command(image: str) -> str:
    result = container(image)
    lines = result.stderr.strip().splitlines()
    if result.returncode != 2 or len(lines) != 1 or "node name" not in lines[0]:
        raise CheckFailed(f"`run` without a node name: exit {result.returncode}, stderr {result.stderr.strip()!r}")
    return lines[0]


INSTALLED = """
import importlib, importlib.metadata as md, json, os, pkgutil, platform, sys
import labeller
for module in pkgutil.walk_packages(labeller.__path__, "labeller."):
    if not module.name.endswith(".__main__"):  # python -m labeller.cli: importing it runs the program
        importlib.import_module(module.name)
tops = {name.split(".")[0] for name in sys.modules}
dists = []
for dist in md.distributions():
    files = [str(f) for f in dist.files or [] if ".dist-info" not in str(f) and not str(f).startswith("..")]
    provides = {f.split("/")[0].removesuffix(".py") for f in files} - {"__pycache__"}
    dists.append({"name": dist.metadata["Name"], "version": dist.version, "requires_dist": dist.requires or [],
                  "imported": bool(provides & tops)})
environment = {"implementation_name": sys.implementation.name, "implementation_version": platform.python_version(),
               "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
               "platform_system": platform.system(), "platform_version": platform.version(),
               "python_full_version": platform.python_version(),
               "platform_python_implementation": platform.python_implementation(),
               "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}
print(json.dumps({"dists": dists, "environment": environment,
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("aiohttp", "kubernetes"))}))
"""


def distributions(image: str) -> str:
    """Installed == the locked closure of gpu-labeller's requirements; each imported; no kubernetes.aio."""
    seen = in_image(image, INSTALLED)
    dists = {lock.canonicalize_name(d["name"]): d for d in seen["dists"]}
    if "gpu-labeller" not in dists:
        raise CheckFailed("gpu-labeller is not installed in the image")
    report = {"environment": seen["environment"],
              "install": [{"metadata": {key: d[key] for key in ("name", "version", "requires_dist")}}
                          for d in dists.values()]}
    roots = [lock.Requirement(text) for text in dists["gpu-labeller"]["requires_dist"]]
    try:
        needed = lock.closure(report, roots)
    except lock.LockError as exc:
        raise CheckFailed(str(exc)) from None
    installed = set(dists) - {"gpu-labeller"}
    if installed != set(needed):
        raise CheckFailed(f"installed but not needed: {sorted(installed - set(needed)) or 'none'}; "
                          f"needed, not installed: {sorted(set(needed) - installed) or 'none'}")
    pinned = lock.parse(lock.LOCK.read_text())
    if set(pinned) != installed:
        raise CheckFailed(f"the image and requirements.lock differ: {sorted(set(pinned) ^ installed)}")
    moved = [f"{name} {dists[name]['version']} (locked {entry.version})" for name, entry in pinned.items()
             if dists[name]["version"] != entry.version]
    if moved:
        raise CheckFailed("not the locked versions: " + ", ".join(moved))
    unused = [name for name in installed if not dists[name]["imported"] and name not in ON_DEMAND]
    if unused:
        raise CheckFailed(f"carried but never imported by gpu-labeller: {sorted(unused)}")
    aio = [module for module in seen["loaded"] if module.startswith(("aiohttp", "kubernetes.aio"))]
    if aio:
        raise CheckFailed(f"gpu-labeller imports {aio[0]}")
    return f"{len(installed)} distributions as locked, none unused, no pip, no kubernetes.aio stack"


COMPILED = """
import importlib, importlib.util, json, pkgutil, sys
import labeller
from labeller.cli.main import main
sys.argv = ["gpu-labeller", "labels", "--simulate", sys.argv[1], "-o", "/dev/null"]
try:
    main()
except SystemExit:
    pass
dry_run = set(sys.modules)
for module in pkgutil.walk_packages(labeller.__path__, "labeller."):
    if not module.name.endswith(".__main__"):  # python -m labeller.cli: importing it runs the program
        importlib.import_module(module.name)
missing, unchecked, total = [], [], 0
for name, module in list(sys.modules.items()):
    source = getattr(module, "__file__", None) or ""
    if not source.startswith(sys.prefix) or not source.endswith(".py"):
        continue
    total += 1
    try:
        with open(importlib.util.cache_from_source(source), "rb") as pyc:
            flags = int.from_bytes(pyc.read(8)[4:8], "little")
    except OSError:
        missing.append(name + (" (dry run)" if name in dry_run else ""))
        continue
    if flags != 0b01:  # hash-based, source not checked (PEP 552)
        unchecked.append(name)
try:
    import kubernetes.aio
    aio = True
except ImportError:
    aio = False
print(json.dumps({"total": total, "missing": sorted(missing), "flags": sorted(unchecked), "aio": aio}))
"""


def compiled(image: str) -> str:
    seen = in_image(image, COMPILED, PROFILE)
    if seen["missing"]:
        raise CheckFailed(f"{len(seen['missing'])} imported modules without .pyc (compiled at every start), "
                          f"e.g. {seen['missing'][:3]}")
    if seen["flags"]:
        raise CheckFailed(f"{len(seen['flags'])} .pyc files are not unchecked-hash, e.g. {seen['flags'][:3]}")
    if seen["aio"]:
        raise CheckFailed("kubernetes.aio is in the image")
    return f"all {seen['total']} modules the processes import have an unchecked-hash .pyc"


def labels_a_node(image: str) -> str:
    expected = venv_cli("labels", "--simulate", PROFILE, "--format", "json")
    if expected.returncode != 0:
        raise CheckFailed(f"the CLI's labels failed: {last_line(expected.stderr)}")
    node = "image-check"
    with FakeApiServer() as api, tempfile.TemporaryDirectory(prefix="gpu-labeller-image-") as scratch:
        api.create_node(node)
        kubeconfig = api.write_kubeconfig(Path(scratch) / "kubeconfig")
        kubeconfig.chmod(0o644)  # read by uid 65532 in the container
        result = container(image, "run", "--once", "--node-name", node, "--simulate", PROFILE, "--metrics-port", "0",
                           "--kubeconfig", "/etc/gpu-labeller/kubeconfig", network="host",
                           volumes=(f"{kubeconfig}:/etc/gpu-labeller/kubeconfig:ro",))
        if result.returncode != 0:
            raise CheckFailed(f"run --once exited {result.returncode}: {last_line(result.stderr)}")
        labels = api.store.get(node)["metadata"].get("labels") or {}
    if labels != json.loads(expected.stdout):
        raise CheckFailed(f"the Node's labels differ from `labels --simulate {PROFILE}`: "
                          f"{sorted(set(labels) ^ set(json.loads(expected.stdout)))[:5]}")
    return f"{len(labels)} labels on the fake API server's Node, as `labels` prints them"


def project_size(image: str) -> tuple[int, str, int]:
    """The bytes of the image's own layers (above its base), the base (its label) and the base's bytes."""
    config = inspect(image)
    base = (config["Config"].get("Labels") or {}).get("org.opencontainers.image.base.name")
    if not base:
        raise CheckFailed("no org.opencontainers.image.base.name label: the base is unknown")
    base_size = int(inspect(base)["Size"])
    return int(config["Size"]) - base_size, base, base_size


def layer_sizes(image: str) -> str:
    """Each layer that holds bytes: its size and the instruction that made it."""
    history = json.loads(podman("history", "--format", "json", image).stdout or "[]")
    made_by = [" ".join(word[:24] for word in entry.get("CreatedBy", "").replace("#(nop)", "").split()[2:4])
               for entry in history]
    return "; ".join(f"{entry['size'] / 1e6:.1f} MB {by}" for entry, by in zip(history, made_by) if entry.get("size"))


def layers(image: str) -> str:
    project, base, base_size = project_size(image)
    print(f"      layers: {layer_sizes(image)}")
    figures = f"project {project / 1e6:.1f} MB above the base {base} ({base_size / 1e6:.1f} MB)"
    if project > LAYER_BUDGET_BYTES:
        raise CheckFailed(f"{figures}: over the {LAYER_BUDGET_BYTES / 1e6:.0f} MB budget")
    return figures


COLD_START = """
import json, resource, statistics, subprocess, sys, time
walls, cpus = [], []
for _ in range(int(sys.argv[2])):
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(["gpu-labeller", "labels", "--simulate", sys.argv[1]], stdout=subprocess.DEVNULL, check=True)
    walls.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
print(json.dumps({"wall": statistics.median(walls), "cpu": statistics.median(cpus)}))
"""


def cold_start(image: str) -> str:
    """A figure, not a check: no time budget on a loaded CI box."""
    inside = in_image(image, COLD_START, PROFILE, "5")
    return (f"`labels --simulate {PROFILE}` in the container: median of 5 fresh processes {inside['wall']:.2f} s "
            f"wall, {inside['cpu']:.2f} s CPU; load {os.getloadavg()[0]:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True, help="the image (ID or reference)")
    parser.add_argument("--name", help="its name, for the messages (default: --image)")
    args = parser.parse_args()
    image = args.image
    print(f"checking {args.name or image} ({image})", flush=True)
    try:
        check("configuration", lambda: configuration(image))
        check("--version as the CLI's", lambda: same_output(image, "--version"))
        check(f"labels --simulate {PROFILE} as the CLI's", lambda: same_output(image, "labels", "--simulate", PROFILE))
        check("not root", lambda: user(image))
        check("default command", lambda: default_command(image))
        check("distributions", lambda: distributions(image))
        check("bytecode", lambda: compiled(image))
        check("run --once labels a Node", lambda: labels_a_node(image))
        check("size", lambda: layers(image))
        print(f"      {cold_start(image)}", flush=True)
    except subprocess.TimeoutExpired as exc:
        results.append((False, f"{' '.join(map(str, exc.cmd))[:80]} ran past {exc.timeout:.0f} s"))
    except CheckFailed as exc:
        results.append((False, f"cold start: {exc}"))
    finally:
        if started:  # left only by a timeout; `--rm` removed the others
            podman("rm", "--force", "--ignore", *started, timeout=300)
    failed = [message for ok, message in results if not ok]
    if failed:
        sys.stdout.flush()
        print(f"image check FAILED ({len(failed)} of {len(results)}): {failed[0]}", file=sys.stderr)
        return 1
    print(f"image check: {len(results)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
