"""The labels and the advertised resources tell the same story: one derivation, checked on every
built-in profile under a matrix of configs, and through the real CLI."""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from labeller.model.config import Config, parse_config
from labeller.model.inventory import Inventory
from labeller.host.machine import NodeOptions, open_host
from labeller.model.offer import Offer, Resource
from tests.builders import label_set_of, mps_ready, offer_of
from tests.core.cli import in_process
from vendors import RESOURCE_NAMES
from vendors.amd.settings import AmdSettings
from vendors.nvidia.model import NvidiaInventory
from vendors.simulate import builtin_profiles

PROFILES = sorted(builtin_profiles())
MIG_STRATEGIES = ("none", "single", "mixed")
SHARING = (None, 2, 4)  # no sharing, time-slicing with 2 or 4 replicas
RENAME = (False, True)


@cache
def inventory_of(profile: str) -> Inventory:
    with open_host(NodeOptions(simulate=profile)) as node:
        return node.probe()


def config_for(inventory: Inventory, mig: str, replicas: int | None, rename: bool) -> Config:
    """The matrix config; time-slicing shares every base resource the node could offer."""
    raw: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": mig}}
    if replicas is not None:
        bases = {r.base for r in offer_of(inventory, parse_config(raw, RESOURCE_NAMES)).resources} or {"nvidia.com/gpu"}
        raw["sharing"] = {"timeSlicing": {"renameByDefault": rename,
                                          "resources": [{"name": b, "replicas": replicas} for b in sorted(bases)]}}
    return parse_config(raw, RESOURCE_NAMES)


def check_base(labels: dict[str, str], offer: Offer, base: str) -> None:
    """The ``<base>.*`` labels describe every resource offered under ``base``: count the distinct
    devices, shared-count those replicated, replicas how many each of them is advertised as."""
    resources = offer.of_base(base)
    physical = {d.physical.health_key for r in resources for d in r.devices}
    shared = [r for r in resources if r.shared]
    count, replicas = int(labels[f"{base}.count"]), int(labels[f"{base}.replicas"])
    assert count == len(physical), base
    assert len(shared) <= 1 and len(resources) - len(shared) <= 1
    shared_count = int(labels.get(f"{base}.shared-count", count if shared else 0))
    assert shared_count == (len(shared[0].physical_devices) if shared else 0), base
    assert (count - shared_count) + shared_count * max(replicas, 1) == sum(len(r.devices) for r in resources)
    assert labels[f"{base}.sharing-strategy"] == (shared[0].strategy if shared else "none")
    assert labels[f"{base}.product"].endswith("-SHARED") is bool(shared and not shared[0].renamed)
    assert (f"{base}.shared-count" in labels) is bool(shared and len(resources) == 2)


def check_amd_nodes(labels: dict[str, str], offer: Offer, config: Config) -> None:
    """beta.amd.com/gpu.simd-count.<value>=<count> counts the KFD compute nodes every AMD resource offers."""
    if not config.section(AmdSettings).beta_labels or not offer.of_vendor("amd"):
        return
    nodes = sum(int(v) for k, v in labels.items() if k.startswith("beta.amd.com/gpu.simd-count."))
    assert nodes == len({d.physical.health_key for r in offer.of_vendor("amd") for d in r.devices})


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
    if not config.section(AmdSettings).beta_labels or not resources:
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
    assert len(SHARING_MATRIX) == len(PROFILES) * len(SHARING_KINDS)


# --- subsets, renames, MPS and AMD naming: every base shared in part, by each kind ----------------

