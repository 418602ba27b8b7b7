"""From inventory to the node's label set: presence and machine labels, then each vendor's rules.

Pure: no I/O. The order of labelers is the order of precedence documented in the README; a key
produced twice with different values is reported as a conflict by ``merge``.
"""

from __future__ import annotations

import time

from labeller import amd_labels, nvidia_labels
from labeller.config import Config
from labeller.inventory import AMD_VENDOR_ID, NVIDIA_VENDOR_ID, Inventory
from labeller.labels import Labeler, LabelSet, Labels, merge, validated

NVIDIA_PRESENT = "nvidia.com/gpu.present"
AMD_PRESENT = "amd.com/gpu.present"  # ours: AMD's labeller has no presence label to select on
TIMESTAMP = "nvidia.com/gfd.timestamp"

# GFD computes its timestamp once per process start, not per pass; so do we.
_PROCESS_START = int(time.time())


def nvidia_present(inventory: Inventory) -> bool:
    return bool(inventory.pci_gpus_of(NVIDIA_VENDOR_ID)) or bool(inventory.nvidia and inventory.nvidia.gpus)


def amd_present(inventory: Inventory) -> bool:
    return bool(inventory.pci_gpus_of(AMD_VENDOR_ID)) or bool(inventory.amd and inventory.amd.gpus)


def presence_labels(inventory: Inventory, config: Config) -> Labels:
    labels: Labels = {}
    if nvidia_present(inventory) and config.labels.nvidia:
        labels[NVIDIA_PRESENT] = "true"
    if amd_present(inventory) and (config.labels.amd or config.labels.amd_beta):
        labels[AMD_PRESENT] = "true"
    return labels


def timestamp_labels(inventory: Inventory, config: Config) -> Labels:
    if config.labels.timestamp and config.labels.nvidia and nvidia_present(inventory):
        return {TIMESTAMP: str(_PROCESS_START)}
    return {}


def labelers(config: Config) -> list[Labeler]:
    chosen: list[Labeler] = [presence_labels, timestamp_labels]
    if config.labels.nvidia:
        chosen.extend(nvidia_labels.LABELERS)
    chosen.extend(amd_labels.LABELERS)  # each AMD labeler honours the amd / amdBeta groups itself
    return chosen


def node_labels(inventory: Inventory, config: Config) -> LabelSet:
    """Every label gpu-labeller wants on this node, with invalid ones dropped one by one."""
    return validated(merge(labelers(config), inventory, config))
