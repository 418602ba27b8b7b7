"""``gpu-labeller explain``: every label any built-in profile produces says where it came from,
from the derivation the labels come from; keys not produced say why; unknown keys get the closest."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from labeller.model.config import Config, parse_config
from labeller.host.explain import catalog, explain, find
from labeller.model.inventory import Inventory
from labeller.model.labels import LabelSet
from labeller.model.namedconfigs import Selection
from labeller.host.machine import NodeOptions, open_host
from labeller.model.nodelabels import node_labels
from labeller.model.sharing import derive
from tests.builders import label_set_of, mps_ready, nvidia, nvidia_gpu
from tests.core.cli import in_process
from vendors import RESOURCE_NAMES, VENDORS
from vendors.amd.settings import AmdSettings
from vendors.nvidia.settings import NvidiaSettings
from vendors.simulate import builtin_profiles

PROFILES = sorted(builtin_profiles())
ENTRIES = catalog(VENDORS)


@cache
def profile(name: str) -> tuple[Inventory, Config]:
    with open_host(NodeOptions(simulate=name)) as node:
        return node.probe(), node.config


def every_label_set(name: str) -> list[tuple[str, LabelSet, Inventory, Config]]:
    """The profile's labels as shipped, with its MPS daemon serving, with every optional group on,
    and under a named config (the state labels)."""
    inventory, config = profile(name)
    everything = (config.with_section(replace(config.section(NvidiaSettings), timestamp_label=True))
                  .with_section(replace(config.section(AmdSettings), firmware_labels=True)))
    out = []
    for variant, cfg in (("as shipped", config), ("all groups", everything)):
        out.append((variant, label_set_of(inventory, cfg), inventory, cfg))
    if config.sharing.strategy == "mps":
        served = mps_ready(inventory, config)
        out.append(("mps served", label_set_of(served, config), served, config))
    named = label_set_of(inventory, config)
    state = Selection("time-sliced", config, wanted="time-sliced").labels()
    named.labels.update(state.labels)
    named.sources.update(state.sources)
    out.append(("named config", named, inventory, config))
    return out


@pytest.mark.parametrize("name", PROFILES)
def test_explain_covers_every_key_a_builtin_profile_produces(name: str) -> None:
    for variant, label_set, inventory, config in every_label_set(name):
        assert all(type(value) is str for value in label_set.labels.values()), variant  # plain values only
        for item in explain((), label_set, inventory, config, VENDORS, selection_in_use=True):
            where = f"{name} ({variant}): {item.key}"
            assert item.value == label_set.labels[item.key], where
            assert item.provenance is not None, where
            # a source of its own, not the labeler's docstring: the backend read and what it said
            assert item.provenance.backend != "rules" and item.provenance.source, where
            entry = find(item.key, ENTRIES)
            assert entry is not None and entry.doc.writer == "gpu-labeller", where
            assert item.upstream, where


def test_the_keys_added_recently_are_explained() -> None:
    keys = {key for name in PROFILES for _, label_set, _, _ in every_label_set(name) for key in label_set.labels}
    assert {"nvidia.com/gpu.shared-count", "nvidia.com/mps.capable", "nvidia.com/device-plugin.config.state",
            "nvidia.com/device-plugin.config.applied", "nvidia.com/gfd.timestamp"} <= keys
    served = mps_ready(*profile("l40s-x4-mps"))
    [mps] = explain(["nvidia.com/mps.capable"], label_set_of(served, profile("l40s-x4-mps")[1]), served,
                    profile("l40s-x4-mps")[1], VENDORS)
    assert mps.value == "true" and "MPS replicas advertised under nvidia.com/gpu" in (mps.provenance.source if
                                                                                      mps.provenance else "")


def test_sources_name_the_call_the_gpu_and_the_rule() -> None:
    inventory, config = profile("dgx-h100-4of8-shared")
    label_set = label_set_of(inventory, config)
    keys = ["nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.shared-count", "nvidia.com/gpu.present"]
    found = {e.key: e for e in explain(keys, label_set, inventory, config, VENDORS)}
    product = found["nvidia.com/gpu.product"].provenance
    assert product is not None and product.source.startswith("nvmlDeviceGetName(GPU 0 (GPU-")
    assert "sanitise" in product.rule
    memory = found["nvidia.com/gpu.memory"].provenance
    assert memory is not None and "85520809984 bytes" in memory.source and "2^20" in memory.rule
    assert found["nvidia.com/gpu.shared-count"].upstream.startswith("none: gpu-labeller's own")
    presence = found["nvidia.com/gpu.present"]
    assert presence.provenance is not None and "[10de:2330] class 0302" in presence.provenance.source
    assert "GPU Operator" in presence.upstream


def test_amd_sources_name_the_sysfs_files() -> None:
    inventory, config = profile("mi300x-x8-spx")
    found = {e.key: e for e in explain(["amd.com/gpu.vram", "beta.amd.com/gpu.cu-count.304"],
                                       label_set_of(inventory, config), inventory, config, VENDORS)}
    vram = found["amd.com/gpu.vram"].provenance
    assert vram is not None and vram.backend == "sysfs" and "mem_banks/0/properties size_in_bytes" in vram.source
    assert "halves away from zero" in vram.rule
    count = found["beta.amd.com/gpu.cu-count.304"].provenance
    assert count is not None and "8 of 8 KFD node(s)" in count.rule
    assert "AMD k8s-node-labeller" in found["amd.com/gpu.vram"].upstream


def why(key: str, label_set: LabelSet, inventory: Inventory, config: Config) -> str:
    [item] = explain([key], label_set, inventory, config, VENDORS)
    assert item.value is None and item.known
    return item.why_not


@pytest.mark.parametrize("key", ["amd.com/gpu.vram", "beta.amd.com/gpu.vram", "beta.amd.com/gpu.vram.64G"])
def test_a_value_the_probe_lacks_is_the_reason_given(key: str) -> None:
    """mi210-x8's capture has no VRAM size (``probe``: vram_bytes null): that is why, not disagreement."""
    inventory, config = profile("mi210-x8")
    reason = why(key, label_set_of(inventory, config), inventory, config)
    assert reason.startswith("the probe found no VRAM size"), reason
    assert "vram_bytes" in reason and "mem_banks/0/properties" in reason and "agree" not in reason


