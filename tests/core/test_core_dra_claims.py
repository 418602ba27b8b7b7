"""The ResourceClaim examples of docs/dra.md, allocated against the ResourceSlices of every built-in profile.

Each example's CEL is evaluated as the scheduler does (cel-python, with Kubernetes' ``quantity`` and
``compareTo``): the DeviceClass's selector, then the request's; a request takes ``count`` distinct
devices; ``matchAttribute`` wants one value, present on every device it covers; an evaluation error
fails the claim on that node. The test holds which profiles can satisfy each example."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy  # cel-python, from the test extra
import pytest
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from labeller.host.machine import NodeOptions, open_host
from labeller.model.resourceslices import resource_slices
from vendors.simulate import builtin_profiles

DRA_PAGE = Path(__file__).resolve().parents[2] / "docs" / "dra.md"
# As the vendors' charts define them (NVIDIA's k8s-dra-driver-gpu, AMD's k8s-gpu-dra-driver).
DEVICE_CLASSES = {
    "gpu.nvidia.com": 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"',
    "mig.nvidia.com": 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"',
    "gpu.amd.com": 'device.driver == "gpu.amd.com"',
}
EXPECTED = {  # example -> the built-in profiles where it can be allocated
    "h100-40gi": {"dgx-h100", "dgx-h100-4of8-shared"},
    "any-40gi": {"dgx-h100", "dgx-h100-4of8-shared", "h100-pcie-driver-2part", "h200-passthrough", "hgx-h20",
                 "l40s-x4-mps", "mixed-l40s-mi210", "p6-b200-mig-mixed"},
    "mig-1g-5gb": {"a100-mig-single", "dgx-a100-mig-dynamic", "dgx-a100-mig-mixed"},
    "gpu-test4": {"dgx-a100-mig-dynamic", "dgx-a100-mig-mixed"},
    "two-partitions-one-gpu": {"mi300x-x8-cpx", "mi300x-x8-cpx-mixed"},
    "four-gpus-one-numa-node": {"mi300x-x8-spx"},
    "datacenter-gpu": {"dgx-a100-mig-dynamic", "dgx-a100-mig-mixed", "dgx-h100", "dgx-h100-4of8-shared",
                       "h100-pcie-driver-2part", "h200-passthrough", "hgx-h20", "l40s-x4-mps", "mixed-l40s-mi210",
                       "p6-b200-mig-mixed", "t4-time-slicing", "t4-x4-gpushare"},
    "two-gpus-one-pcie-root": {"dgx-a100-mig-dynamic", "dgx-a100-mig-mixed", "dgx-h100", "dgx-h100-4of8-shared",
                               "hgx-h20", "p6-b200-mig-mixed", "t4-x4-gpushare"},
}

_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30,
             "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}


def parse_quantity(text: str) -> int:
    number, suffix = re.fullmatch(r"(\d+)([A-Za-z]*)", text).groups()  # type: ignore[union-attr]
    return int(number) * _SUFFIXES[suffix]


def _quantity(text: Any) -> Any:
    return celtypes.IntType(parse_quantity(str(text)))


def _compare_to(left: Any, right: Any) -> Any:
    return celtypes.IntType((left > right) - (left < right))


class Cel:
    def __init__(self) -> None:
        self.env = celpy.Environment()
        self.programs: dict[str, Any] = {}

    def matches(self, expression: str, device: dict[str, Any]) -> bool:
        """True or False; CELEvalError when the expression cannot be evaluated on ``device``."""
        if expression not in self.programs:
            self.programs[expression] = self.env.program(self.env.compile(expression),
                                                         functions={"quantity": _quantity, "compareTo": _compare_to})
        result = self.programs[expression].evaluate({"device": device})
        if isinstance(result, CELEvalError):
            raise result
        return bool(result)


def cel_device(driver: str, published: dict[str, Any]) -> dict[str, Any]:
    """A published device as CEL sees it: attributes and capacities by domain (a short name is the driver's)."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in published.get("attributes", {}).items():
        domain, _, short = name.rpartition("/")
        attributes.setdefault(domain or driver, {})[short] = next(iter(value.values()))
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in published.get("capacity", {}).items():
        domain, _, short = name.rpartition("/")
        capacity.setdefault(domain or driver, {})[short] = parse_quantity(value["value"])
    return {"driver": driver, "attributes": attributes, "capacity": capacity, "_name": published["name"]}


def attribute_of(device: dict[str, Any], qualified: str) -> Any:
    domain, _, name = qualified.rpartition("/")
    return device["attributes"].get(domain, {}).get(name)


def allocate(claim: dict[str, Any], devices: list[dict[str, Any]], cel: Cel) -> list[str] | None:
    """The device names a claim gets on a node with ``devices``, or None when nothing satisfies it."""
    requests = claim["devices"]["requests"]
    constraints = claim["devices"].get("constraints", [])
    candidates = []
    for request in requests:
        exactly = request["exactly"]
        selectors = [DEVICE_CLASSES[exactly["deviceClassName"]],
                     *(s["cel"]["expression"] for s in exactly.get("selectors", []))]
        fitting = []
        for device in devices:
            activation = json_to_cel({k: v for k, v in device.items() if k != "_name"})
            if all(cel.matches(expression, activation) for expression in selectors):
                fitting.append(device)
        candidates.append((request["name"], exactly.get("count", 1), fitting))

    def consistent(chosen: dict[str, list[dict[str, Any]]]) -> bool:
        for constraint in constraints:
            values = [attribute_of(d, constraint["matchAttribute"]) for name in constraint["requests"]
                      for d in chosen.get(name, [])]
            if any(v is None for v in values) or len(set(values)) > 1:
                return False
        return True

    def search(index: int, chosen: dict[str, list[dict[str, Any]]], used: set[str]) -> Iterator[list[str]]:
        if index == len(candidates):
            yield [d["_name"] for picked in chosen.values() for d in picked]
            return
        name, count, fitting = candidates[index]

        def pick(start: int, picked: list[dict[str, Any]]) -> Iterator[list[str]]:
            if len(picked) == count:
                yield from search(index + 1, {**chosen, name: picked}, used | {d["_name"] for d in picked})
                return
            for i in range(start, len(fitting)):
                device = fitting[i]
                if device["_name"] not in used and consistent({**chosen, name: [*picked, device]}):
                    yield from pick(i + 1, [*picked, device])

        yield from pick(0, [])

    return next(search(0, {}, set()), None)


def doc_claims() -> dict[str, dict[str, Any]]:
    """The ResourceClaimTemplates of docs/dra.md, by name."""
    section = DRA_PAGE.read_text()
    claims = {}
    for block in re.findall(r"```yaml\n(.*?)```", section, re.DOTALL):
        document = yaml.safe_load(block)
        if document.get("kind") == "ResourceClaimTemplate":
            claims[document["metadata"]["name"]] = document["spec"]["spec"]
    return claims


def profile_devices(profile: str) -> list[dict[str, Any]]:
    with open_host(NodeOptions(simulate=profile)) as host:
        inventory = host.probe()
        slices = resource_slices("node", host.dra_devices(inventory, host.offer(inventory), every_vendor=True))
    return [cel_device(s["spec"]["driver"], d) for s in slices for d in s["spec"]["devices"]]


def test_every_doc_claim_is_checked() -> None:
    assert set(doc_claims()) == set(EXPECTED)


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_a_doc_claim_lands_on_the_profiles_it_says(example: str) -> None:
    claim, cel = doc_claims()[example], Cel()
    satisfied = set()
    for profile in sorted(builtin_profiles()):
        devices = profile_devices(profile)
        try:
            if allocate(claim, devices, cel) is not None:
                satisfied.add(profile)
        except CELEvalError as error:
            pytest.fail(f"{example} on {profile}: evaluation error {error}")
    assert satisfied == EXPECTED[example]


def test_two_partitions_of_one_gpu_share_its_bus_id_and_four_gpus_share_a_numa_node() -> None:
    claims, cel = doc_claims(), Cel()
    partitions = allocate(claims["two-partitions-one-gpu"], profile_devices("mi300x-x8-cpx"), cel)
    devices = {d["_name"]: d for d in profile_devices("mi300x-x8-cpx")}
    assert partitions is not None and len(set(partitions)) == 2
    assert len({attribute_of(devices[name], "resource.kubernetes.io/pciBusID") for name in partitions}) == 1
    spx = {d["_name"]: d for d in profile_devices("mi300x-x8-spx")}
    four = allocate(claims["four-gpus-one-numa-node"], list(spx.values()), cel)
    assert four is not None and len(set(four)) == 4
    assert len({attribute_of(spx[name], "gpu.amd.com/numaNode") for name in four}) == 1


def test_two_gpus_under_one_root_complex_share_it_and_no_root_is_no_match() -> None:
    claims, cel = doc_claims(), Cel()
    h100 = {d["_name"]: d for d in profile_devices("dgx-h100")}
    two = allocate(claims["two-gpus-one-pcie-root"], list(h100.values()), cel)
    assert two is not None and len(set(two)) == 2
    assert len({attribute_of(h100[name], "resource.kubernetes.io/pcieRoot") for name in two}) == 1
    assert len({attribute_of(d, "resource.kubernetes.io/pcieRoot") for d in h100.values()}) > 1  # not one root for all
    rootless = [{**d, "attributes": {**d["attributes"], "resource.kubernetes.io": {}}} for d in h100.values()]
    assert allocate(claims["two-gpus-one-pcie-root"], rootless, cel) is None


def test_the_allocator_here_refuses_what_the_scheduler_refuses() -> None:
    """The harness itself: a device without the matched attribute, or one device for two requests, never fits."""
    cel = Cel()
    lonely = [cel_device("gpu.amd.com", {"name": "gpu-0-128", "attributes": {"type": {"string": "amdgpu-partition"}}})]
    assert allocate(doc_claims()["two-partitions-one-gpu"], lonely, cel) is None
    two_without_bus = lonely + [cel_device("gpu.amd.com", {"name": "gpu-1-129",
                                                           "attributes": {"type": {"string": "amdgpu-partition"}}})]
    assert allocate(doc_claims()["two-partitions-one-gpu"], two_without_bus, cel) is None
