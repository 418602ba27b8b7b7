"""Tests of the Helm chart, the plain manifests and the Dockerfile (deploy/, Dockerfile).

Shared helpers live here: rendering the chart with the real Helm engine (helm-python-sdk), cached
per set of values, and picking objects out of a render.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpu-labeller"
MANIFESTS = ROOT / "deploy" / "manifests"
RELEASE = NAMESPACE = "gpu-labeller"
# Kubernetes versions the objects are validated against: the floor the admission policy needs, and the newest.
KUBE_VERSIONS = ("1.30.0", "1.37.0")
# DRA (dra.enabled: DeviceClasses of resource.k8s.io/v1) needs 1.34: its objects are validated from there on.
DRA_KUBE_VERSION = "1.34.0"
# The oldest Kubernetes the chart installs on (Chart.yaml kubeVersion), without the admission policy and DRA.
MIN_KUBE_VERSION = "1.27.0"

# Value combinations every structural test runs over (name -> values).
COMBINATIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespace": {"createNamespace": True},
    "policy-on": {"admissionPolicy": {"enabled": True}},
    "plugin-off": {"devicePlugin": {"enabled": False}},
    "nodefeature": {"labeller": {"output": "nodefeature"}},
    "features-file": {"labeller": {"output": "features-file"}},
    "events-on": {"labeller": {"events": {"enabled": True}}},
    "features-file-events": {"labeller": {"output": "features-file", "events": {"enabled": True}}},
    "named-configs": {"config": {"default": "whole", "data": {
        "whole": {"version": "v1"},
        "time-sliced-4": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                         "    - {name: nvidia.com/gpu, replicas: 4}\n"}}},
    "existing-configmap": {"config": {"name": "gpu-configs", "create": False, "default": "default"}},
    "named-configs-features-file": {"labeller": {"output": "features-file"},
                                    "config": {"data": {"a": {"version": "v1"}, "b": {"version": "v1"}}}},
    # MPS (an mps-control-daemon container in the plugin pod) and CDI spec files (the CDI directory)
    "mps-cdi": {"config": {"version": "v1", "flags": {"nvidiaDriverRoot": "/run/nvidia/driver",
                                                      "plugin": {"deviceListStrategy": ["envvar", "cdi-cri"]}},
                           "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}},
    "extender": {"extender": {"enabled": True}},
    "extender-existing-secret": {"extender": {"enabled": True, "policy": "spread", "bindWait": "5s",
                                              "assumeTimeout": 120, "tls": {"existingSecret": "extender-certs"},
                                              "service": {"clusterIP": "10.96.0.50"},
                                              "schedulerConfig": {"host": "10.96.0.50"}}},
    # Memory sharing in one pool (pods access for the plugin) with both admission policies
    "memory-sharing": {"admissionPolicy": {"enabled": True}, "config": {"default": "whole", "data": {
        "whole": {"version": "v1"}, "gpushare": {"version": "v1", "sharing": {"memory": {"unit": "GiB"}}}}}},
    # The DRA plugin, its DeviceClasses and its ResourceSlice policy; every node without the config label on DRA
    "dra": {"createNamespace": True, "admissionPolicy": {"enabled": True},
            "dra": {"enabled": True, "vendors": ["nvidia", "amd"]}},
    # DRA node by node: a named config moves a node (the plugin follows the config label);
    # DeviceClasses left to a vendor chart
    "dra-node-by-node": {"dra": {"enabled": True, "deviceClasses": {"enabled": False}}, "config": {"data": {
        "default": {"version": "v1"}, "dra": {"version": "v1", "labeller": {"dra": {"vendors": ["nvidia"]}}}}}},
    # DRA with a containerized NVIDIA driver (its files under flags.nvidiaDriverRoot)
    "dra-driver-root": {"dra": {"enabled": True},
                        "config": {"version": "v1", "flags": {"nvidiaDriverRoot": "/run/nvidia/driver"}}},
    # A demo: the simulated profile on every component, the Namespace kept for the prune hook on uninstall
    "simulated": {"createNamespace": True, "simulate": {"profile": "dgx-h100"}},
    "everything": {
        "createNamespace": True, "admissionPolicy": {"enabled": True}, "labeller": {"events": {"enabled": True}},
        "runtimeClassName": "nvidia", "tolerateAllTaints": True, "imagePullSecrets": [{"name": "registry"}],
    },
}

Obj = dict[str, Any]


@functools.cache
def _render(values_json: str, kube_version: str | None, api_versions: tuple[str, ...]) -> tuple[tuple[Obj, ...], str]:
    rendered: dict[str, str] = _render_script().render_chart(json.loads(values_json), kube_version, api_versions)
    objects = []
    notes = ""
    for path in sorted(rendered):
        if path.endswith("/NOTES.txt"):
            notes = rendered[path]
            continue
        for doc in yaml.safe_load_all(rendered[path]):
            if doc:
                objects.append(doc)
    return tuple(objects), notes


def render(values: dict[str, Any] | None = None, kube_version: str | None = None,
           api_versions: tuple[str, ...] = ()) -> list[Obj]:
    """Every object the chart renders with these values (a fresh copy; safe to modify), for a cluster of
    ``kube_version`` (as `helm template --kube-version`; default: Helm's own) that serves ``api_versions``
    beside Helm's offline set (as `helm template --api-versions`; default: none, as `helm template`)."""
    objects, _ = _render(json.dumps(values or {}, sort_keys=True), kube_version, api_versions)
    copied: list[Obj] = json.loads(json.dumps(objects))
    return copied


def cluster(kube_version: str) -> dict[str, Any]:
    """The keyword arguments of render() for a cluster of ``kube_version``, as `helm install` there sees it
    (its version and the API versions it serves)."""
    return {"kube_version": kube_version, "api_versions": tuple(_render_script().cluster_api_versions(kube_version))}


def notes(values: dict[str, Any] | None = None, kube_version: str | None = None,
          api_versions: tuple[str, ...] = ()) -> str:
    """The chart's NOTES.txt rendered as render() renders the objects."""
    return _render(json.dumps(values or {}, sort_keys=True), kube_version, api_versions)[1]


HOOK = "helm.sh/hook"


def installed(objects: list[Obj]) -> list[Obj]:
    """The objects `helm install` creates: not the hooks (postDeleteCleanup's run on `helm uninstall`)."""
    return [o for o in objects if HOOK not in (o["metadata"].get("annotations") or {})]


def hooks(objects: list[Obj], event: str) -> list[Obj]:
    """The hook objects Helm creates on ``event`` (post-delete: on `helm uninstall`, after the release's objects)."""
    return [o for o in objects if event in (o["metadata"].get("annotations") or {}).get(HOOK, "").split(",")]


def find(objects: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def labeller_ds(objects: list[Obj]) -> Obj:
    return one(objects, "DaemonSet", "gpu-labeller")


def plugin_ds(objects: list[Obj]) -> Obj:
    return one(objects, "DaemonSet", "gpu-labeller-device-plugin")


def dra_ds(objects: list[Obj]) -> Obj:
    return one(objects, "DaemonSet", "gpu-labeller-dra-plugin")


def kube_version_for(values: dict[str, Any], version: str) -> str:
    """``version``, or the floor the rendered objects need when that is later (DRA: 1.34)."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(part) for part in v.split("."))

    floor = DRA_KUBE_VERSION if values.get("dra", {}).get("enabled") else version
    return max(version, floor, key=key)


@functools.cache
def _render_script() -> ModuleType:
    return load_render_script()


def load_render_script() -> ModuleType:
    """deploy/render.py, imported from its path (deploy/ is not a package)."""
    return _load_script("gpu_labeller_deploy_render", ROOT / "deploy" / "render.py")


def load_lock_script() -> ModuleType:
    """deploy/image/lock.py (the image's lock files), imported from its path."""
    return _load_script("gpu_labeller_deploy_image_lock", ROOT / "deploy" / "image" / "lock.py")


def _load_script(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
