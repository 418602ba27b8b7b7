"""AMD device health: a compute node is there while its KFD topology node is.

AMD's plugin asks the AMD Device Metrics Exporter when it runs; without it, a partition whose KFD
node disappears (a reset, a repartition, a driver fault) is what the kernel shows, and what this
checker marks Unhealthy until it is back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from labeller.offer import PhysicalDevice
from labeller.vendor.plugin import Fault, HealthReporter
from vendors.amd.devices import AmdDevice
from vendors.amd.facts import KFD_TOPOLOGY_DIRS


class KfdChecker:
    """An AMD compute node is there while its KFD topology node directory is."""

    def __init__(self, host_root: Path, devices: Iterable[PhysicalDevice], board: HealthReporter):
        self._board = board
        self._nodes = {d.health_key: d.node.kfd_node for d in devices if isinstance(d, AmdDevice)}
        self._roots = [host_root / rel / "nodes" for rel in KFD_TOPOLOGY_DIRS]

    def _present(self, node: int) -> bool:
        return any((root / str(node) / "properties").exists() for root in self._roots)

    def start(self) -> bool:
        return True

    @property
    def watches_events(self) -> bool:
        return False

    def wait_for_event(self, timeout_ms: int) -> None:
        return None

    def stop(self) -> None:
        return None

    def poll(self) -> None:
        for key, node in self._nodes.items():
            if self._present(node):
                self._board.answering([key])
            else:
                self._board.mark_unhealthy([key], Fault(f"KFD node {node} disappeared", Fault.LOST))


def checker(devices: Sequence[PhysicalDevice], board: HealthReporter, host_root: Path, handle: Any,
            env: Mapping[str, str]) -> KfdChecker:
    return KfdChecker(host_root, devices, board)