def test_keys_not_produced_say_why() -> None:
    inventory, config = profile("dgx-h100")
    labels = label_set_of(inventory, config)
    assert why("nvidia.com/mig.strategy", labels, inventory, config).endswith("single or mixed (now: none)")
    assert "gpu.shared-count" not in labels.labels
    assert "shares only some of the GPUs" in why("nvidia.com/gpu.shared-count", labels, inventory, config)
    assert why("amd.com/gpu.vram", labels, inventory, config).startswith("no amd GPU on this node")
    assert "owned by the NVIDIA GPU Operator" in why("nvidia.com/gpu.deploy.driver", labels, inventory, config)
    assert "owned by the NVIDIA GPU Operator" in why("nvidia.com/mig.config", labels, inventory, config)
    assert "owned by the NVIDIA GPU Operator" in why("nvidia.com/mig.config.state", labels, inventory, config)
    assert "Node Feature Discovery" in why("feature.node.kubernetes.io/pci-10de.present", labels, inventory, config)
    assert "owned by people or the GPU Operator" in why("nvidia.com/device-plugin.config", labels, inventory, config)
    assert "mig-<profile>" not in why("nvidia.com/mig-1g.10gb.count", labels, inventory, config)
    assert "flags.migStrategy is mixed" in why("nvidia.com/mig-1g.10gb.count", labels, inventory, config)
    off = parse_config({"version": "v1", "labeller": {"labels": {"nvidia": False}}}, RESOURCE_NAMES)
    assert "nvidia label groups are off" in why("nvidia.com/gpu.product", label_set_of(inventory, off), inventory, off)
    no_machine = parse_config({"version": "v1", "labeller": {"labels": {"machine": False}}}, RESOURCE_NAMES)
    assert why("nvidia.com/gpu.machine", label_set_of(inventory, no_machine), inventory,
               no_machine) == "the label group labeller.labels.machine is off"


