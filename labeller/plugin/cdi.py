"""CDI spec files for what the plugin serves, when a CDI ``deviceListStrategy`` (cdi-annotations,
cdi-cri) names devices in Allocate: one file per vendor, ``<dir>/gpu-labeller-<vendor>.json``
(``--cdi-spec-dir``, /var/run/cdi by default), built by the vendor (``PluginParts.cdi_spec``).

Each file is replaced atomically (a dot-file in the same directory, then a rename: container
runtimes read only ``*.json``/``*.yaml``), and only when its content changes. A vendor that serves
nothing any more, or a config without a CDI strategy, has its file removed; no other file in the
directory is ever touched. Files stay when the plugin stops: a container that restarts resolves its
CDI devices again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import structlog

from labeller.config import Config
from labeller.offer import PhysicalDevice, Resource
from labeller.outputs import write_atomic
from labeller.vendor import Vendor
from labeller.vendor.plugin import CDI_STRATEGIES

log = structlog.get_logger(__name__)

DEFAULT_SPEC_DIR = Path("/var/run/cdi")
FILE_PREFIX = "gpu-labeller-"


def spec_file(directory: Path, vendor: str) -> Path:
    return directory / f"{FILE_PREFIX}{vendor}.json"


def specs(resources: Sequence[Resource], config: Config, host_root: Path,
          vendors: Sequence[Vendor]) -> dict[str, str]:
    """Vendor name -> the text of its spec file, for the devices ``resources`` advertise."""
    if not set(CDI_STRATEGIES) & set(config.plugin.device_list_strategy):
        return {}
    out: dict[str, str] = {}
    for vendor in vendors:
        physical: dict[str, PhysicalDevice] = {}
        for resource in resources:
            if resource.vendor == vendor.name:
                physical.update((p.health_key, p) for p in resource.physical_devices)
        if not physical:
            continue
        spec = vendor.devices.plugin_parts().cdi_spec(list(physical.values()), config, host_root)
        if spec is not None:
            out[vendor.name] = json.dumps(spec, indent=2) + "\n"
    return out


class CdiSpecs:
    """Keeps ``<directory>/gpu-labeller-<vendor>.json`` equal to what is served."""

    def __init__(self, directory: Path, vendors: Sequence[Vendor]):
        self.directory, self._vendors = directory, list(vendors)
        self._written: dict[str, str] = {}

    def update(self, resources: Sequence[Resource], config: Config, host_root: Path) -> None:
        wanted = specs(resources, config, host_root, self._vendors)
        for vendor in self._vendors:
            path = spec_file(self.directory, vendor.name)
            text = wanted.get(vendor.name)
            try:
                if text is not None:
                    if self._written.get(vendor.name) != text or not path.exists():
                        write_atomic(path, text)
                        self._written[vendor.name] = text
                        log.info("CDI spec written", vendor=vendor.name, path=str(path))
                elif path.is_file() or path.is_symlink():
                    path.unlink()
                    self._written.pop(vendor.name, None)
                    log.info("CDI spec removed: nothing of this vendor is named by CDI now", vendor=vendor.name,
                             path=str(path))
            except OSError as exc:
                log.error("cannot write the CDI spec; containers asking for these devices will not start",
                          vendor=vendor.name, path=str(path), reason=exc.strerror or str(exc))
