"""Shares of a device on the node: Kubernetes 1.34's consumable capacity (feature gate
``DRAConsumableCapacity``), which ``sharing.memory`` publishes GPUs with.

The scheduler allocates a device that allows multiple allocations to several claims at once, each
allocation result with its own ``shareID`` and the ``consumedCapacity`` it takes of the device
(``{"memory": "4Gi"}``: the request rounded up by the capacity's request policy). Preparing a claim:

- ``problem``: a share of such a device must say what it consumes of each capacity that has a
  request policy, in quantities the device can hold; otherwise the claim is refused, with the reason;
- ``over_capacity`` (``Holds.take``): the shares prepared on a device never consume more than its
  capacities, whatever the allocations say (a second scheduler, a claim allocated by hand, a device
  that shrank): the share that would pass it is refused, naming what is prepared;
- ``environment``: a share of a GPU shared by memory gets gpushare's container environment, as the
  device plugin's memory Allocate gives it (``labeller.model.gpushare``): ``ALIYUN_COM_GPU_MEM_IDX`` (the
  GPU's position among the node's GPUs shared by memory), ``_CONTAINER`` (the share, in the config's
  unit), ``_DEV`` (the GPU's units) on the share's CDI device, and ``_POD`` (the claim's units on all
  its GPUs) on every device of the claim.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from labeller.model import gpushare, quantity
from labeller.apps.draplugin.checkpoint import PreparedClaim, PreparedDevice
from labeller.model.resourceslices import DraDevice
from labeller.model.resourceslices import quantity as shown
from labeller.model.sharing import MEMORY
from labeller.model.vendor.dra import shown as shown_json

Obj = dict[str, Any]


def consumed(result: Obj) -> tuple[tuple[str, str], ...] | None:
    """An allocation result's ``consumedCapacity``, by capacity name; None when it is not capacities'
    quantities of at least 0."""
    value = result.get("consumedCapacity") or {}
    if not isinstance(value, dict):
        return None
    for name, amount in value.items():
        parsed = quantity.parse(amount) if isinstance(amount, str) else None
        if not isinstance(name, str) or parsed is None or parsed < 0:
            return None
    return tuple(sorted(value.items()))


def problem(name: str, result: Obj, device: DraDevice) -> str | None:
    """Why ``result`` (an allocation of ``device``, named ``name``) cannot be prepared as a share, or None."""
    amounts = consumed(result)
    if amounts is None:
        return f"device {name}: consumedCapacity {shown_json(result.get('consumedCapacity'))} is not quantities"
    unknown = sorted(set(dict(amounts)) - set(device.capacity))
    if unknown:
        return f"device {name}: consumedCapacity names {', '.join(unknown)}, which the device does not have"
    if result.get("shareID") is None or not device.allow_multiple_allocations:
        return None
    missing = sorted(k for k, c in device.capacity.items() if c.request_policy is not None and k not in dict(amounts))
    if missing:
        return (f"device {name}: a share (shareID {result['shareID']}) that does not say what it consumes of "
                f"{', '.join(missing)} (no consumedCapacity: was it allocated by a scheduler without "
                "DRAConsumableCapacity?)")
    return None


def amount(held: PreparedDevice, capacity: str) -> int:
    """How much of ``capacity`` an allocation takes, in whole units of the capacity (bytes of memory)."""
    value = dict(held.consumed).get(capacity)
    parsed = quantity.parse(value) if value is not None else None
    return math.ceil(parsed) if parsed is not None else 0


def capacities(device: DraDevice) -> dict[str, int]:
    return {name: capacity.value for name, capacity in device.capacity.items()}


def over_capacity(name: str, mine: Sequence[PreparedDevice], theirs: Sequence[tuple[PreparedClaim, PreparedDevice]],
                  totals: Mapping[str, int]) -> list[str]:
    """Why ``mine`` (one claim's allocations of device ``name``) do not fit beside ``theirs`` (the other
    claims' allocations of it): one line per capacity they would overrun."""
    problems = []
    for capacity, total in sorted(totals.items()):
        asked = sum(amount(d, capacity) for d in mine)
        held = [(claim, amount(d, capacity)) for claim, d in theirs if not d.admin]
        used = sum(taken for _, taken in held)
        if asked and used + asked > total:
            holders = sorted({str(claim) for claim, taken in held if taken})
            more = f" and {len(holders) - 3} more" if len(holders) > 3 else ""
            problems.append(f"device {name}: {shown(asked)} of its {capacity} asked, but {shown(used)} of its "
                            f"{shown(total)} is prepared for {len(holders)} other claim(s) "
                            f"({', '.join(holders[:3])}{more})")
    return problems


def environment(devices: Iterable[PreparedDevice], by_name: Mapping[str, DraDevice], unit_bytes: int | None
                ) -> tuple[dict[tuple[str, str | None], dict[str, str]], dict[str, str]]:
    """gpushare's environment for the claim's shares of GPUs shared by memory: per share (its key), and
    for the whole claim; nothing without ``sharing.memory`` (``unit_bytes`` None)."""
    if unit_bytes is None:
        return {}, {}
    gpus = [name for name, d in by_name.items() if d.allow_multiple_allocations and MEMORY in d.capacity]
    per_share, claim_units = {}, 0
    for held in devices:
        device = by_name[held.device]
        if held.share_id is None or held.device not in gpus or not dict(held.consumed).get(MEMORY):
            continue
        units = amount(held, MEMORY) // unit_bytes
        claim_units += units
        per_share[held.key] = gpushare.share_environment(gpus.index(held.device), units,
                                                         device.capacity[MEMORY].value // unit_bytes)
    return per_share, ({gpushare.ENV_POD: str(claim_units)} if per_share else {})
