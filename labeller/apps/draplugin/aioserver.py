"""gRPC servers that sleep while no call comes: grpc's asyncio server behind the synchronous calls a
``labeller.process.sockets.SocketServer`` makes.

grpc's synchronous server runs a thread per server that wakes every 200 ms to look for signals,
even when no call comes: the registration and DRA sockets of one driver cost about 0.1 % of a core
doing nothing. The asyncio server waits on its completion queue without a timeout and wakes its
event loop only when there is something to do. Every server here shares one event loop, on a
thread of its own; the handlers stay synchronous (the generated servicers), each server's calls
running on a thread pool of its own, as with the synchronous server.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the shared event loop (started on first use) and return its result."""
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="grpc-aio", daemon=True).start()
        loop = _loop
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


class AioServer:
    """One grpc.aio server, its services added by ``add``, its handlers run on ``workers`` threads
    named after ``name``. The part of ``grpc.Server`` a socket server uses."""

    def __init__(self, name: str, add: Callable[[Any], None], workers: int) -> None:
        async def make() -> Any:
            server = grpc.aio.server(migration_thread_pool=ThreadPoolExecutor(workers, thread_name_prefix=name))
            add(server)
            return server

        self._server = _run(make())

    def add_insecure_port(self, address: str) -> int:
        async def add() -> int:
            return int(self._server.add_insecure_port(address))

        return _run(add())

    def start(self) -> None:
        _run(self._server.start())

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving (calls under way get ``grace`` seconds; None: cancelled now); the event is set
        once stopped."""
        stopped = threading.Event()

        async def stop() -> None:
            try:
                await self._server.stop(grace)
            finally:
                stopped.set()

        assert _loop is not None  # a server exists, so the loop does
        asyncio.run_coroutine_threadsafe(stop(), _loop)
        return stopped
