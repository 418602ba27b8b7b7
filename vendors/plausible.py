"""Physical bounds on what a backend may believe.

A value outside them (a negative count, a 17-bit PCI device id, 10 PiB of VRAM) says the probe is
reading something other than a real GPU: that GPU becomes a reported problem (so the inventory is
partial and nothing is removed), never a label. Each ceiling leaves a wide margin above the
largest real part, so that new hardware does not trip it; docs/operations.md lists them and why.
"""

from __future__ import annotations

TIB = 1 << 40

# Per GPU (or per KFD node). Largest today: AMD Instinct MI355X and NVIDIA B300, 288 GB each.
MAX_MEMORY_BYTES = 4 * TIB
# Per KFD node. Largest today: MI300X in SPX, 1216 SIMDs in 304 CUs.
MAX_SIMDS = 4096
MAX_CUS = 1024
# SIMDs per CU: 4 on GCN and CDNA, 2 on RDNA (KFD counts the dual-issue pair).
MAX_SIMD_PER_CU = 16
# PCI: device id 16 bits; location_id = bus << 8 | device << 3 | function, 16 bits; the kernel's
# PCI domain is 32 bits (Intel VMD domains start at 0x10000).
MAX_DEVICE_ID = 0xFFFF
MAX_LOCATION_ID = 0xFFFF
MAX_DOMAIN = 0xFFFFFFFF
# CUDA compute capability: the minor is one digit (sm_89, sm_120); the largest major today is 13.
MAX_COMPUTE_MAJOR = 30
MAX_COMPUTE_MINOR = 9


def outside(name: str, value: int, low: int, high: int) -> str | None:
    """"simd_count 99999 is outside 1..4096" when ``value`` is out of bounds, else None."""
    return None if low <= value <= high else f"{name} {value} is outside {low}..{high}"


def first_problem(*checks: str | None) -> str | None:
    return next((check for check in checks if check), None)
