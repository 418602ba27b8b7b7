"""``gpu-labeller nodes``: the fleet at a glance, from one Node list and one Pod list.

For each GPU node (one with gpu-labeller's presence labels, or a GPU resource in its capacity):
vendor, model, count, memory, sharing, MIG, each GPU resource's capacity, allocatable and what
pods bound to the node request of it, and whether the labeller and the device plugin are ready
there. Pure: Node and Pod objects (plain dicts, as the API returns them) in, rows out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from labeller.model.namedconfigs import STATE_LABEL
from labeller.model.quantity import whole

Obj = dict[str, Any]
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/", "aliyun.com/gpu-mem", "aliyun.com/gpu-count")
PRESENCE = {"nvidia": "nvidia.com/gpu.present", "amd": "amd.com/gpu.present"}
FINISHED = ("Succeeded", "Failed")
# Pods that hold resources on a node: bound to one and not finished.
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


def is_gpu_resource(name: str) -> bool:
    return name.startswith(GPU_RESOURCE_PREFIXES)


def quantity(text: Any) -> int:
    """An extended resource's quantity (a whole number; "1k" and the like are read too)."""
    return whole(text)


def pod_requests(pod: Obj) -> dict[str, int]:
    """The GPU resources a pod holds: the sum over its containers (a request, else its limit, as the
    API server defaults it), or the largest init container's when that is more."""
    spec = pod.get("spec") or {}

    def of(container: Obj) -> dict[str, int]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: quantity(value) for name, value in merged.items() if is_gpu_resource(name)}

    total: dict[str, int] = defaultdict(int)
    for container in spec.get("containers") or []:
        for name, amount in of(container).items():
            total[name] += amount
    for container in spec.get("initContainers") or []:
        for name, amount in of(container).items():
            total[name] = max(total[name], amount)
    return dict(total)


def in_use(pods: Iterable[Obj]) -> dict[str, dict[str, int]]:
    """node name -> resource -> amount requested by the non-finished pods bound to it."""
    used: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in FINISHED:
            continue
        for name, amount in pod_requests(pod).items():
            used[node][name] += amount
    return used


@dataclass(frozen=True)
class ResourceRow:
    name: str
    capacity: int
    allocatable: int
    used: int


@dataclass(frozen=True)
class NodeRow:
    name: str
    vendors: tuple[str, ...]
    model: str
    count: str
    memory: str
    sharing: str
    mig: str
    resources: tuple[ResourceRow, ...] = field(default=())
    labeller: str = ""
    plugin: str = ""

    def document(self) -> dict[str, Any]:
        return {"name": self.name, "vendors": list(self.vendors), "model": self.model, "count": self.count,
                "memory": self.memory, "sharing": self.sharing, "mig": self.mig,
                "resources": [{"name": r.name, "capacity": r.capacity, "allocatable": r.allocatable, "used": r.used}
                              for r in self.resources],
                "labeller": self.labeller, "plugin": self.plugin}


# Where each vendor's device plugin offers its GPUs: gpushare's aliyun.com/ resources divide NVIDIA
# GPUs by memory (sharing.memory), so they are NVIDIA's too.
RESOURCE_DOMAINS = {"nvidia": ("nvidia.com/", "aliyun.com/"), "amd": ("amd.com/",)}


def _vendors(labels: Mapping[str, str], resources: Iterable[str]) -> tuple[str, ...]:
    found = {v for v, key in PRESENCE.items() if labels.get(key) == "true"}
    found |= {v for r in resources for v, domains in RESOURCE_DOMAINS.items() if r.startswith(domains)}
    return tuple(sorted(found))


def _amd_count(labels: Mapping[str, str]) -> str:
    """Physical AMD GPUs: the per-value counts of device-id (or family), which count physical GPUs."""
    for kind in ("device-id", "family", "product-name"):
        counts = [int(v) for k, v in labels.items() if k.startswith(f"beta.amd.com/gpu.{kind}.") and v.isdigit()]
        if counts:
            return str(sum(counts))
    return ""


def _join(*parts: str) -> str:
    return "+".join(p for p in parts if p) or "-"


