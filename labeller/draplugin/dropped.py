"""Which fields of what was written the API server did not keep: a field of a feature its gate keeps
off (Kubernetes drops such fields on write, and answers with what it kept, without an error).

``dropped_fields(written, kept)`` compares a spec as sent with the spec the server answered: the
paths (``spec.sharedCounters``, ``spec.devices[].consumesCounters``) of every field sent with a value
that the answer lacks. List entries are compared by position (the server keeps their order), maps
key by key. Empty, false and null values count as not sent, as the API leaves them out.
"""

from __future__ import annotations

from typing import Any


def _sent(value: Any) -> bool:
    return value not in (None, False, {}, [], "")


def dropped_fields(written: Any, kept: Any, path: str = "spec") -> frozenset[str]:
    """The paths of the fields ``written`` holds that ``kept`` does not."""
    if isinstance(written, dict) and isinstance(kept, dict):
        out: set[str] = set()
        for key, value in written.items():
            if not _sent(value):
                continue
            if key not in kept or not _sent(kept[key]):
                out.add(f"{path}.{key}")
            else:
                out |= dropped_fields(value, kept[key], f"{path}.{key}")
        return frozenset(out)
    if isinstance(written, list) and isinstance(kept, list) and len(written) == len(kept):
        return frozenset().union(*(dropped_fields(w, k, f"{path}[]") for w, k in zip(written, kept)))
    return frozenset()
