"""pottery's ``AIORedlock``."""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from ..settings import POOL, TTL, WAIT
from .base import Handle, Mode, NotAcquiredError, defaults, redis_client_settings


class PotterySession:
    """pottery's ``AIORedlock`` over ``redis.asyncio`` clients (one per master)."""

    def __init__(self, urls: Sequence[str], mode: Mode) -> None:
        self._class = importlib.import_module("pottery").AIORedlock
        self._masters = [Redis.from_url(url, max_connections=POOL) for url in urls]

    def handle(self, key: str) -> Handle:
        lock = self._class(key=key, masters=self._masters, auto_release_time=TTL)
        return PotteryHandle(lock)

    def settings(self) -> dict[str, Any]:
        return {
            "AIORedlock": defaults(self._class.__init__, auto_release_time=TTL),
            "acquire": defaults(self._class.acquire, timeout=WAIT),
            "retry_delay": f"uniform(0, {self._class._RETRY_DELAY}) s",
            "client": f"redis.asyncio.Redis.from_url(url, max_connections={POOL})",
            "client_settings": redis_client_settings(self._masters[0]),
        }

    async def aclose(self) -> None:
        for client in self._masters:
            await client.aclose()


class PotteryHandle:
    """``await lock.acquire(timeout=WAIT)`` (blocking, the default) then ``release()``."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    async def acquire(self) -> None:
        if not await self._lock.acquire(timeout=WAIT):
            raise NotAcquiredError("AIORedlock.acquire() returned False")

    async def release(self) -> None:
        await self._lock.release()
