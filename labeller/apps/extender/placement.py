"""Where a pod's GPU memory fits: pure rules over one node's GPUs (no Kubernetes, no I/O).

A node shares ``count`` GPUs of ``units`` memory units each (gpushare's rule: node capacity
``aliyun.com/gpu-mem`` divided by ``aliyun.com/gpu-count``). A GPU's free memory is its units minus
what the pods placed on it ask; an unhealthy GPU offers nothing. A pod goes whole onto one GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from labeller.model.gpushare import RESOURCE_MEM

POLICIES = ("binpack", "spread")
MAX_SCORE = 10  # the kube-scheduler's MaxExtenderPriority

Free = Sequence[int | None]  # per GPU index: free units, None for an unhealthy GPU


@dataclass(frozen=True)
class Gpus:
    """A node's shareable GPUs: how many, the units of each, and which are unhealthy."""

    count: int
    units: int
    unhealthy: frozenset[int] = frozenset()


def free_memory(gpus: Gpus, used: Sequence[int]) -> list[int | None]:
    """Per GPU: its units minus what is placed on it (never below 0), None when it is unhealthy."""
    return [None if index in gpus.unhealthy else max(0, gpus.units - (used[index] if index < len(used) else 0))
            for index in range(gpus.count)]


def choose(free: Free, request: int, policy: str = "binpack") -> int | None:
    """The GPU for ``request`` units: binpack takes the fitting GPU with the least free memory (keeping
    whole GPUs free for big pods), spread the one with the most; ties go to the lowest index."""
    fitting = [(units, index) for index, units in enumerate(free) if units is not None and units >= request]
    if not fitting:
        return None
    if policy == "spread":
        return min(fitting, key=lambda f: (-f[0], f[1]))[1]
    return min(fitting)[1]


def unfit_reason(gpus: Gpus | None, free: Free, request: int) -> str | None:
    """Why ``request`` units fit on no GPU of this node (the scheduler shows it), or None when one fits."""
    if gpus is None or gpus.count <= 0 or gpus.units <= 0:
        return f"node does not share GPU memory (no {RESOURCE_MEM} capacity)"
    if request > gpus.units:
        return (f"pod asks {request} {RESOURCE_MEM} but one GPU of this node has {gpus.units}: "
                "a pod's GPU memory must fit on a single GPU")
    if choose(free, request) is not None:
        return None
    healthy = [units for units in free if units is not None]
    if not healthy:
        return f"all {gpus.count} GPUs are unhealthy"
    return f"no GPU has {request} {RESOURCE_MEM} free (most free on one GPU: {max(healthy)} of {gpus.units})"


def score(free: Free, request: int, units: int, policy: str = "binpack") -> int:
    """0..MAX_SCORE for the node, from how full its healthy GPUs would be with the pod: binpack
    prefers the fullest node, spread the emptiest. 0 when the pod does not fit."""
    healthy = [left for left in free if left is not None]
    if choose(free, request, policy) is None or units <= 0 or not healthy:
        return 0
    fullness = (units * len(healthy) - sum(healthy) + request) / (units * len(healthy))
    return round(MAX_SCORE * (fullness if policy == "binpack" else 1.0 - fullness))
