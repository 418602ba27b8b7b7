"""One error line per missing permission, then quiet until the request works again."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from labeller.base.log import get_logger

log = get_logger("gpu_labeller.cluster")


class Refusal(Protocol):
    """A 403 (the adapter's ``Forbidden``, or a sink's ``PermissionDenied``). RBAC refused ``verb``
    on ``resource`` to ``identity``; or, with ``identity`` None, something else refused (an
    admission policy): ``message`` says what."""

    @property
    def verb(self) -> str: ...

    @property
    def resource(self) -> str: ...

    @property
    def identity(self) -> str | None: ...

    @property
    def message(self) -> str: ...


class PermissionLog:
    """One error line per 403 (per missing permission, or per refusal of another kind), then quiet
    until the request works again (``granted``). Thread-safe: one log may serve several watches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reported: set[tuple[str, str, str]] = set()  # (verb, resource, the message when not RBAC)

    def report(self, refusal: Refusal, **context: Any) -> None:
        key = (refusal.verb, refusal.resource, "" if refusal.identity else refusal.message)
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        fields = {"reason": "forbidden", "verb": refusal.verb, "resource": refusal.resource,
                  "detail": refusal.message, **context}
        if refusal.identity is None:  # not RBAC: an admission policy, say; its message is the news
            log.error(f"the API server refused to {refusal.verb} {refusal.resource}", **fields)
            return
        log.error(f"permission missing: grant verb '{refusal.verb}' on resource '{refusal.resource}' to "
                  f"{refusal.identity}", **fields)

    def granted(self, *verbs: str, resource: str | None = None) -> None:
        """Requests with these verbs (on ``resource``; None: on any) worked: a later 403 on them is news again."""
        with self._lock:
            self._reported = {key for key in self._reported
                              if key[0] not in verbs or (resource is not None and key[1] != resource)}
