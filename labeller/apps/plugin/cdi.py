"""CDI spec files for what the plugin serves, when a CDI ``deviceListStrategy`` (cdi-annotations,
cdi-cri) names devices in Allocate: one file per vendor, ``<dir>/gpu-labeller-<vendor>.json``
(``--cdi-spec-dir``, /var/run/cdi by default), built by the vendor (``PluginParts.cdi_spec``).

Each file is replaced atomically (a dot-file in the same directory, then a rename: container
runtimes read only ``*.json``/``*.yaml``), and only when its content changes. A vendor that serves
nothing any more, or a config without a CDI strategy, has its file removed; no other file in the
directory is ever touched. Files stay when the plugin stops: a container that restarts resolves its
CDI devices again. Nothing found in the directory is trusted (``labeller.base.ownfiles``, as the DRA
plugin's): the directory itself is never a symlink, a symlink or anything but a regular file at a
spec's name is left alone (logged, the spec not written) and never followed, and temporary files a
killed plugin left (``.gpu-labeller-<vendor>.json.*.tmp``) are removed at start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from labeller.base import ownfiles
from labeller.model.config import Config
from labeller.model.offer import PhysicalDevice, Resource
from labeller.model.vendor import Vendor
from labeller.model.vendor.plugin import CDI_STRATEGIES
from labeller.base.log import get_logger

log = get_logger(__name__)

DEFAULT_SPEC_DIR = Path("/var/run/cdi")
FILE_PREFIX = "gpu-labeller-"
WRITE_FAILED = "cannot write the CDI spec; containers asking for these devices will not start"


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
        self._stale = re.compile("|".join(rf"\.{re.escape(spec_file(directory, v.name).name)}\..+\.tmp"
                                          for v in self._vendors) or "(?!)")
        self._swept = False
        self._told: dict[str, str] = {}  # what / vendor -> the problem last logged (each is logged once)

    def update(self, resources: Sequence[Resource], config: Config, host_root: Path) -> None:
        wanted = specs(resources, config, host_root, self._vendors)
        try:
            # made only when a spec is to be written: with none, a missing directory holds nothing to remove
            with ownfiles.own_directory(self.directory, create=bool(wanted)) as fd:
                self._sweep(fd)
                for vendor in self._vendors:
                    self._update(fd, vendor.name, wanted.get(vendor.name))
            self._told.pop("", None)
        except FileNotFoundError:
            if wanted:
                self._failed("", WRITE_FAILED, "the directory is missing")
        except OSError as exc:
            self._failed("", WRITE_FAILED, str(exc.strerror or exc))

    def _sweep(self, fd: int) -> None:
        """Once: the temporary files a killed plugin left."""
        if not self._swept:
            stale = ownfiles.remove_stale(fd, self._stale)
            self._swept = True
            if stale:
                log.info("temporary CDI spec files of a killed plugin removed", path=str(self.directory),
                         files=sorted(stale))

    def _update(self, fd: int, vendor: str, text: str | None) -> None:
        path = spec_file(self.directory, vendor)
        try:
            if text is not None:
                if self._written.get(vendor) != text or not ownfiles.is_regular(fd, path.name):
                    ownfiles.replace(fd, path.name, text.encode())
                    self._written[vendor] = text
                    log.info("CDI spec written", vendor=vendor, path=str(path))
            elif ownfiles.remove(fd, path.name):
                self._written.pop(vendor, None)
                log.info("CDI spec removed: nothing of this vendor is named by CDI now", vendor=vendor, path=str(path))
            self._told.pop(vendor, None)
        except OSError as exc:
            self._failed(vendor, WRITE_FAILED if text is not None else "cannot remove the CDI spec",
                         str(exc.strerror or exc))

    def _failed(self, vendor: str, message: str, reason: str) -> None:
        """Log the problem, once while it lasts."""
        if self._told.get(vendor) != reason:
            self._told[vendor] = reason
            log.error(message, vendor=vendor or None, path=str(self.directory), reason=reason)
