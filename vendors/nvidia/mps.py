"""MPS (``sharing.mps``), the parts the model, the plugin and the control daemon share: where a
resource's daemon keeps its pipes and logs, the limits it is given, and its readiness file.

``gpu-labeller mps-control-daemon`` runs one ``nvidia-cuda-mps-control -d`` per shared resource
with ``CUDA_MPS_PIPE_DIRECTORY=<mpsRoot>/<resource>/pipe`` and ``CUDA_MPS_LOG_DIRECTORY=
<mpsRoot>/<resource>/log``, as NVIDIA's ``mps-control-daemon`` does. While every daemon answers it
rewrites ``<mpsRoot>/.gpu-labeller-mps-ready.json`` (what it serves, and a heartbeat); readers treat
a file whose heartbeat is older than its ``staleAfterSeconds`` as not ready, so a control daemon
that was killed outright (and cannot remove the file) stops counting within that time. NVIDIA's
daemon writes ``<mpsRoot>/.ready`` once and never refreshes it; a file of our own also never
touches NVIDIA's during a migration.

``check`` is the NVIDIA vendor's ``Mps.check``: MPS replicas are advertised, and labelled
``sharing-strategy=mps``, only while the readiness file says exactly that resource is served.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import Resource
from vendors.nvidia.devices import NvidiaDevice
from vendors.nvidia.facts import MIB
from vendors.nvidia.model import MpsReadiness, MpsServed, NvidiaInventory
from vendors.sysfs import Untrusted, read_text

READY_FILE = ".gpu-labeller-mps-ready.json"
READY_KIND = "gpu-labeller/mps-ready"
CONTAINER_ROOT = "/mps"  # where a client container sees its resource's pipe directory (NVIDIA's path)
CONTAINER_SHM = "/dev/shm"
VOLTA = (7, 0)
CLIENTS_FROM_VOLTA, CLIENTS_BEFORE_VOLTA = 48, 16


# --- paths ---------------------------------------------------------------------------------------

def resource_dir(root: str, resource: str) -> str:
    """``<root>/nvidia.com/gpu``: one directory per resource, as NVIDIA's ``mps.Root`` lays it out."""
    return f"{root.rstrip('/')}/{resource}"


def pipe_dir(root: str, resource: str) -> str:
    return f"{resource_dir(root, resource)}/pipe"


def log_dir(root: str, resource: str) -> str:
    return f"{resource_dir(root, resource)}/log"


def shm_dir(root: str) -> str:
    """The host directory mounted at /dev/shm in the control daemon and every client (shared by all resources)."""
    return f"{root.rstrip('/')}/shm"


def ready_file(root: str) -> Path:
    return Path(root) / READY_FILE


# --- limits --------------------------------------------------------------------------------------

def gpus(resource: Resource) -> list[NvidiaDevice]:
    return [d for d in resource.physical_devices if isinstance(d, NvidiaDevice)]


def pinned_memory_limits(resource: Resource) -> dict[int, int]:
    """NVML index -> MiB each client may pin on that GPU: its memory divided by the replicas
    (NVIDIA's ``perDevicePinnedDeviceMemoryLimits``); GPUs whose memory is unknown get none."""
    return {d.nvml_gpu.index: d.nvml_gpu.memory_bytes // resource.replicas // MIB
            for d in gpus(resource) if d.nvml_gpu.memory_bytes}


def active_thread_percentage(resource: Resource) -> int:
    """The share of each GPU's SMs a client may use: 100 / replicas (NVIDIA's ``activeThreadPercentage``)."""
    return 100 // resource.replicas


def served(resource: Resource) -> MpsServed:
    """What a readiness file must say for ``resource`` to be advertised."""
    return MpsServed(resource.name, resource.replicas, tuple(sorted(d.nvml_gpu.uuid for d in gpus(resource))))


# --- the readiness file --------------------------------------------------------------------------

