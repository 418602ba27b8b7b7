"""A claim's opaque configs for one driver: collected in Kubernetes' order, decoded by the vendor's
config API (``labeller.model.vendor.dra.ConfigApi``), and matched to the devices allocated.

``status.allocation.devices.config`` holds what the scheduler copied from the DeviceClasses and the
claim: each entry with its ``source`` (``FromClass`` or ``FromClaim``), the ``requests`` it applies to
(none: every request; a request's name: that request and all its ``firstAvailable`` subrequests;
``<request>/<subrequest>``: that one) and an ``opaque`` config for one driver. It is read as
NVIDIA's and AMD's drivers read it: the class's configs first, then the claim's, each in its list's
order, a later one overriding an earlier one. Each allocated device gets the last config that
matches its request and may apply to it (``ConfigApi.fits``); a config that names the request but
cannot apply to the device (a ``GpuConfig`` for a MIG device) fails the claim, one for every request
is passed over for it. Configs for other drivers are theirs: skipped. Every config of this driver is
decoded, whether or not a device gets it; an entry without ``opaque``, a source that is neither,
parameters over the API's 10 KiB or not an object, and whatever the vendor's decoder refuses fail
the claim, with one line naming the entry, the key and the value. Nothing is ever ignored.

A claim without a config for the driver costs one look at an empty list (the fast path).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labeller.model.resourceslices import DraDevice
from labeller.model.vendor.dra import (Applied, ConfigApi, ConfigHandler, ConfigRefused, ConfigSettings, DeviceConfig,
                                       shown)

PARAMETERS_LIMIT = 10 * 1024  # bytes: the API's OpaqueParametersMaxLength
SOURCES = {"FromClass": "the class", "FromClaim": "the claim"}

Obj = dict[str, Any]


@dataclass(frozen=True)
class ClaimConfig:
    """One decoded config of the claim for this driver."""

    where: str  # for messages: "config[1] (from the claim, requests ts-gpu)"
    requests: tuple[str, ...]
    config: DeviceConfig


@dataclass(frozen=True)
class Group:
    """The devices (by name, in allocation order) one config applies to."""

    config: ClaimConfig
    devices: tuple[str, ...]


def matches(requests: Sequence[str], request: str) -> bool:
    """Whether a config for ``requests`` applies to a device allocated for ``request`` (Kubernetes' rule)."""
    return not requests or request in requests or request.split("/", 1)[0] in requests


class DriverConfigs:
    """One driver's configs: its vendor's API, loaded on the first claim that has a config (or a
    checkpoint record that applied one), and its ``ConfigHandler``."""

    def __init__(self, driver: str, load: Callable[[], ConfigApi] | None, settings: ConfigSettings) -> None:
        self.driver, self._load, self.settings = driver, load, settings
        self._lock = threading.Lock()
        self._api: ConfigApi | None = None
        self._handler: ConfigHandler | None = None

    @property
    def api(self) -> ConfigApi:
        """ConfigRefused when the vendor has none."""
        with self._lock:
            if self._api is None:
                if self._load is None:
                    raise ConfigRefused(f"the {self.driver} driver takes no opaque config")
                self._api = self._load()
            return self._api

    @property
    def handler(self) -> ConfigHandler:
        api = self.api
        with self._lock:
            if self._handler is None:
                self._handler = api.handler(self.settings)
            return self._handler

    def blocked(self, claim_uid: str, devices: Sequence[DraDevice]) -> str | None:
        """See ``ConfigHandler.blocked``; None while no config was ever applied (no handler yet)."""
        with self._lock:
            handler = self._handler
        return handler.blocked(claim_uid, devices) if handler is not None and devices else None

    def forget(self, claim_uid: str) -> None:
        """See ``ConfigHandler.forget``; nothing for a vendor without configs."""
        if self._load is not None:
            self.handler.forget(claim_uid)

    def read_applied(self, record: Mapping[str, Any], claim_uid: str) -> Applied:
        """A checkpoint record's applied config; ValueError when it is not one."""
        try:
            api = self.api
        except ConfigRefused as exc:
            raise ValueError(str(exc)) from None
        return api.read_applied(record, claim_uid)

    def groups(self, allocation: Obj, results: Sequence[Obj], devices: Mapping[str, DraDevice]) -> list[Group]:
        """Which of ``results`` (this driver's, their devices in ``devices``) get which config; ConfigRefused
        (the message names the entry) when a config cannot be honoured."""
        entries = (allocation.get("devices") or {}).get("config")
        if not entries:
            return []
        configs = self._decoded(entries)
        if not configs:
            return []
        chosen: dict[int, list[str]] = {}
        for result in results:
            request, name = str(result.get("request", "")), str(result.get("device", ""))
            index = self._choose(configs, request, devices[name])
            if index is not None and name not in chosen.setdefault(index, []):
                chosen[index].append(name)
        return [Group(configs[index], tuple(names)) for index, names in sorted(chosen.items())]

    def _choose(self, configs: Sequence[ClaimConfig], request: str, device: DraDevice) -> int | None:
        for index in reversed(range(len(configs))):
            config = configs[index]
            if not matches(config.requests, request):
                continue
            kind = self.api.fits(config.config, device)
            if kind is None:
                return index
            if config.requests:
                raise ConfigRefused(f"{config.where}: kind {config.config.kind} cannot apply to device {device.name} "
                                    f"of type {kind} (request {request})")
        return None

    def _decoded(self, entries: Any) -> list[ClaimConfig]:
        """This driver's configs, class first then claim; ConfigRefused naming the first bad entry."""
        if not isinstance(entries, list):
            raise ConfigRefused(f"status.allocation.devices.config: {shown(entries)} is not a list")
        ordered: dict[str, list[tuple[int, Obj]]] = {source: [] for source in SOURCES}
        for index, entry in enumerate(entries):
            source = entry.get("source") if isinstance(entry, dict) else None
            if source not in SOURCES:
                raise ConfigRefused(f"config[{index}]: source {shown(source)} is not FromClass or FromClaim")
            ordered[source].append((index, entry))
        decoded = []
        for source, found in ordered.items():
            for index, entry in found:
                config = self._one(index, SOURCES[source], entry)
                if config is not None:
                    decoded.append(config)
        return decoded

    def _one(self, index: int, source: str, entry: Obj) -> ClaimConfig | None:
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ConfigRefused(f"config[{index}]: requests {shown(requests)} is not a list of request names")
        where = f"config[{index}] (from {source}" + (f", requests {', '.join(requests)})" if requests else ")")
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict):
            raise ConfigRefused(f"{where}: only opaque configs are supported, not {shown(entry, 80)}")
        if opaque.get("driver") != self.driver:
            return None  # another driver's
        parameters = opaque.get("parameters")
        try:
            size = len(json.dumps(parameters, separators=(",", ":"), ensure_ascii=False).encode())
        except (RecursionError, TypeError, ValueError):
            raise ConfigRefused(f"{where}: opaque.parameters: nested too deeply to be a config") from None
        if size > PARAMETERS_LIMIT:
            raise ConfigRefused(f"{where}: opaque.parameters: {size} bytes, more than the API's {PARAMETERS_LIMIT}")
        if not isinstance(parameters, dict):
            raise ConfigRefused(f"{where}: opaque.parameters: {shown(parameters)} is not an object")
        try:
            return ClaimConfig(where, tuple(requests), self.api.decode(parameters))
        except ConfigRefused as exc:
            raise ConfigRefused(f"{where}: {exc}") from None
