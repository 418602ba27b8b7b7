"""What the device plugin serves, and when it looks at the hardware again.

``Prober.run`` probes at start and after every SIGHUP and hands the result to the plugin's
supervisor (``DevicePlugin.serve``). While the driver is not ready (``not_ready``: the probe failed
as a whole, a GPU backend is unavailable or failed, or there is nothing to serve) it probes again
on its own, with jittered backoff from 1 s doubling to 30 s, and logs why at each attempt. With
``flags.failOnInitError`` a first probe that finds the driver not ready ends the process with exit
code 1 instead (a crash loop, as NVIDIA's plugin does).

Between probes it watches what else the offer reads (``Vendor.offer_inputs``: NVIDIA's MPS
readiness file) once a second, and probes again when that changes: MPS replicas are advertised
once their control daemon is ready and withdrawn when it stops answering.

A vendor whose backend fails on a later probe keeps what it served (``carried_forward``): a driver
that stops answering for a while (an upgrade, a reset) must not take its devices off the Node; the
health checks say whether they still work. A probe that fails as a whole (``ProbeError``) changes
nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from labeller import configwatch
from labeller.config import ConfigError
from labeller.node import Node
from labeller.inventory import Inventory, ProbeError
from labeller.plugin.app import DevicePlugin
from labeller.offer import Resource
from labeller.runtime import Backoff
from labeller.vendor import Vendor
from vendors import VENDORS

if TYPE_CHECKING:
    from labeller.configwatch import ConfigFollower

log = structlog.get_logger(__name__)

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0
SIGNAL_POLL_SECONDS = 0.2
INPUTS_POLL_SECONDS = 1.0


def failed_vendors(inventory: Inventory, vendors: Sequence[Vendor] = VENDORS) -> set[str]:
    """Vendors whose backend could not describe their GPUs this time (NVML missing, no KFD topology)."""
    names = {vendor.name for vendor in vendors}
    return {r.backend for r in inventory.reports if r.backend in names and r.status in ("unavailable", "error")}


def not_ready(inventory: Inventory, resources: Sequence[Resource], waiting: bool = False) -> str | None:
    """Why the driver is not ready to serve (the probe reports' own words), or None when it is.
    ``waiting``: resources wait for a helper (the MPS control daemon), which is not the driver's
    fault; the inputs watcher probes again when it is ready."""
    troubles = [f"{r.backend}: {r.detail}" for r in inventory.reports if r.status in ("unavailable", "error")]
    if troubles:
        return "; ".join(troubles)
    if resources or waiting:
        return None
    if inventory.pci_gpus:
        return f"{len(inventory.pci_gpus)} GPU(s) on the PCI bus but none the plugin can serve with this config"
    return "no GPU found"


def carried_forward(served: Sequence[Resource], fresh: Sequence[Resource], failed: set[str]) -> list[Resource]:
    """``fresh``, plus the resources served now of the vendors in ``failed`` that ``fresh`` lacks."""
    names = {r.name for r in fresh}
    return [*fresh, *(r for r in served if r.vendor in failed and r.name not in names)]


class Prober:
    """Probes the node and tells the plugin what to serve; see the module docstring."""

    def __init__(self, node: Node, plugin: DevicePlugin, config_path: Path | None,
                 backoff: Backoff | None = None, follower: ConfigFollower | None = None) -> None:
        self.node, self.plugin, self.config_path = node, plugin, config_path
        self.backoff = backoff or Backoff(FIRST_RETRY_SECONDS, MAX_RETRY_SECONDS)
        self.served: list[Resource] = []
        self._waiting_since: float | None = None
        self.follower = follower
        self.config_changed = threading.Event()  # the follower saw the node's named config change
        if follower is not None:
            follower.on_change = self.config_changed.set
        self._inputs: object = None
        self._inputs_checked = 0.0

    def run(self, stop: threading.Event, reload: threading.Event) -> int:
        """Probe and serve until ``stop`` is set; the process's exit code."""
        next_probe = 0.0
        first = True
        while not stop.is_set():
            if reload.is_set():
                reload.clear()
                if self._reload_config():
                    next_probe = 0.0
            if self.config_changed.is_set():
                self.config_changed.clear()
                if self._apply_named_config():
                    next_probe = 0.0
            if self._inputs_changed():
                next_probe = 0.0
            if time.monotonic() >= next_probe:
                reason = self.probe_and_serve()
                if reason is None:
                    next_probe = math.inf
                elif first and self.node.config.plugin.fail_on_init_error:
                    log.error("driver not ready and flags.failOnInitError is true; exiting", reason="driver-not-ready",
                              detail=reason)
                    return 1
                else:
                    next_probe = time.monotonic() + self._retry_later(reason)
                first = False
            # a config change wakes the loop at once; SIGHUP and SIGTERM are seen within SIGNAL_POLL_SECONDS
            waiter = self.config_changed if self.follower is not None else stop
            waiter.wait(max(0.0, min(SIGNAL_POLL_SECONDS, next_probe - time.monotonic())))
        return 0

    def offer_inputs(self) -> tuple[object, ...]:
        return tuple(vendor.offer_inputs(self.node.config) for vendor in self.node.vendors)

    def _inputs_changed(self) -> bool:
        """True (at most once a second) when what the offer reads besides the probe changed."""
        now = time.monotonic()
        if now - self._inputs_checked < INPUTS_POLL_SECONDS:
            return False
        self._inputs_checked = now
        return self.offer_inputs() != self._inputs

    def probe_and_serve(self) -> str | None:
        """Probe once and serve what was found; why the driver is not ready, or None."""
        self._inputs = self.offer_inputs()  # before the probe: a change during it is seen next time
        try:
            inventory = self.node.probe()
            offer = self.node.offer(inventory)
        except ProbeError as exc:
            return str(exc)
        except ConfigError as exc:  # the sharing config names devices this node lacks: nothing new is served
            log.error("the sharing config does not fit this node", reason="bad-config", error=str(exc))
            return f"config: {exc}"
        except Exception as exc:  # a bug in a probe must not end the plugin: it is retried like a late driver
            log.exception("probe failed", reason="probe-failed")
            return f"probe failed: {type(exc).__name__}: {exc}"
        for held in offer.held:
            log.info("resource not advertised", resource=held.resource.name, vendor=held.resource.vendor,
                     reason=held.reason, waiting=held.waiting)
        fresh = list(offer.resources)
        self.served = carried_forward(self.served, fresh, failed_vendors(inventory, self.node.vendors))
        self.plugin.serve(self.served, self.node.config, self.node.host_root, self.node.handles)
        reason = not_ready(inventory, fresh, waiting=any(h.waiting for h in offer.held))
        if reason is None:
            if self._waiting_since is not None:
                log.info("driver ready; serving", reason="driver-ready", attempts=self.backoff.attempts + 1,
                         waited_s=round(time.monotonic() - self._waiting_since, 1))
            self._waiting_since = None
            self.backoff.reset()
        return reason

    def _retry_later(self, reason: str) -> float:
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()
        delay = self.backoff.next()
        log.warning("driver not ready; probing again", reason="driver-not-ready", detail=reason,
                    attempt=self.backoff.attempts, retry_in_s=round(delay, 2))
        return delay

    def _reload_config(self) -> bool:
        """SIGHUP: read ``--config`` again, validate-then-swap (a profile's own config is re-read with
        the profile); False when it fails to load, and the old one stays."""
        log.info("SIGHUP: reloading the config and probing again", reason="sighup")
        return configwatch.reload(self.node, self.config_path, self.follower)

    def _apply_named_config(self) -> bool:
        """Put the follower's selection in force; True when the config changed (then probe and serve:
        names kept update their ListAndWatch streams, new names register, names gone stop)."""
        assert self.follower is not None
        return self.follower.apply(self.node)
