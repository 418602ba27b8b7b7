"""For every built-in profile, the labels and the advertised resources tell the same story.

Both come from the same inventory and config; this test is what keeps GFD's known mismatch
(``gpu.replicas=1`` while the node advertises N replicas) from ever happening here. Profiles added
later are picked up automatically.
"""

from __future__ import annotations

from typing import Any

import pytest

from labeller.plugin.resources import (
    AMD_GPU,
    NVIDIA_GPU,
    Resource,
    advertised_resources,
)
from labeller.rules import node_labels
from tests.plugin.conftest import simulated
from vendors.simulate import builtin_profiles


def _find(resources: list[Resource], base: str) -> Resource | None:
    return next((r for r in resources if r.name in (base, f"{base}.shared")), None)


def _count(resource: Resource | None) -> int:
    return len(resource.devices) if resource else 0


def _check_sharing(labels: dict[str, str], prefix: str, resource: Resource | None, rename: bool) -> None:
    replicas = int(labels[f"{prefix}.replicas"])
    if resource is None or replicas <= 1:
        assert resource is None or not resource.shared
        return
    assert resource.replicas == replicas
    assert resource.name == (f"{prefix}.shared" if rename else prefix)
    assert labels[f"{prefix}.product"].endswith("-SHARED") is (not rename)
    assert labels[f"{prefix}.sharing-strategy"] in ("time-slicing", "mps")


RENAMED = {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 3},
                                                  {"name": "nvidia.com/mig-1g.5gb", "replicas": 2},
                                                  {"name": "amd.com/gpu", "replicas": 5}]}
VARIANTS: list[tuple[str, dict[str, Any] | None]] = [(p, None) for p in sorted(builtin_profiles())] + [
    ("t4-time-slicing", {"sharing": {"timeSlicing": RENAMED}}),
    ("dgx-h100", {"sharing": {"timeSlicing": {**RENAMED, "renameByDefault": False}}}),
    ("dgx-a100-mig-mixed", {"flags": {"migStrategy": "mixed"}, "sharing": {"timeSlicing": RENAMED}}),
    ("a100-mig-single", {"flags": {"migStrategy": "single"}, "sharing": {"timeSlicing": RENAMED}}),
    ("dgx-a100-mig-mixed", {"flags": {"migStrategy": "single"}}),  # invalid for single: count 0
    ("mi300x-x8-cpx", {"sharing": {"timeSlicing": RENAMED}}),
]


@pytest.mark.parametrize(("profile", "config_override"), VARIANTS)
def test_labels_agree_with_advertised_resources(profile: str, config_override: dict[str, Any] | None) -> None:
    with simulated(profile, config_override) as (inventory, config, _, _):
        labels = node_labels(inventory, config).labels
        resources = advertised_resources(inventory, config)
    rename = config.sharing.rename_by_default
    gpu = _find(resources, NVIDIA_GPU)
    if "nvidia.com/gpu.count" in labels:
        count, replicas = int(labels["nvidia.com/gpu.count"]), max(int(labels["nvidia.com/gpu.replicas"]), 1)
        if config.mig_strategy == "mixed" and inventory.nvidia is not None:
            # GFD's gpu.count counts MIG-enabled GPUs too (k8s-device-plugin#738); they are advertised as MIG
            count -= sum(1 for g in inventory.nvidia.gpus if g.mig_enabled)
        assert count * replicas == _count(gpu), f"{profile}: labels say {count}x{replicas}, advertised {_count(gpu)}"
        _check_sharing(labels, NVIDIA_GPU, gpu, rename)
    else:
        assert gpu is None
    mig_labels = {k[: -len(".count")] for k in labels if k.startswith("nvidia.com/mig-") and k.endswith(".count")}
    migs = {r.name.removesuffix(".shared") for r in resources if r.name.startswith("nvidia.com/mig-")}
    assert mig_labels == migs
    for prefix in mig_labels:
        resource = _find(resources, prefix)
        assert int(labels[f"{prefix}.count"]) * max(int(labels[f"{prefix}.replicas"]), 1) == _count(resource)
        _check_sharing(labels, prefix, resource, rename)
    amd = _find(resources, AMD_GPU)
    assert (labels.get("amd.com/gpu.present") == "true") is (amd is not None)
    if amd is not None and config.labels.amd_beta:
        # beta.amd.com/gpu.simd-count.<value>=<count> counts KFD compute nodes: the advertised devices;
        # beta.amd.com/gpu.device-id.<id>=<count> counts physical GPUs
        nodes = sum(int(v) for k, v in labels.items() if k.startswith("beta.amd.com/gpu.simd-count."))
        assert nodes * amd.replicas == len(amd.devices)
        gpus = sum(int(v) for k, v in labels.items() if k.startswith("beta.amd.com/gpu.device-id."))
        assert gpus == len({d.physical.gpu for d in amd.devices})


def test_every_profile_is_covered() -> None:
    assert len(builtin_profiles()) >= 7  # the loop above must not silently test nothing
