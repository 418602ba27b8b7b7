"""The machine's product name from DMI (what GFD calls the machine type)."""

from __future__ import annotations

from pathlib import Path

from vendors.sysfs import read_text

PRODUCT_NAME = "sys/class/dmi/id/product_name"


def read_machine(host_root: Path) -> str | None:
    """The product name; "" when the file is empty, None when it does not exist. ``Untrusted``
    (vendors.sysfs) when it exists but cannot be believed."""
    return read_text(host_root / PRODUCT_NAME)
