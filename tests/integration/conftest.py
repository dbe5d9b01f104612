"""Helpers shared by the integration tests: direct clients to each master."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest
from redis.asyncio import Redis

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
