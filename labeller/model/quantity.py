"""Kubernetes quantities ("14Gi", "2k", "1e3", "500m"), read as the API server reads them (pure).

One parser for every place a quantity comes from the API: node capacities, pod limits, DRA device
capacities. A count of an extended resource (``aliyun.com/gpu-mem``, ``nvidia.com/gpu``) is a whole
number: ``whole`` rounds a fraction up, as ``resource.Quantity.Value()`` does.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:([KMGTPE]i)|([numkMGTPE])|[eE]([+-]?\d+))?")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_EXPONENT = 30  # the API server refuses larger ones; a bigger one here is not a quantity


def parse(value: Any) -> Fraction | None:
    """The quantity's exact value, or None when ``value`` is not a quantity (JSON numbers are read too)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        return None
    number, binary, decimal, exponent = match.groups()
    if binary:
        return Fraction(number) * Fraction(1024) ** _BINARY[binary]
    power = _DECIMAL[decimal] if decimal else int(exponent or 0)
    if abs(power) > _MAX_EXPONENT:
        return None
    return Fraction(number) * Fraction(10) ** power


def whole(value: Any) -> int:
    """An extended resource's count: the quantity rounded up to a whole number (``500m`` is 1), 0 for
    a negative one or anything that is not a quantity."""
    if type(value) is int:  # JSON's 4, and the 0 read for an absent resource: no parsing (the extender's hot path)
        return max(value, 0)
    if type(value) is str and value.isascii() and value.isdigit():  # "4"
        return int(value)
    parsed = parse(value)
    return 0 if parsed is None or parsed <= 0 else math.ceil(parsed)
