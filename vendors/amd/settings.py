"""AMD's keys of the config file: its label groups and its device plugin's resource naming. Declared
once here (``labeller.model.configtable``), registered through ``Vendor.settings``; the code reads them as
``config.section(AmdSettings)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from labeller.model.config import Config
from labeller.model.configtable import BLOCK, Key, Section, setting
from labeller.model.upstream import DEVICE_PLUGIN, RUN_AND_LABELS, KeyFlag, go_names


@dataclass(frozen=True)
class AmdSettings:
    labels: bool = setting("labeller.labels.amd", True, "AMD's new-style labels (`amd.com/gpu.*`)")
    beta_labels: bool = setting("labeller.labels.amdBeta", True, "AMD's beta-style labels (`beta.amd.com/gpu.*`)")
    firmware_labels: bool = setting(
        "labeller.labels.firmware", False, "AMD's firmware labels (`beta.amd.com/gpu.firmware.*`), read from debugfs",
        flags=(KeyFlag("amd", go_names("firmware"), commands=RUN_AND_LABELS),))
    resource_naming: Literal["single", "mixed"] = setting(
        "labeller.amd.resourceNamingStrategy", "single", "AMD's plugin's `-resource_naming_strategy`: `mixed` "
        "advertises partitions as `amd.com/<compute>_<memory>`",
        flags=(KeyFlag("amd-plugin", go_names("resource_naming_strategy"), commands=(*DEVICE_PLUGIN, "resources")),))


SETTINGS = Section(AmdSettings, keys=(Key("labeller.amd", "AMD's device-plugin settings", BLOCK),))


def any_labels(config: Config) -> bool:
    """Whether any of AMD's label groups is on."""
    settings = config.section(AmdSettings)
    return settings.labels or settings.beta_labels