def test_an_invalid_value_dropped_is_explained_with_its_source() -> None:
    inventory = nvidia(nvidia_gpu(0, name="NVIDIA " + "X" * 70))
    config = parse_config(None, RESOURCE_NAMES)
    labels = node_labels(inventory, config, derive(inventory, config, VENDORS), VENDORS)
    [item] = explain(["nvidia.com/gpu.product"], labels, inventory, config, VENDORS)
    assert item.value is None and item.why_not.startswith("computed but dropped, Kubernetes would reject it")
    assert item.provenance is not None and "nvmlDeviceGetName" in item.provenance.source


def test_cli_text_json_and_an_unknown_key_with_the_closest() -> None:
    result = in_process("explain", "--simulate", "dgx-h100", "--format", "json", "nvidia.com/gpu.product")
    assert result.returncode == 0, result.stderr
    [doc] = json.loads(result.stdout)
    assert doc["value"] == "NVIDIA-H100-80GB-HBM3" and doc["backend"] == "nvml" and doc["upstream"].startswith("GFD")
    result = in_process("explain", "--simulate", "dgx-h100", "nvidia.com/gpu.prodcut")
    assert result.returncode == 1
    assert result.stdout == ("nvidia.com/gpu.prodcut: unknown: not a gpu-labeller key; did you mean "
                             "nvidia.com/gpu.product?\n")
    every = in_process("explain", "--simulate", "t4-time-slicing")
    labels = in_process("labels", "--simulate", "t4-time-slicing")
    assert [line for line in every.stdout.splitlines() if not line.startswith(" ")] == labels.stdout.splitlines()


def test_cli_bad_input_is_one_line_and_exit_2() -> None:
    result = in_process("explain", "--simulate", "no-such-profile")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1


def test_state_labels_are_explained_with_named_configs_and_why_not_without(tmp_path: Path) -> None:
    from tests.builders import config_map_volume

    configs = config_map_volume(tmp_path / "configs", {"default": "version: v1\n", "ts": "version: v1\n"})
    result = in_process("explain", "--simulate", "t4-time-slicing", "--config-dir", str(configs), "--config-name",
                          "ts", "--format", "json", "nvidia.com/device-plugin.config.applied")
    assert result.returncode == 0, result.stderr
    [doc] = json.loads(result.stdout)
    assert (doc["value"], doc["backend"]) == ("ts", "config") and "'ts' is in force" in doc["source"]
    without = in_process("explain", "--simulate", "t4-time-slicing", "nvidia.com/device-plugin.config.state")
    assert without.returncode == 0
    assert "not produced: written only when configs come from --config-dir" in without.stdout


def test_a_labeler_without_sources_still_gets_provenance_from_itself() -> None:
    from labeller.model.labels import merge

    def extra_labels(inventory: Inventory, config: Config, offer: object) -> dict[str, str]:
        """example.com/extra: what a new rule writes before it names its sources."""
        return {"example.com/extra": "1"}

    defaults = parse_config(None, RESOURCE_NAMES)
    label_set = merge([extra_labels], Inventory(), defaults, derive(Inventory(), defaults, VENDORS))
    assert label_set.labels == {"example.com/extra": "1"} and type(label_set.labels["example.com/extra"]) is str
    source = label_set.sources["example.com/extra"]
    assert source.labeler.endswith("extra_labels") and source.backend == "rules"
    assert source.source == "example.com/extra: what a new rule writes before it names its sources."
