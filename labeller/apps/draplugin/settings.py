"""What the ``dra-plugin`` command sets for the DRA plugin (``labeller.apps.draplugin.app``): its
directories, health timings and what claims' opaque configs need."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from labeller.apps.draplugin.taints import DEFAULT_HOLD_S
from labeller.process.health import POLL_SECONDS
from labeller.model.vendor.dra import ConfigSettings

DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_CDI_SPEC_DIR = Path("/var/run/cdi")
DEFAULT_MPS_ROOT = Path("/run/gpu-labeller/mps")


@dataclass
class DraSettings:
    node_name: str
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    cdi_spec_dir: Path = DEFAULT_CDI_SPEC_DIR
    recovery_seconds: float = 60.0
    gone_hold_seconds: float = DEFAULT_HOLD_S  # a device gone from the probe stays published tainted at least this long
    health_poll_seconds: float = POLL_SECONDS
    tick_seconds: float = 0.5  # how often the sockets are looked at where inotify cannot tell
    # the health switches the device plugin reads too (DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS)
    health_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # what claims' opaque configs need: the MPS daemons' root, NVIDIA's tools
    configs: ConfigSettings = field(default_factory=lambda: ConfigSettings(DEFAULT_MPS_ROOT))
