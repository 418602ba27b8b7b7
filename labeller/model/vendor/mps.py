"""Sharing a vendor's GPUs by MPS (role 3, optional: NVIDIA's alone today).

``sharing.mps`` replicas are advertised only while ``check`` finds the vendor's MPS control daemon
serving exactly them (labeller.model.sharing); config parsing refuses any resource ``shareable`` does
not match, before a node is ever probed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import Resource

# (inventory, a resource with MPS replicas) -> why the vendor cannot serve it by MPS now, and whether
# that may change (True: its MPS control daemon is not ready yet), or None when it can.
MpsCheck = Callable[[Inventory, Resource], "tuple[str, bool] | None"]
# (config) -> a cheap fingerprint of what the offer reads besides the hardware probe (NVIDIA: the MPS
# control daemon's readiness file); the plugin and the labeller probe again when it changes.
OfferInputs = Callable[[Config], object]


@dataclass(frozen=True)
class Mps:
    shareable: re.Pattern[str]  # the resource names MPS can share
    shares: str  # the same, for people: "whole NVIDIA GPUs (nvidia.com/gpu)"
    check: MpsCheck
    offer_inputs: OfferInputs
