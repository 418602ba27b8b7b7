"""Quantities read as the Kubernetes API server reads them (resource.Quantity): the suffixes, the
exponents, fractions rounded up for whole-number resources; gpushare's units, the extender's node
capacity and the DRA capacities all go through the one parser."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from labeller.model import gpushare, quantity
from labeller.apps.extender.cache import node_gpus

# (text, exact value, whole value as Quantity.Value() gives it)
TABLE: list[tuple[Any, Fraction | None, int]] = [
    ("4000", Fraction(4000), 4000),
    ("2k", Fraction(2000), 2000),
    ("4k", Fraction(4000), 4000),
    ("14Gi", Fraction(14 * 2**30), 14 * 2**30),
    ("1Ki", Fraction(1024), 1024),
    ("1M", Fraction(10**6), 10**6),
    ("1e3", Fraction(1000), 1000),
    ("1E3", Fraction(1000), 1000),
    ("1E", Fraction(10**18), 10**18),
    ("500m", Fraction(1, 2), 1),
    ("1.5", Fraction(3, 2), 2),
    (".5k", Fraction(500), 500),
    ("+7", Fraction(7), 7),
    ("-1", Fraction(-1), 0),
    (" 12 ", Fraction(12), 12),
    (16, Fraction(16), 16),
    (0, Fraction(0), 0),
    (-3, Fraction(-3), 0),
    ("0042", Fraction(42), 42),
    (False, None, 0),
    ("", None, 0),
    ("2kb", None, 0),
    ("Gi", None, 0),
    ("1e99999", None, 0),
    (True, None, 0),
    (None, None, 0),
    ([1], None, 0),
]


@pytest.mark.parametrize(("text", "value", "units"), TABLE)
def test_quantities_read_as_kubernetes_reads_them(text: Any, value: Fraction | None, units: int) -> None:
    assert quantity.parse(text) == value
    assert quantity.whole(text) == units


def test_gpushare_units_and_node_capacity_take_suffixes() -> None:
    pod = {"spec": {"containers": [{"name": "a", "resources": {"limits": {gpushare.RESOURCE_MEM: "4k"}}},
                                   {"name": "b", "resources": {"requests": {gpushare.RESOURCE_MEM: "1e3"}}}]}}
    assert gpushare.container_requests(pod) == [("a", 4000), ("b", 1000)]
    node = {"status": {"capacity": {gpushare.RESOURCE_MEM: "2k", gpushare.RESOURCE_COUNT: "2"}}}
    assert node_gpus(node) == (2, 1000)
