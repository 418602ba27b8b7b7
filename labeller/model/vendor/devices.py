"""What a vendor offers (role 2, first half): its device groups and the facts of its resource names.

The dry run reads all of it (``resources``, the labels' counts); the parts only the device plugin
runs are behind ``plugin_parts`` (``labeller.model.vendor.plugin``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import DeviceGroup
from labeller.model.vendor.plugin import PluginParts

# The resources a vendor offers before sharing is applied (labeller.model.sharing applies it).
DeviceGroups = Callable[[Inventory, Config], list[DeviceGroup]]


@dataclass(frozen=True)
class Devices:
    groups: DeviceGroups
    domain: str  # "nvidia.com": its resource names' domain
    own_names: re.Pattern[str]  # every resource name it registers itself (a rename must not take one)
    memory_shared: str | None  # the base ``sharing.memory`` offers by memory (gpushare's); None: none
    health_source: str  # for people: what marks its devices Unhealthy
    # Imports its allocation, health and CDI modules when called: the device plugin's first use.
    plugin_parts: Callable[[], PluginParts]
