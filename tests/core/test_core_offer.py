"""The labels and the advertised resources tell the same story: one derivation, checked on every
built-in profile under a matrix of configs, and through the real CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest


from labeller.config import Config, parse_config
from labeller.inventory import Inventory
from labeller.node import open_node
from labeller.offer import Resource
from tests.builders import label_set_of, offer_of
from vendors.nvidia.model import NvidiaInventory
from vendors.simulate import builtin_profiles

PROFILES = sorted(builtin_profiles())
MIG_STRATEGIES = ("none", "single", "mixed")
SHARING = (None, 2, 4)  # no sharing, time-slicing with 2 or 4 replicas
RENAME = (False, True)


@cache
def inventory_of(profile: str) -> Inventory:
    with open_node(Path("/"), profile, None) as node:
        return node.probe()


def config_for(inventory: Inventory, mig: str, replicas: int | None, rename: bool) -> Config:
    """The matrix config; time-slicing shares every base resource the node could offer."""
    raw: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": mig}}
    if replicas is not None:
        bases = {r.base for r in offer_of(inventory, parse_config(raw)).resources} or {"nvidia.com/gpu"}
        raw["sharing"] = {"timeSlicing": {"renameByDefault": rename,
                                          "resources": [{"name": b, "replicas": replicas} for b in sorted(bases)]}}
    return parse_config(raw)


def check_nvidia(labels: dict[str, str], resource: Resource, replicas: int | None, rename: bool) -> None:
    prefix = resource.base
    count, label_replicas = int(labels[f"{prefix}.count"]), int(labels[f"{prefix}.replicas"])
    assert count * max(label_replicas, 1) == len(resource.devices), prefix
    assert count == len(resource.physical_devices)
    shared = replicas is not None and replicas > 1
    assert label_replicas == (replicas if shared else 1)
    assert resource.name == (f"{prefix}.shared" if shared and rename else prefix)
    assert labels[f"{prefix}.product"].endswith("-SHARED") is (shared and not rename)
    assert labels[f"{prefix}.sharing-strategy"] == ("time-slicing" if shared else "none")


def check_amd(labels: dict[str, str], resources: tuple[Resource, ...], config: Config) -> None:
    if not config.labels.amd_beta or not resources:
        return
    (resource,) = resources
    # beta.amd.com/gpu.simd-count.<value>=<count> counts KFD compute nodes: the advertised devices;
    # beta.amd.com/gpu.device-id.<id>=<count> counts physical GPUs
    nodes = sum(int(v) for k, v in labels.items() if k.startswith("beta.amd.com/gpu.simd-count."))
    assert nodes * resource.replicas == len(resource.devices)
    gpus = sum(int(v) for k, v in labels.items() if k.startswith("beta.amd.com/gpu.device-id."))
    assert gpus == len({d.physical.gpu for d in resource.devices})


MATRIX = list(itertools.product(PROFILES, MIG_STRATEGIES, SHARING, RENAME))


@pytest.mark.parametrize(("profile", "mig", "replicas", "rename"), MATRIX)
def test_labels_agree_with_what_is_advertised(profile: str, mig: str, replicas: int | None, rename: bool) -> None:
    inventory = inventory_of(profile)
    config = config_for(inventory, mig, replicas, rename)
    offer = offer_of(inventory, config)
    result = label_set_of(inventory, config)
    assert result.conflicts == [] and result.dropped == {}
    labels = result.labels
    nvidia = [r for r in offer.resources if r.vendor == "nvidia"]
    for resource in nvidia:
        check_nvidia(labels, resource, replicas, rename)
    mig_labels = {k.removesuffix(".count") for k in labels if k.startswith("nvidia.com/mig-") and k.endswith(".count")}
    assert mig_labels == {r.base for r in nvidia if r.base.startswith("nvidia.com/mig-")}
    if "nvidia.com/gpu.count" in labels and offer.resource("nvidia.com/gpu") is None:
        assert labels["nvidia.com/gpu.count"] == "0"  # a count is never claimed for what is not advertised
    check_amd(labels, offer.of_vendor("amd"), config)


@pytest.mark.parametrize("profile", PROFILES)
def test_strategy_none_offers_every_gpu_nvml_describes(profile: str) -> None:
    inventory = inventory_of(profile)
    part = inventory.part(NvidiaInventory)
    gpu = offer_of(inventory, config_for(inventory, "none", None, False)).resource("nvidia.com/gpu")
    assert len(gpu.devices if gpu else ()) == len(part.gpus if part else ())


def test_the_matrix_covers_every_profile_and_config() -> None:
    assert len(PROFILES) >= 10 and len(MATRIX) == len(PROFILES) * 18  # the loop must not silently test nothing


def cli(*args: str) -> Any:
    result = subprocess.run([sys.executable, "-m", "labeller.cli", *args, "--format", "json"], capture_output=True,
                            text=True, timeout=60, check=True)
    return json.loads(result.stdout)


@pytest.mark.parametrize(("profile", "config"), [
    ("a100-mig-single", {"flags": {"migStrategy": "none"},
                         "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}),
    ("dgx-a100-mig-mixed", {"flags": {"migStrategy": "mixed"}}),
    ("mi300x-x8-cpx", {"sharing": {"timeSlicing": {"renameByDefault": True,
                                                   "resources": [{"name": "amd.com/gpu", "replicas": 2}]}}}),
])
def test_the_resources_and_labels_commands_tell_the_same_story(profile: str, config: dict[str, Any],
                                                               tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"version": "v1", **config}))
    labels = cli("labels", "--simulate", profile, "--config", str(path))
    resources = cli("resources", "--simulate", profile, "--config", str(path))["resources"]
    for resource in resources:
        if resource["vendor"] == "nvidia":
            base = resource["base"]
            assert int(labels[f"{base}.count"]) * resource["replicas"] == resource["count"]
            assert labels[f"{base}.replicas"] == str(resource["replicas"])
        else:
            nodes = sum(int(v) for k, v in labels.items() if k.startswith("beta.amd.com/gpu.simd-count."))
            assert nodes * resource["replicas"] == resource["count"]
