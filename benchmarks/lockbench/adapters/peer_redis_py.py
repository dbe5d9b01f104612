"""redis-py's own ``Lock`` (one server)."""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from ..settings import POOL, TTL, WAIT
from .base import Handle, Mode, NotAcquiredError, defaults, redis_client_settings


class RedisPySession:
    """redis-py's ``redis.asyncio.lock.Lock`` on one ``redis.asyncio`` client."""

    def __init__(self, urls: Sequence[str], mode: Mode) -> None:
        self._lock_class = importlib.import_module("redis.asyncio.lock").Lock
        self._client = Redis.from_url(urls[0], max_connections=POOL)

    def handle(self, key: str) -> Handle:
        lock = self._lock_class(self._client, key, timeout=TTL, blocking_timeout=WAIT)
        return RedisPyHandle(lock)

    def settings(self) -> dict[str, Any]:
        lock = defaults(self._lock_class.__init__, timeout=TTL, blocking_timeout=WAIT)
        return {
            "Lock": lock,
            "client": f"redis.asyncio.Redis.from_url(url, max_connections={POOL})",
            "client_settings": redis_client_settings(self._client),
        }

    async def aclose(self) -> None:
        await self._client.aclose()


class RedisPyHandle:
    """``await lock.acquire()`` (blocking, polling every ``sleep``) then ``release()``."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    async def acquire(self) -> None:
        if not await self._lock.acquire():
            raise NotAcquiredError("Lock.acquire() returned False")

    async def release(self) -> None:
        await self._lock.release()
