"""python-redis-lock (synchronous, one server, in threads)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib
import importlib.metadata
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..settings import POOL, TTL, WAIT
from .base import Handle, Mode, NotAcquiredError, defaults, redis_client_settings

T = TypeVar("T")


class PythonRedisLockSession:
    """python-redis-lock (synchronous) on one ``redis.Redis`` client, every call in a
    thread pool with one thread per worker.

    The client has no socket timeout (``socket_timeout=None``): a waiting acquire
    blocks in ``BLPOP`` for up to ``expire`` seconds, longer than redis-py's default
    5 s socket timeout, which would cut it off with an error.
    """

    def __init__(self, urls: Sequence[str], mode: Mode) -> None:
        import redis

        self._module = importlib.import_module("redis_lock")
        self._client = redis.Redis.from_url(urls[0], socket_timeout=None, max_connections=POOL)
        self._pool = concurrent.futures.ThreadPoolExecutor(mode.workers, "python-redis-lock")
        self._workers = mode.workers

    def handle(self, key: str) -> Handle:
        lock = self._module.Lock(self._client, key, expire=round(TTL))
        return PythonRedisLockHandle(lock, self._pool)

    def settings(self) -> dict[str, Any]:
        return {
            "Lock": defaults(self._module.Lock.__init__, expire=round(TTL)),
            "acquire": defaults(self._module.Lock.acquire, timeout=round(WAIT)),
            "client": f"redis.Redis.from_url(url, socket_timeout=None, max_connections={POOL})",
            "client_settings": redis_client_settings(self._client),
            "threads": self._workers,
        }

    async def aclose(self) -> None:
        self._client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class PythonRedisLockHandle:
    """``lock.acquire(timeout=WAIT)`` then ``lock.release()``, each in the pool."""

    def __init__(self, lock: Any, pool: concurrent.futures.Executor) -> None:
        self._lock, self._pool = lock, pool

    async def _call(self, func: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, func)

    async def acquire(self) -> None:
        acquire = functools.partial(self._lock.acquire, True, round(WAIT))
        if not await self._call(acquire):
            raise NotAcquiredError("Lock.acquire() returned False")

    async def release(self) -> None:
        await self._call(self._lock.release)
