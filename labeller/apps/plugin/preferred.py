"""GetPreferredAllocation: which of the available devices a container should get.

Whole devices: the set with the best topology score, where a pair scores 100 per NVLink/XGMI link
between their GPUs, 200 for two partitions (or MIG devices) of the same GPU, and 10 for sharing a
NUMA node. Small choices are searched exhaustively; large ones (64 partitions) greedily.

Replicas: ``distributed`` takes replicas from the physical GPUs with the fewest replicas in use
(ties: the GPU least picked in this request), ``packed`` from those with the most, as NVIDIA's
plugin. ``must_include`` IDs always come first. Infeasible input gives ``[]``; the kubelet treats
the answer as a hint.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

from labeller.model.offer import AdvertisedDevice, PhysicalDevice, Resource

EXHAUSTIVE_LIMIT = 5000
LINK_SCORE = 100
SAME_GPU_SCORE = 200
SAME_NUMA_SCORE = 10


def pair_score(a: PhysicalDevice, b: PhysicalDevice) -> int:
    if a.gpu == b.gpu:
        score = SAME_GPU_SCORE
    else:
        score = LINK_SCORE * a.fabric_peers.count(b.gpu)
    if a.numa_node is not None and a.numa_node == b.numa_node:
        score += SAME_NUMA_SCORE
    return score


def set_score(devices: Sequence[AdvertisedDevice]) -> int:
    return sum(pair_score(a.physical, b.physical) for a, b in itertools.combinations(devices, 2))


def preferred(resource: Resource, available: Sequence[str], must_include: Sequence[str], size: int,
              policy: str = "distributed") -> list[str]:
    """The preferred IDs for one container, or [] when the request cannot be met."""
    known = list(dict.fromkeys(i for i in available if resource.device(i) is not None))
    required = list(dict.fromkeys(must_include))
    if size <= 0 or size > len(known) or len(required) > size or any(i not in known for i in required):
        return []
    if resource.shared:
        return _replicas(resource, known, required, size, policy)
    return _topology(resource, known, required, size)


def _devices(resource: Resource, ids: Sequence[str]) -> list[AdvertisedDevice]:
    return [d for i in ids if (d := resource.device(i)) is not None]


def _topology(resource: Resource, available: list[str], required: list[str], size: int) -> list[str]:
    chosen = _devices(resource, required)
    pool = [d for d in _devices(resource, available) if d.id not in set(required)]
    need = size - len(chosen)
    if need == 0:
        return [d.id for d in chosen]
    if math.comb(len(pool), need) <= EXHAUSTIVE_LIMIT:
        best = max(itertools.combinations(pool, need), key=lambda extra: set_score([*chosen, *extra]))
        return [d.id for d in (*chosen, *best)]
    while len(chosen) < size:
        pick = max(pool, key=lambda d: sum(pair_score(d.physical, c.physical) for c in chosen))
        chosen.append(pick)
        pool.remove(pick)
    return [d.id for d in chosen]


def _replicas(resource: Resource, available: list[str], required: list[str], size: int, policy: str) -> list[str]:
    free = Counter(d.physical.gpu for d in _devices(resource, available))
    total = Counter(d.physical.gpu for d in resource.devices)
    in_use = {gpu: total[gpu] - free[gpu] for gpu in total}
    picked: Counter[str] = Counter(d.physical.gpu for d in _devices(resource, required))
    chosen = list(required)
    pool = [d for d in _devices(resource, available) if d.id not in set(required)]
    sign = 1 if policy == "distributed" else -1
    while len(chosen) < size:
        pick = min(pool, key=lambda d: (sign * (in_use[d.physical.gpu] + picked[d.physical.gpu]),
                                        picked[d.physical.gpu]))
        chosen.append(pick.id)
        picked[pick.physical.gpu] += 1
        pool.remove(pick)
    return chosen