def _subset(group: list[str], kind: str) -> Any:
    """A ``devices`` value selecting about half of ``group`` (its visible IDs, in order)."""
    if kind == "count":
        return max(1, len(group) // 2)
    return group[::2]  # every other device, by its visible ID (a UUID, an index or a PCI address)


SHARING_KINDS = ("subset-count-rename", "subset-list-by-default", "mps-ready", "mps-ready-subset", "mps-waiting",
                 "amd-mixed-shared")


def sharing_config(inventory: Inventory, kind: str) -> Config:
    base_config = {"version": "v1", "flags": {"migStrategy": "single" if kind.startswith("mps") else "mixed"}}
    if kind == "amd-mixed-shared":
        base_config["labeller"] = {"amd": {"resourceNamingStrategy": "mixed"}}
    offer = offer_of(inventory, parse_config(base_config, RESOURCE_NAMES))
    groups = {r.base: [d.id for d in r.devices] for r in offer.resources}
    raw: dict[str, Any] = dict(base_config)
    if kind.startswith("mps"):
        entry: dict[str, Any] = {"name": "nvidia.com/gpu", "replicas": 3}
        if kind == "mps-ready-subset" and "nvidia.com/gpu" in groups:
            entry |= {"devices": _subset(groups["nvidia.com/gpu"], "list"), "rename": "gpu-mps"}
        raw["sharing"] = {"mps": {"resources": [entry]}}
    elif kind == "amd-mixed-shared":
        raw["sharing"] = {"timeSlicing": {"renameByDefault": True, "resources": [
            {"name": b, "replicas": 2, "devices": _subset(g, "count")} for b, g in groups.items() if b.startswith("amd")
        ] or [{"name": "amd.com/gpu", "replicas": 2}]}}
    else:
        how = "count" if kind == "subset-count-rename" else "list"
        entries = [{"name": b, "replicas": 3, "devices": _subset(g, how)} for b, g in sorted(groups.items())]
        if kind == "subset-count-rename":
            entries = [e | {"rename": f"{e['name'].partition('/')[2]}-ts"} for e in entries]
        raw["sharing"] = {"timeSlicing": {"renameByDefault": kind.endswith("by-default"),
                                          "resources": entries or [{"name": "nvidia.com/gpu", "replicas": 3}]}}
    return parse_config(raw, RESOURCE_NAMES)


SHARING_MATRIX = list(itertools.product(PROFILES, SHARING_KINDS))


@pytest.mark.parametrize(("profile", "kind"), SHARING_MATRIX)
def test_labels_agree_with_what_is_advertised_when_sharing_subsets(profile: str, kind: str) -> None:
    inventory = inventory_of(profile)
    config = sharing_config(inventory, kind)
    if kind in ("mps-ready", "mps-ready-subset") and inventory.part(NvidiaInventory) is not None:
        inventory = mps_ready(inventory, config)
    offer = offer_of(inventory, config)
    result = label_set_of(inventory, config)
    assert result.conflicts == [] and result.dropped == {}
    labels = result.labels
    for base in dict.fromkeys(r.base for r in offer.of_vendor("nvidia")):
        check_base(labels, offer, base)
    mps_offered = any(r.strategy == "mps" for r in offer.resources)
    if inventory.part(NvidiaInventory) is not None:
        assert labels["nvidia.com/mps.capable"] == str(mps_offered).lower()
    if kind == "mps-waiting":
        assert not mps_offered and all(h.waiting or "MIG" in h.reason for h in offer.held)
    if kind.startswith("mps-ready") and offer.held:
        assert all("MIG" in h.reason for h in offer.held), offer.held  # only what MPS can never share
    check_amd_nodes(labels, offer, config)
    # every device the node offers unshared is offered, once, whatever the sharing config
    naming = {"resourceNamingStrategy": config.section(AmdSettings).resource_naming}
    plain = offer_of(inventory, parse_config({"flags": {"migStrategy": config.mig_strategy},
                                              "labeller": {"amd": naming}}, RESOURCE_NAMES))
    held = {d.physical.health_key for h in offer.held for d in h.resource.devices}
    assert {d.physical.health_key for r in offer.resources for d in r.devices} | held == \
           {d.physical.health_key for r in plain.resources for d in r.devices}


def cli(*args: str) -> Any:
    result = in_process(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(("profile", "config"), [
    ("a100-mig-single", {"flags": {"migStrategy": "none"},
                         "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}),
    ("dgx-a100-mig-mixed", {"flags": {"migStrategy": "mixed"}}),
    ("mi300x-x8-cpx", {"sharing": {"timeSlicing": {"renameByDefault": True,
                                                   "resources": [{"name": "amd.com/gpu", "replicas": 2}]}}}),
    ("dgx-h100", {"sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4, "devices": [0, 5], "rename": "gpu-ts"}]}}}),
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
            count = int(labels[f"{base}.count"])
            shared = int(labels.get(f"{base}.shared-count", count))  # a subset: only these are replicated
            if resource["replicas"] > 1:
                assert shared * resource["replicas"] == resource["count"]
            else:  # the whole devices: all of them, or those a shared subset leaves
                assert (count - shared if f"{base}.shared-count" in labels else count) == resource["count"]
            assert labels[f"{base}.replicas"] == str(max(r["replicas"] for r in resources if r["base"] == base))
        else:
            nodes = sum(int(v) for k, v in labels.items() if k.startswith("beta.amd.com/gpu.simd-count."))
            assert nodes * resource["replicas"] == resource["count"]
