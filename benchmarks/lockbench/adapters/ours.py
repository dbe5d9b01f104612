"""asyncredlock, as the benchmarks run it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncredlock import AsyncRedlock

from ..harness import redlock_counters
from ..settings import TTL, WAIT
from .base import Handle, Mode, defaults


class AsyncredlockSession:
    """asyncredlock with its defaults (auto-extension on), fenced (the default) or not,
    fair (waiters served in arrival order through the masters' queue) or not, with
    its default busy poll or another (0: none)."""

    def __init__(
        self,
        urls: Sequence[str],
        mode: Mode,
        *,
        fencing: bool,
        fair: bool = False,
        busy_poll: float | None = None,
    ) -> None:
        self._given: dict[str, Any] = {"ttl": TTL, "timeout": WAIT, "fencing": fencing}
        if busy_poll is not None:
            self._given["busy_poll"] = busy_poll
        self._redlock = AsyncRedlock(list(urls), **self._given)
        self._fair = fair

    def handle(self, key: str) -> Handle:
        return AsyncredlockHandle(self._redlock, key, fair=self._fair)

    def settings(self) -> dict[str, Any]:
        constructor = defaults(AsyncRedlock.__init__, **self._given)
        constructor.pop("clock", None)
        # sends nothing
        lock = self._redlock.lock("peers:settings", ttl=TTL, timeout=WAIT, fair=self._fair)
        return {
            "AsyncRedlock": constructor,
            "lock": {
                "ttl": lock.ttl,
                "timeout": lock.timeout,
                "auto_extend": lock.auto_extend,
                "fencing": lock.fencing,
                "fair": lock.fair,
            },
        }

    def statistics(self) -> dict[str, Any]:
        """``AsyncRedlock.statistics()``: its counters so far (hand-offs among them)."""
        return redlock_counters(self._redlock)

    async def aclose(self) -> None:
        await self._redlock.aclose()


class AsyncredlockHandle:
    """``redlock.lock(key, ttl=TTL, timeout=WAIT, fair=...).acquire()`` (auto-extension
    and fencing as the session's defaults) then ``lease.release()``."""

    def __init__(self, redlock: AsyncRedlock, key: str, *, fair: bool = False) -> None:
        self._redlock, self._key, self._fair = redlock, key, fair
        self._lease: Any = None

    async def acquire(self) -> None:
        lock = self._redlock.lock(self._key, ttl=TTL, timeout=WAIT, fair=self._fair)
        self._lease = await lock.acquire()

    async def release(self) -> None:
        lease, self._lease = self._lease, None
        await lease.release()