def ready_document(entries: Sequence[MpsServed], heartbeat: float, stale_after_s: float) -> str:
    return json.dumps({
        "kind": READY_KIND, "version": 1, "heartbeat": round(heartbeat, 3), "staleAfterSeconds": stale_after_s,
        "served": [{"resource": e.resource, "replicas": e.replicas, "devices": list(e.devices)} for e in entries],
    }, indent=2) + "\n"


def _entry(raw: Any) -> MpsServed:
    if not isinstance(raw, dict):
        raise ValueError("a served entry is not a mapping")
    resource, replicas, devices = raw.get("resource"), raw.get("replicas"), raw.get("devices")
    if not isinstance(resource, str) or not isinstance(replicas, int) or not isinstance(devices, list) \
            or not all(isinstance(d, str) for d in devices):
        raise ValueError("a served entry lacks resource, replicas or devices")
    return MpsServed(resource, replicas, tuple(sorted(devices)))


def parse_ready(text: str, now: float) -> MpsReadiness:
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("kind") != READY_KIND:
            raise ValueError(f"not a {READY_KIND} document")
        heartbeat, stale_after = raw.get("heartbeat"), raw.get("staleAfterSeconds")
        if not isinstance(heartbeat, (int, float)) or not isinstance(stale_after, (int, float)):
            raise ValueError("heartbeat or staleAfterSeconds missing")
        entries = tuple(_entry(e) for e in raw.get("served", []))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        return MpsReadiness(problem=f"unreadable: {exc}")
    age = now - heartbeat
    if age > stale_after:
        return MpsReadiness(problem=f"stale: last heartbeat {age:.0f}s ago (the control daemon stopped)")
    return MpsReadiness(served=entries)


def read_readiness(root: str, now: float | None = None) -> MpsReadiness:
    path = ready_file(root)
    try:
        text = read_text(path)
    except Untrusted as exc:
        return MpsReadiness(problem=str(exc))
    if text is None:
        return MpsReadiness(problem=f"{path} does not exist (is gpu-labeller mps-control-daemon running?)")
    return parse_ready(text, time.time() if now is None else now)


def probe_readiness(config: Config) -> MpsReadiness | None:
    """What the NVIDIA probe records: the readiness file, only when the config shares by MPS."""
    return read_readiness(config.plugin.mps_root) if config.sharing.strategy == "mps" else None


def offer_inputs(config: Config) -> object:
    """The plugin's fingerprint of the readiness file (``Mps.offer_inputs``): what it serves, or
    that it serves nothing; the heartbeat itself is left out."""
    readiness = probe_readiness(config)
    return None if readiness is None else (readiness.served, readiness.problem is None)


# --- the vendor's MPS check ----------------------------------------------------------------------

def _client_limit(devices: Sequence[NvidiaDevice]) -> int:
    old = [d for d in devices if d.nvml_gpu.compute_capability is not None and d.nvml_gpu.compute_capability < VOLTA]
    return CLIENTS_BEFORE_VOLTA if old else CLIENTS_FROM_VOLTA


def check(inventory: Inventory, resource: Resource) -> tuple[str, bool] | None:
    """Why ``resource``'s MPS replicas cannot be advertised, and whether that may change; None when
    the control daemon serves exactly them."""
    devices = gpus(resource)
    if any(d.mig is not None for d in devices):
        return "MPS cannot share MIG devices (NVIDIA's plugin refuses them too)", False
    if any(d.nvml_gpu.mig_enabled for d in devices):
        return "MPS cannot share a GPU with MIG enabled", False
    limit = _client_limit(devices)
    if resource.replicas > limit:
        return f"{resource.replicas} replicas, but an MPS server on these GPUs accepts {limit} clients", False
    part = inventory.part(NvidiaInventory)
    readiness = part.mps if part is not None else None
    if readiness is None:
        return "the MPS control daemon's readiness was not read", True
    if served(resource) in readiness.served:
        return None
    why = readiness.problem or f"it serves {', '.join(s.resource for s in readiness.served) or 'nothing'} " \
                               f"with other devices or replicas"
    return f"the MPS control daemon does not serve {resource.name} yet: {why}", True
