"""Helpers shared by the integration tests: direct clients to each master."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease
from asyncredlock._gate import Waiter
from asyncredlock._wakeup import Ticket
from asyncredlock.testing import ServerGroup


class Masters:
    """Plain redis clients to each server, to look at and tamper with keys directly."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self.clients = [Redis.from_url(url) for url in self.urls]

    async def keys(self) -> list[list[bytes]]:
        """Every key on each master but the fence counters.

        Fence counters (``{name}:fence``) stay by design: a resource's tokens must
        keep increasing after its lock is released. Every other key (a lock key,
        an undo marker) left behind is a leak.
        """
        return [
            sorted(key for key in await client.keys("*") if not key.endswith(b":fence"))
            for client in self.clients
        ]

    async def fences(self, name: str) -> list[int | None]:
        """The fence counter of the resource ``name`` on each master."""
        values = [await client.get(f"{{{name}}}:fence") for client in self.clients]
        return [None if value is None else int(value) for value in values]

    async def skew_fences(self, name: str) -> None:
        """Make the fence counters of ``name`` differ on every master (each one
        more than the last, all above any count so far): no quorum of them can then
        return the same count, and a fenced acquisition must run its commit round."""
        top = max((count for count in await self.fences(name) if count is not None), default=0)
        for i, client in enumerate(self.clients):
            await client.set(f"{{{name}}}:fence", top + 1 + i)

    async def holding(self, key: str) -> int:
        """On how many masters ``key`` exists."""
        return sum([await client.exists(key) for client in self.clients])

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


@pytest.fixture
async def masters(servers: ServerGroup) -> AsyncIterator[Masters]:
    """Direct clients to the flushed session group of 5 servers."""
    direct = Masters(servers.urls)
    yield direct
    await direct.aclose()


class Queue:
    """Counts the acquisitions of one redlock that queued behind another task of
    it (for the same key), and lets a test wait for a count."""

    def __init__(self, redlock: AsyncRedlock, monkeypatch: pytest.MonkeyPatch) -> None:
        gates = redlock._core.gates
        original = gates.wait
        self.queued = 0
        self._changed = anyio.Event()

        async def wait(key: str, waiter: Waiter, patience: float) -> Lease | None:
            self.queued += 1
            changed, self._changed = self._changed, anyio.Event()
            changed.set()
            return await original(key, waiter, patience)

        monkeypatch.setattr(gates, "wait", wait)

    async def reach(self, count: int) -> None:
        """Return once ``count`` acquisitions have queued."""
        while self.queued < count:
            await self._changed.wait()


class Waiting:
    """Counts the waits of acquisitions that failed an attempt and listen for a
    release (a fair or read-write waiter is queued on the masters by then: its
    attempts came before) over several redlocks, and lets a test wait for a count."""

    def __init__(self, redlocks: list[AsyncRedlock], monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = 0
        self.woken = 0  # waits ended by a wake-up, not by their delay
        self._changed = anyio.Event()
        for redlock in redlocks:
            waker = redlock._core.waker
            original: Callable[[Ticket, float], Any] = waker.wait

            async def wait(ticket: Ticket, delay: float, _original: Any = original) -> bool:
                self.entered += 1
                changed, self._changed = self._changed, anyio.Event()
                changed.set()
                woken: bool = await _original(ticket, delay)
                self.woken += woken
                return woken

            monkeypatch.setattr(waker, "wait", wait)

    async def reach(self, count: int) -> None:
        while self.entered < count:
            await self._changed.wait()
