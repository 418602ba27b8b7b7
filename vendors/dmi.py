"""The machine's product name from DMI (what GFD calls the machine type)."""

from __future__ import annotations

from pathlib import Path

from vendors.sysfs import read_text

PRODUCT_NAME = "sys/class/dmi/id/product_name"  # under the host root


def read_machine(host_root: Path, path: str = PRODUCT_NAME) -> str | None:
    """The product name from ``path`` under the host root (GFD's machineTypeFile: DMI's product name by
    default); "" when the file is empty, None when it does not exist. ``Untrusted`` (vendors.sysfs)
    when it exists but cannot be believed."""
    return read_text(host_root / path.lstrip("/"))
