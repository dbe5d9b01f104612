"""aioredlock (on aioredis 1.x pools)."""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from ..settings import AIOREDLOCK_WAIT_RETRIES, POOL, TTL
from .base import Handle, Mode, defaults


class AioredlockSession:
    """aioredlock's ``Aioredlock`` manager (aioredis 1.x pools)."""

    def __init__(self, urls: Sequence[str], mode: Mode) -> None:
        module = importlib.import_module("aioredlock")
        given = {"retry_count": AIOREDLOCK_WAIT_RETRIES} if mode.waiting else {}
        masters = [_host_port(url) | {"maxsize": POOL} for url in urls]
        self._manager = module.Aioredlock(masters, **given)
        self._given = given

    def handle(self, key: str) -> Handle:
        return AioredlockHandle(self._manager, key)

    def settings(self) -> dict[str, Any]:
        constructor = defaults(type(self._manager).__init__, **self._given)
        constructor.pop("redis_connections", None)
        return {
            "Aioredlock": constructor,
            "lock": {"lock_timeout": TTL},
            "pool": f"aioredis.create_redis_pool((host, port), minsize=1, maxsize={POOL}) "
            "(minsize is aioredlock's default; aioredis sets no socket timeout)",
        }

    async def aclose(self) -> None:
        await self._manager.destroy()


def _host_port(url: str) -> dict[str, Any]:
    """``{"host": ..., "port": ...}`` of a ``redis://host:port`` URL."""
    parts = urlsplit(url)
    return {"host": parts.hostname or "127.0.0.1", "port": parts.port or 6379}


class AioredlockHandle:
    """``manager.lock(key, lock_timeout=TTL)`` then ``manager.unlock(lock)``; a fixed
    ``lock_timeout`` turns its auto-extension off."""

    def __init__(self, manager: Any, key: str) -> None:
        self._manager, self._key = manager, key
        self._lock: Any = None

    async def acquire(self) -> None:
        self._lock = await self._manager.lock(self._key, lock_timeout=TTL)

    async def release(self) -> None:
        lock, self._lock = self._lock, None
        await self._manager.unlock(lock)
