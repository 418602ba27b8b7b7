"""What a long-running process frees goes back to the system (``labeller.process.memory``)."""

from __future__ import annotations

from pathlib import Path

from labeller.process.memory import release_free_memory


def _rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_the_pages_a_process_freed_go_back_to_the_system() -> None:
    """As after a probe: many objects over 512 bytes (the C allocator's, not CPython's own), most of
    them freed, a few kept here and there so that the heap cannot simply shrink from its top."""
    blocks = [bytes(2000) for _ in range(20_000)]  # about 40 MiB
    kept = blocks[::50]
    del blocks
    before = _rss_mib()
    assert release_free_memory()
    assert before - _rss_mib() > 20 and len(kept) == 400
