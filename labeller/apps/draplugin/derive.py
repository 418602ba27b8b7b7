"""Each probe's DRA devices, as the DRA plugin derives them: the node's inventory and offer, then each
driver's devices (``Host.dra_devices``) under what its vendor must know (``DraState``): the devices the
driver made for claims (its ledger, ``labeller.apps.draplugin.ledger``: each one published as the device it
was made for) and whether the API server keeps counters (``DRAPartitionableDevices`` not found off,
``labeller.apps.draplugin.gates``: without it the vendors publish the partitions that exist).

The GPUs are read first, then the ledgers. A device undone in between (a claim unprepared meanwhile)
would be one the GPUs have and no ledger holds: someone else's to its vendor, its placements withdrawn
until the next probe. So both are read again while a ledger changed meanwhile (three times at most: a
node that busy is settled by the next probe).

The last probe's inventory and offer are kept: a gate found off since derives its devices again.
"""

from __future__ import annotations

from pathlib import Path

from labeller.apps.draplugin.gates import PARTITIONABLE_DEVICES, GateFallbacks
from labeller.apps.draplugin.ledger import Ledger
from labeller.host.machine import Host
from labeller.model.inventory import Inventory
from labeller.model.offer import Offer
from labeller.model.resourceslices import DraDevice
from labeller.model.vendor import Vendor
from labeller.model.vendor.dra import DraState
from labeller.base.log import get_logger

log = get_logger(__name__)

Found = dict[str, list[DraDevice]]  # each driver's devices


class Derivation:
    """See the module docstring; the plugin's loop thread alone probes (prepares read the ledgers)."""

    def __init__(self, host: Host, plugins_dir: Path, gates: GateFallbacks) -> None:
        self.host, self.plugins_dir, self.gates = host, plugins_dir, gates
        self._ledgers: dict[str, Ledger] = {}  # driver -> what it made for claims
        self._last: tuple[Inventory, Offer] | None = None

    def ledger(self, vendor: Vendor) -> Ledger | None:
        """The ledger of what ``vendor``'s driver made, where it makes devices at prepare; OSError when
        its directory cannot be kept."""
        if vendor.dra is None or vendor.dra.maker is None:
            return None
        driver = vendor.dra.driver
        if driver not in self._ledgers:
            self._ledgers[driver] = Ledger(self.plugins_dir, driver)
        return self._ledgers[driver]

    def probe(self) -> tuple[Inventory, Found]:
        """The node probed: its inventory and each driver's devices (ProbeError, ConfigError as the host's)."""
        inventory, states = self._read_node()
        offer = self.host.offer(inventory)
        found = self.host.dra_devices(inventory, offer, states=states)
        self._last = (inventory, offer)
        return inventory, found

    def again(self) -> tuple[Inventory, Found] | None:
        """The last probe's devices, derived again under the gates now off; None before the first probe."""
        if self._last is None:
            return None
        inventory, offer = self._last
        return inventory, self.host.dra_devices(inventory, offer, states=self._states())

    def _read_node(self) -> tuple[Inventory, dict[str, DraState]]:
        for _ in range(3):
            changes = self._changes()
            inventory = self.host.probe()
            states = self._states()
            if self._changes() == changes:
                break
        return inventory, states

    def _changes(self) -> int:
        """Changes to every driver's ledger so far (a ledger opened meanwhile adds none)."""
        return sum(ledger.changes for ledger in list(self._ledgers.values()))

    def _states(self) -> dict[str, DraState]:
        """What each driver made, and whether the API server keeps counters."""
        counters = PARTITIONABLE_DEVICES not in self.gates.off
        states = {}
        for vendor in self.host.vendors:
            if vendor.dra is None:
                continue
            try:
                ledger = self.ledger(vendor)
            except OSError as exc:  # made devices are then taken as someone else's: left alone
                log.error("cannot read what the driver made for claims", reason="bad-directory",
                          driver=vendor.dra.driver, error=str(exc.strerror or exc))
                ledger = None
            states[vendor.dra.driver] = DraState(ledger.names() if ledger is not None else frozenset(), counters)
        return states
