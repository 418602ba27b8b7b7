"""Build small sysfs trees laid out as the kernel lays them out (for PCI tests)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from vendors.sim_pci import write_device, write_host_bridge

T = TypeVar("T")


def add_pci_device(root: Path, bdf: str, vendor: int, device: int, class_code: int,
                   numa_node: int = -1, driver: str | None = None, revision: int = 0xA1) -> Path:
    return write_device(root, bdf, vendor, device, class_code, revision=revision, numa_node=numa_node, driver=driver)


def empty_node(root: Path) -> Path:
    """A genuine node without GPUs: its /sys lists a host bridge and nothing else."""
    write_host_bridge(root)
    return root


def promptly(call: Callable[[], T], seconds: float = 10.0) -> T:
    """``call()``, failing the test instead of hanging when it does not return within ``seconds``
    (a probe that opened a FIFO for reading would block forever). Its exception is re-raised here."""
    outcome: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no answer within {seconds} s: the probe hangs"
    if raised:
        raise raised[0]
    return outcome[0]
