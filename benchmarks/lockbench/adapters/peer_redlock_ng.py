"""redlock-ng."""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Sequence
from typing import Any

from ..settings import POOL, TTL
from .base import Handle, Mode, NotAcquiredError, defaults, redis_client_settings


class RedlockNgSession:
    """redlock-ng's ``AsyncRedlock``: non-blocking with 3 retries by default, blocking
    (no time limit) where a scenario needs to wait."""

    def __init__(self, urls: Sequence[str], mode: Mode) -> None:
        self._module = importlib.import_module("redlock")
        self._redlock = self._module.AsyncRedlock(list(urls))
        self._blocking = mode.waiting
        # It builds its clients itself, with no pool option: set the pool size after.
        for client in self._redlock.client.instances:
            client.connection_pool.max_connections = POOL

    def handle(self, key: str) -> Handle:
        return RedlockNgHandle(self._redlock, key, self._blocking)

    def settings(self) -> dict[str, Any]:
        config = self._redlock.client.config.model_dump()
        config.pop("masters", None)
        return {
            "AsyncRedlock": defaults(self._module.AsyncRedlock.__init__),
            "RedlockConfig": config,
            "acquire": {"ttl_ms": round(TTL * 1000), "blocking": self._blocking},
            "client": f"its own Redis.from_url(url, ...); pool max_connections set to {POOL}",
            "client_settings": redis_client_settings(self._redlock.client.instances[0]),
        }

    async def aclose(self) -> None:
        for client in self._redlock.client.instances:
            await client.aclose()


class RedlockNgHandle:
    """``await redlock.acquire(key, ttl_ms, blocking=...)`` then ``release(lock)``."""

    def __init__(self, redlock: Any, key: str, blocking: bool) -> None:
        self._redlock, self._key, self._blocking = redlock, key, blocking
        self._lock: Any = None

    async def acquire(self) -> None:
        lock = await self._redlock.acquire(self._key, round(TTL * 1000), blocking=self._blocking)
        if lock is None:
            raise NotAcquiredError("AsyncRedlock.acquire() returned None")
        self._lock = lock

    async def release(self) -> None:
        lock, self._lock = self._lock, None
        await self._redlock.release(lock)
