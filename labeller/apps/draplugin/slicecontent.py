"""What a ResourceSlice says, for comparing what was written with what the API server keeps.

``content`` compares a slice as the API keeps it: a capacity quantity in another notation is the same
quantity, the empty, false and null fields the API leaves out are left out, and neither the pool's
generation nor a taint's ``timeAdded`` (the server's stamp) is a difference. ``dropped`` names the
fields of a write that the server did not keep (``devices[].allowMultipleAllocations``: the field of an
alpha feature gate it does not enable), ``named_fields`` those a refusal's message names. Pure.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import Any

from labeller.model.quantity import parse as parse_quantity

Obj = dict[str, Any]
TaintKey = tuple[str, str, str, str]  # (device, key, value, effect)


def quantity(text: str) -> Fraction | str:
    """A Kubernetes quantity's value ("80Gi" and "85899345920" are the same); the text itself when
    it is not one."""
    value = parse_quantity(text)
    return text if value is None else value


def _canonical(value: Any) -> Any:
    """``value`` without what the API leaves out (empty, false and null fields)."""
    if isinstance(value, dict):
        return {k: c for k, v in value.items() if (c := _canonical(v)) not in (None, False, {}, [], "")}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _quantities(holder: Obj, *keys: str) -> None:
    """``holder``'s quantities at ``keys`` (a list of them too) as values, in place."""
    for key in keys:
        value = holder.get(key)
        if isinstance(value, str):
            holder[key] = quantity(value)
        elif isinstance(value, list):
            holder[key] = [quantity(v) if isinstance(v, str) else v for v in value]


def _counted(counters: Any) -> None:
    """Each counter's ``value`` of a ``counters`` map (a counter set's, a device's use of one) as a value."""
    for counter in (counters or {}).values() if isinstance(counters, dict) else ():
        if isinstance(counter, dict):
            _quantities(counter, "value")


def content(spec: Obj) -> Any:
    """What a slice says, for comparing: its spec without the pool's generation and the taints' stamps,
    quantities (capacities, request policies, counters) as values."""
    spec = copy.deepcopy(spec)
    (spec.get("pool") or {}).pop("generation", None)
    for counter_set in spec.get("sharedCounters") or []:
        if isinstance(counter_set, dict):
            _counted(counter_set.get("counters"))
    for device in spec.get("devices") or []:
        for capacity in (device.get("capacity") or {}).values():
            if not isinstance(capacity, dict):
                continue
            _quantities(capacity, "value")
            policy = capacity.get("requestPolicy")
            if isinstance(policy, dict):
                _quantities(policy, "default", "validValues")
                if isinstance(policy.get("validRange"), dict):
                    _quantities(policy["validRange"], "min", "max", "step")
        for taint in device.get("taints") or []:
            if isinstance(taint, dict):
                taint.pop("timeAdded", None)
        for use in device.get("consumesCounters") or []:
            if isinstance(use, dict):
                _counted(use.get("counters"))
    return _canonical(spec)


def dropped(written: Any, kept: Any, path: str = "") -> set[str]:
    """The fields of ``written`` that ``kept`` lacks (both as ``content`` gives them): their paths, keys
    joined by dots and a list's items as ``[]`` (``devices[].allowMultipleAllocations``,
    ``devices[].capacity.memory.requestPolicy``); a field missing whole is named, not what it held.
    A value the server changed is not dropped."""
    found: set[str] = set()
    if isinstance(written, dict) and isinstance(kept, dict):
        for key, value in written.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in kept:
                found.add(where)
            else:
                found |= dropped(value, kept[key], where)
    elif isinstance(written, list) and isinstance(kept, list):
        for ours, theirs in zip(written, kept):
            found |= dropped(ours, theirs, f"{path}[]")
    return found


def _paths(value: Any, path: str = "") -> Iterator[str]:
    """The path of every field in ``value`` (as ``dropped`` names them), each list item's as ``[]``."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            yield where
            yield from _paths(item, where)
    elif isinstance(value, list):
        for item in value:
            yield from _paths(item, f"{path}[]")


def named_fields(spec: Obj, message: str) -> frozenset[str]:
    """The fields of ``spec`` whose name (a path's last key) ``message`` holds as a word."""
    words = set(re.findall(r"[A-Za-z0-9_-]+", message))
    return frozenset(p for p in _paths(content(spec)) if p.rpartition(".")[2].removesuffix("[]") in words)


def stamps(slices: Iterable[Obj]) -> dict[TaintKey, str]:
    """(device, key, value, effect) -> timeAdded of every taint in these slices."""
    return {(str(device.get("name")), str(taint.get("key")), str(taint.get("value") or ""), str(taint.get("effect"))):
            taint["timeAdded"]
            for s in slices for device in (s.get("spec") or {}).get("devices") or []
            for taint in device.get("taints") or [] if isinstance(taint, dict) and taint.get("timeAdded")}


def resource_version(obj: Obj) -> int:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "0")
    return int(text) if text.isdigit() else 0


def generation(obj: Obj) -> int:
    """The pool generation a slice carries."""
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def driver(obj: Obj) -> str | None:
    value = (obj.get("spec") or {}).get("driver")
    return value if isinstance(value, str) else None
