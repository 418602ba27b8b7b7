"""What the device plugin serves: ``Prober``, the ``device-plugin`` command's service on the
process loop (``labeller.process.loop``).

The loop probes at start, after every SIGHUP or named-config change, and when what else the offer
reads changes (NVIDIA's MPS readiness file: MPS replicas are advertised once their control daemon
is ready and withdrawn when it stops answering). Each probe's result goes to the plugin's
supervisor (``DevicePlugin.serve``). While the driver is not ready (``not_ready``: the probe failed
as a whole, a GPU backend is unavailable or failed, or there is nothing to serve) the loop probes
again on its own, with jittered backoff from 1 s doubling to 30 s, and the prober logs why at each
attempt. With ``flags.failOnInitError`` a first probe that finds the driver not ready ends the
process with exit code 1 instead (a crash loop, as NVIDIA's plugin does).

A vendor whose backend fails on a later probe keeps what it served (``carried_forward``): a driver
that stops answering for a while (an upgrade, a reset) must not take its devices off the Node; the
health checks say whether they still work. A probe that fails as a whole (``ProbeError``) changes
nothing.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

from labeller.model.config import ConfigError
from labeller.model.inventory import Inventory, ProbeError
from labeller.host.machine import Host
from labeller.model.offer import Resource
from labeller.apps.plugin.app import DevicePlugin
from labeller.process.loop import Exit
from labeller.model.vendor import Vendor
from vendors import VENDORS
from labeller.base.log import get_logger

log = get_logger(__name__)


def failed_vendors(inventory: Inventory, vendors: Sequence[Vendor] = VENDORS) -> set[str]:
    """Vendors whose backend could not describe their GPUs this time (NVML missing, no KFD topology)."""
    names = {vendor.name for vendor in vendors}
    return {r.backend for r in inventory.reports if r.backend in names and r.status in ("unavailable", "error")}


def not_ready(inventory: Inventory, resources: Sequence[Resource], waiting: bool = False,
              dra_serves: bool = False) -> str | None:
    """Why the driver is not ready to serve (the probe reports' own words), or None when it is.
    ``waiting``: resources wait for a helper (the MPS control daemon), which is not the driver's
    fault; the inputs watcher probes again when it is ready. ``dra_serves``: the config serves a
    vendor through DRA (``labeller.dra.vendors``), so serving nothing here is the config's doing."""
    troubles = [f"{r.backend}: {r.detail}" for r in inventory.reports if r.status in ("unavailable", "error")]
    if troubles:
        return "; ".join(troubles)
    if resources or waiting or dra_serves:
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

    def __init__(self, node: Host, plugin: DevicePlugin) -> None:
        self.node, self.plugin = node, plugin
        self.served: list[Resource] = []
        self._first = True

    @property
    def ready(self) -> bool:
        return self.plugin.ready

    def begin(self, wake: Callable[[], None], stop: threading.Event) -> None:
        return None  # the supervisor follows the kubelet on its own thread

    def work(self, now: float) -> float:
        return math.inf

    def probe(self) -> str | None:
        """Probe once and serve what was found; why the driver is not ready, or None. Exit(1) when
        the first probe finds it not ready and flags.failOnInitError is true."""
        reason = self.probe_and_serve()
        first, self._first = self._first, False
        if reason is not None and first and self.node.config.plugin.fail_on_init_error:
            log.error("driver not ready and flags.failOnInitError is true; exiting", reason="driver-not-ready",
                      detail=reason)
            raise Exit(1)
        return reason

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        log.warning("driver not ready; probing again", reason="driver-not-ready", detail=reason,
                    attempt=attempt, retry_in_s=round(delay_s, 2))

    def recovered(self, attempts: int, waited_s: float) -> None:
        log.info("driver ready; serving", reason="driver-ready", attempts=attempts, waited_s=round(waited_s, 1))

    def probe_and_serve(self) -> str | None:
        """Probe once and serve what was found; why the driver is not ready, or None."""
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
        return not_ready(inventory, fresh, waiting=any(h.waiting for h in offer.held),
                         dra_serves=bool(self.node.config.dra_vendors))
