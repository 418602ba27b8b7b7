"""Memory a long-running process freed, given back to the system once it settles.

CPython hands objects over 512 bytes to the C allocator, which keeps the pages they leave for
reuse: after start-up and a probe (the files read, the slices' JSON) a few MiB stay in the
process though nothing holds them (2.3 MiB of an idle DRA plugin's 61.8). ``release_free_memory``
asks glibc to give back every whole free page (``malloc_trim(0)``: a few milliseconds); the loop
does it once things have settled after a probe (``ProcessLoop``). A C library without it (musl)
keeps its pages.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Give the C allocator's free pages back to the system; whether it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