def _sharing(labels: Mapping[str, str], resources: Iterable[str]) -> str:
    strategy = labels.get("nvidia.com/gpu.sharing-strategy", "")
    if (strategy == "memory" or labels.get("gpushare") == "true"
            or any(r.startswith("aliyun.com/gpu-mem") for r in resources)):
        units = labels.get("nvidia.com/gpu.replicas") if strategy == "memory" else None
        return "memory: aliyun.com/gpu-mem" + (f", {units} units per GPU" if units else "")
    if strategy and strategy != "none":
        shared = labels.get("nvidia.com/gpu.shared-count")
        subset = f" on {shared}" if shared else ""
        return f"{strategy} x{labels.get('nvidia.com/gpu.replicas', '?')}{subset}"
    return "none"


def _mig(labels: Mapping[str, str]) -> str:
    strategy = labels.get("nvidia.com/mig.strategy")
    if strategy == "mixed":
        profiles = sorted((k[len("nvidia.com/mig-"):-len(".count")], v) for k, v in labels.items()
                          if k.startswith("nvidia.com/mig-") and k.endswith(".count"))
        return "mixed: " + (", ".join(f"{p} x{n}" for p, n in profiles) or "no MIG devices")
    if strategy == "single":
        return f"single: {labels.get('nvidia.com/gpu.product', '?')}"
    if labels.get("nvidia.com/mig.capable") == "true":
        return "capable, off"
    return "-"


def _labeller_state(labels: Mapping[str, str], vendors: Sequence[str]) -> str:
    missing = [v for v in vendors if v in PRESENCE and PRESENCE[v] not in labels]
    if labels.get(STATE_LABEL) == "failed":
        return "config failed"
    if missing:
        return ("no labels" if len(missing) == len([v for v in vendors if v in PRESENCE])
                else f"no {'/'.join(missing)} labels")
    return "ready"


def _plugin_state(resources: Sequence[ResourceRow], vendors: Sequence[str]) -> str:
    missing = [v for v in vendors
               if not any(r.name.startswith(RESOURCE_DOMAINS[v]) and r.capacity > 0 for r in resources)]
    return "ready" if not missing else f"no capacity: {'/'.join(missing)}"


def node_row(node: Obj, used: Mapping[str, int]) -> NodeRow | None:
    """The row of one Node; None when it has no GPU (no presence label, no GPU resource)."""
    metadata, status = node.get("metadata") or {}, node.get("status") or {}
    labels: dict[str, str] = metadata.get("labels") or {}
    capacity = {k: quantity(v) for k, v in (status.get("capacity") or {}).items() if is_gpu_resource(k)}
    allocatable = {k: quantity(v) for k, v in (status.get("allocatable") or {}).items() if is_gpu_resource(k)}
    names = sorted({*capacity, *allocatable, *(k for k in used if is_gpu_resource(k))})
    vendors = _vendors(labels, names)
    if not vendors:
        return None
    resources = tuple(ResourceRow(n, capacity.get(n, 0), allocatable.get(n, 0), used.get(n, 0)) for n in names)
    return NodeRow(
        name=str(metadata.get("name", "")), vendors=vendors,
        model=_join(labels.get("nvidia.com/gpu.product", ""),
                    labels.get("amd.com/gpu.product-name", labels.get("amd.com/gpu.device-id", ""))),
        count=_join(labels.get("nvidia.com/gpu.count", ""), _amd_count(labels)),
        memory=_join(f"{labels['nvidia.com/gpu.memory']}MiB" if "nvidia.com/gpu.memory" in labels else "",
                     labels.get("amd.com/gpu.vram", "")),
        sharing=_sharing(labels, names), mig=_mig(labels), resources=resources,
        labeller=_labeller_state(labels, vendors), plugin=_plugin_state(resources, vendors))


def fleet(nodes: Iterable[Obj], pods: Iterable[Obj]) -> list[NodeRow]:
    used = in_use(pods)
    rows = (node_row(n, used.get(str((n.get("metadata") or {}).get("name")), {})) for n in nodes)
    return sorted((r for r in rows if r is not None), key=lambda r: r.name)


COLUMNS = ("NODE", "VENDOR", "MODEL", "COUNT", "MEMORY", "SHARING", "MIG", "RESOURCES cap/alloc/used", "LABELLER",
           "PLUGIN")


def fleet_text(rows: Sequence[NodeRow]) -> str:
    table = [COLUMNS] + [(
        r.name, "+".join(r.vendors), r.model, r.count, r.memory, r.sharing, r.mig,
        " ".join(f"{x.name} {x.capacity}/{x.allocatable}/{x.used}" for x in r.resources) or "-",
        r.labeller, r.plugin) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS) - 1)]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] + "\n" for row in table)
