"""AMD device health: a compute node is there while its KFD topology node is.

AMD's plugin asks the AMD Device Metrics Exporter when it runs; without it, a partition whose KFD
node disappears (a reset, a repartition, a driver fault) is what the kernel shows, and what this
checker marks Unhealthy until it is back. sysfs tells no one (inotify does not see it), so each
poll reads the topology's ``generation_id``, which the driver bumps whenever a node comes or goes,
and lists the nodes (one directory read, whatever the number of partitions) only when it changed
or a device is Unhealthy (to see it come back).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from labeller.model.offer import PhysicalDevice
from labeller.model.vendor.plugin import Fault, HealthReporter
from vendors.amd.devices import AmdDevice
from vendors.amd.facts import KFD_TOPOLOGY_DIRS
from vendors.amd.generation import topology_generation


class KfdChecker:
    """An AMD compute node is there while its KFD topology node directory is."""

    def __init__(self, host_root: Path, devices: Iterable[PhysicalDevice], board: HealthReporter):
        self._board, self._host_root = board, host_root
        self._nodes = {d.health_key: str(d.node.kfd_node) for d in devices if isinstance(d, AmdDevice)}
        self._roots = [host_root / rel / "nodes" for rel in KFD_TOPOLOGY_DIRS]
        self._checked: object = None  # the topology's stamp when the nodes were last listed

    def _present(self) -> set[str]:
        """The topology's node directories (the first topology directory that can be listed)."""
        for root in self._roots:
            try:
                return set(os.listdir(root))
            except OSError:
                continue
        return set()

    def start(self) -> bool:
        return True

    @property
    def wants_events(self) -> bool:
        return False  # sysfs tells no one

    def watch(self) -> bool:
        return False

    @property
    def watches_events(self) -> bool:
        return False

    @property
    def polling(self) -> bool:
        return True  # sysfs tells no one

    def wait_for_event(self, timeout_ms: int) -> None:
        return None

    def stop(self) -> None:
        return None

    def poll(self) -> None:
        stamp = topology_generation(self._host_root)
        if stamp == self._checked and (self._board.all_healthy()
                                       or all(self._board.healthy(key) for key in self._nodes)):
            return
        self._checked = stamp
        present = self._present()
        there = [key for key, node in self._nodes.items() if node in present]
        if len(there) < len(self._nodes):
            for key, node in self._nodes.items():
                if node not in present:
                    self._board.mark_unhealthy([key], Fault(f"KFD node {node} disappeared", Fault.LOST))
        if there and not all(self._board.healthy(key) for key in there):
            self._board.answering(there)


def checker(devices: Sequence[PhysicalDevice], board: HealthReporter, host_root: Path, handle: Any,
            env: Mapping[str, str]) -> KfdChecker:
    return KfdChecker(host_root, devices, board)
