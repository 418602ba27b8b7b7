"""AMD's opaque device config (``gpu.resource.amd.com/v1alpha1``, AMD k8s-gpu-dra-driver's
``api/amd.com/resource/gpu/v1alpha1``): ``GpuConfig``, which has no field ("No configs are supported
yet") and applies to every device of the driver. Decoded as strictly as AMD's decoder (strict JSON:
an unknown field, apiVersion or kind is refused); applying it changes nothing, and says so in the
claim's checkpoint record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from labeller.model.resourceslices import DraDevice
from labeller.model.vendor.dra import Applied, ConfigApi, ConfigSettings, DeviceConfig, Share, fields, shown, type_meta

API_VERSION = "gpu.resource.amd.com/v1alpha1"
GPU_CONFIG = "GpuConfig"


def decode(parameters: Mapping[str, Any]) -> DeviceConfig:
    kind = type_meta(parameters, API_VERSION, (GPU_CONFIG,))
    fields(parameters, "", ("apiVersion", "kind"))
    return DeviceConfig(kind)


def fits(config: DeviceConfig, device: DraDevice) -> str | None:
    return None  # AMD's driver applies a GpuConfig to whole GPUs and partitions alike


class AmdConfigs:
    """The ``ConfigHandler`` of ``gpu.amd.com``: a ``GpuConfig`` has nothing to apply."""

    def __init__(self, settings: ConfigSettings) -> None:
        self.settings = settings

    def apply(self, claim_uid: str, config: DeviceConfig, devices: Sequence[DraDevice],
              shares: Mapping[str, Share] | None = None) -> Applied:
        return Applied({"kind": config.kind})

    def blocked(self, claim_uid: str, devices: Sequence[DraDevice]) -> str | None:
        return None

    def undo(self, claim_uid: str, applied: Applied) -> None:
        return None

    def recover(self, claim_uid: str, applied: Applied) -> None:
        return None

    def forget(self, claim_uid: str) -> None:
        return None


def read_applied(record: Mapping[str, Any], claim_uid: str) -> Applied:
    if dict(record) != {"kind": GPU_CONFIG}:
        raise ValueError(f"{shown(dict(record))} is not an AMD config this plugin applies")
    return Applied({"kind": GPU_CONFIG})


API = ConfigApi(api_version=API_VERSION, kinds=(GPU_CONFIG,), decode=decode, fits=fits, handler=AmdConfigs,
                read_applied=read_applied)
